"""patch() on tiny random transformers (Llama, Qwen2, Qwen3) and diffusers (LTX-Video) models:
patched and unpatched outputs and gradients agree, the report lists the expected modules, and
unpatch restores the original forwards. These are the norm tests (``patch(model, activations=False,
rope=False)``); test_patch_activations.py covers the activation family and the default (all families),
test_patch_rope.py the rope family."""

from __future__ import annotations

import copy
import warnings

import pytest
import torch

import norm_ref as R

MODEL_CASES = [pytest.param("cpu", torch.float32, id="cpu-float32")] + [
    pytest.param("cuda", torch.bfloat16, id="cuda-bfloat16", marks=pytest.mark.cuda)
]
# Whole-model agreement, as ||a - b|| / ||b|| (elementwise tolerances are meaningless after several
# layers). float32 (CPU): patched (float64 reference kernels) vs original float32 eager, directly.
# bfloat16: patched and original both round at every norm, so neither is the truth; both are compared
# with a float32 run of the same weights, and the patched model must be about as accurate as the
# original (within 1.5x plus a floor of about one bf16 rounding, 2^-8 = 3.9e-3: on a small gradient
# such as Qwen3's q_norm.weight (128 elements) the two runs' errors are rounding noise; with a 2e-3
# floor the H100 run failed one such tensor at 2.14e-2 vs 1.27e-2), besides being close to it.
MODEL_TOL = {torch.float32: 1e-4, torch.bfloat16: 5e-2}
ACCURACY_SLACK, ACCURACY_FLOOR = 1.5, 5e-3


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.detach().double(), b.detach().double()
    assert a.isfinite().all() and b.isfinite().all()
    return ((a - b).norm() / b.norm().clamp_min(1e-30)).item()


def _cast(inputs: dict, dtype) -> dict:
    return {k: (v.to(dtype) if k != "_dy" and v.is_floating_point() else v) for k, v in inputs.items()}


def _check_pair(name, patched, original, truth, dtype):
    err = rel_err(patched, original)
    if truth is None:
        assert err < MODEL_TOL[dtype], f"{name}: patched vs original rel err {err:.2e}"
    else:
        # Some gradients are rounding noise in both runs: an attention key bias's true gradient is 0
        # in the columns RoPE does not rotate (softmax is invariant to a shift shared by all keys), so
        # the two bf16 runs differ by as much as each differs from the truth (Phi, partial rotary:
        # 7.3e-2 on the H100). By the triangle inequality err <= e_p + e_o; the accuracy test below is
        # the real one there.
        e_p, e_o = rel_err(patched, truth), rel_err(original, truth)
        bound = max(MODEL_TOL[dtype], 1.1 * (e_p + e_o))
        assert err < bound, (
            f"{name}: patched vs original rel err {err:.2e} (vs the float32 truth: {e_p:.2e}, {e_o:.2e})")
        assert e_p <= ACCURACY_SLACK * e_o + ACCURACY_FLOOR, (
            f"{name}: patched is less accurate than the original: {e_p:.2e} vs {e_o:.2e} (float32 truth)")


def _randomize_norms(model):
    """HF initializes norm weights to ones, which would hide a wrong weight multiply."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.copy_(R.rand(p.shape, p.dtype, p.device, scale=0.3, offset=1.0))
    return model


def _run(model, inputs, forward):
    model.zero_grad(set_to_none=True)
    out = forward(model, inputs)
    loss = (out.float() * inputs["_dy"]).sum()
    loss.backward()
    grads = {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}
    return out.detach(), grads


NORMS_ONLY = {"activations": False, "rope": False, "loss": False, "moe": False}


def check_model(kf, model, inputs, forward, expected_patched, dtype, patch_kwargs=NORMS_ONLY, attention=False):
    truth, truth_grads = None, {}
    if dtype != torch.float32:  # the same weights in float32, unpatched: the accuracy yardstick
        ref_model = copy.deepcopy(model).float()
        truth, truth_grads = _run(ref_model, _cast(inputs, torch.float32), forward)
        del ref_model
    out0, grads0 = _run(model, inputs, forward)
    report = kf.patch(model, **patch_kwargs, attention=attention)
    print(report)
    assert sorted(report.patched_paths) == sorted(expected_patched), str(report)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # one dtype everywhere: no runtime fallback may happen
        out1, grads1 = _run(model, inputs, forward)
    assert out1.dtype == out0.dtype and out1.shape == out0.shape
    _check_pair("output", out1, out0, truth, dtype)
    assert grads1.keys() == grads0.keys()
    for name in grads0:
        _check_pair(f"grad {name}", grads1[name], grads0[name], truth_grads.get(name), dtype)
    if any(p.op in ("kernelforge.rms_norm", "kernelforge.layer_norm") for p in report.patched):
        # norm weights received gradients through the kernel's backward
        assert any("norm" in n for n in grads1)

    assert kf.unpatch(model) == len(report.patched)
    for name, m in model.named_modules():
        assert "forward" not in m.__dict__, name
    out2, _ = _run(model, inputs, forward)
    assert torch.equal(out2, out0), "unpatched model must compute exactly what it did before"
    return report


# ---- transformers ------------------------------------------------------------------------------------


def _hf_model(arch: str, device, dtype):
    transformers = pytest.importorskip("transformers")
    common = dict(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                  attn_implementation="eager")
    if arch == "llama":
        model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**common))
    elif arch == "qwen2":
        model = transformers.Qwen2ForCausalLM(transformers.Qwen2Config(**common))
    elif arch == "qwen3":
        model = transformers.Qwen3ForCausalLM(transformers.Qwen3Config(head_dim=16, **common))
    else:
        raise ValueError(arch)
    return _randomize_norms(model.to(device=device, dtype=dtype))


def _hf_expected(arch: str) -> list[str]:
    paths = ["model.norm"]
    for i in range(2):
        paths += [f"model.layers.{i}.input_layernorm", f"model.layers.{i}.post_attention_layernorm"]
        if arch == "qwen3":
            paths += [f"model.layers.{i}.self_attn.q_norm", f"model.layers.{i}.self_attn.k_norm"]
    return paths


@pytest.mark.parametrize("device,dtype", MODEL_CASES)
@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3"])
def test_transformers_model(kf, arch, device, dtype):
    model = _hf_model(arch, device, dtype)
    ids = torch.randint(0, 128, (2, 9), device=device)
    inputs = {"ids": ids, "_dy": R.rand((2, 9, 128), torch.float32, device)}

    def forward(m, inp):
        return m(input_ids=inp["ids"], use_cache=False).logits

    report = check_model(kf, model, inputs, forward, _hf_expected(arch), dtype)
    assert {p.cls for p in report.patched} == {type(model.model.norm).__name__}
    assert {p.op for p in report.patched} == {"kernelforge.rms_norm"}


@pytest.mark.parametrize("device,dtype", MODEL_CASES)
def test_transformers_decode_step(kf, device, dtype):
    """One-token decode with a KV cache (1-row norm calls) matches the unpatched model."""
    model = _hf_model("llama", device, dtype).eval()
    ids = torch.randint(0, 128, (1, 6), device=device)
    with torch.no_grad():
        want = model.generate(ids, max_new_tokens=4, do_sample=False, min_new_tokens=4)
        want_logits = model(input_ids=want).logits
        kf.patch(model, **NORMS_ONLY, attention=False)
        got = model.generate(ids, max_new_tokens=4, do_sample=False, min_new_tokens=4)
        got_logits = model(input_ids=want).logits
        kf.unpatch(model)
    _check_pair("logits", got_logits, want_logits, None, dtype)
    if dtype == torch.float32:
        assert torch.equal(got, want)  # greedy tokens agree when logits agree to 1e-4


# ---- diffusers ---------------------------------------------------------------------------------------


# One tiny LTX-Video transformer (random weights), its inputs and forward, shared by the norm,
# activation and rope patch tests.
LTX_F, LTX_H, LTX_W = 2, 4, 4  # latent frames, height, width: 32 tokens


def ltx_model(device, dtype, layers=2, affine=False):
    diffusers = pytest.importorskip("diffusers")
    model = diffusers.LTXVideoTransformer3DModel(
        in_channels=8, out_channels=8, num_attention_heads=2, attention_head_dim=16, cross_attention_dim=32,
        num_layers=layers, caption_channels=16, norm_elementwise_affine=affine,
    )
    return _randomize_norms(model.to(device=device, dtype=dtype))


def ltx_inputs(device, dtype, b=2):
    tokens = LTX_F * LTX_H * LTX_W
    return {
        "hidden_states": R.rand((b, tokens, 8), dtype, device),
        "encoder_hidden_states": R.rand((b, 6, 16), dtype, device),
        "timestep": torch.tensor([10, 500][:b], device=device),
        "encoder_attention_mask": torch.ones(b, 6, device=device, dtype=dtype),
        "_dy": R.rand((b, tokens, 8), torch.float32, device),
    }


def ltx_forward(m, inp, **kwargs):
    return m(inp["hidden_states"], inp["encoder_hidden_states"], inp["timestep"], inp["encoder_attention_mask"],
             num_frames=LTX_F, height=LTX_H, width=LTX_W, **kwargs).sample


def ltx_norm_paths(layers=2):
    paths = ["norm_out"]
    for i in range(layers):
        paths += [f"transformer_blocks.{i}.norm1", f"transformer_blocks.{i}.norm2"]
        paths += [f"transformer_blocks.{i}.attn{a}.norm_{qk}" for a in (1, 2) for qk in ("q", "k")]
    return paths


@pytest.mark.parametrize("affine", [False, True], ids=["default", "affine_norms"])
@pytest.mark.parametrize("device,dtype", MODEL_CASES)
def test_diffusers_ltx_video(kf, device, dtype, affine):
    model = ltx_model(device, dtype, affine=affine)
    report = check_model(kf, model, ltx_inputs(device, dtype), ltx_forward, ltx_norm_paths(), dtype)
    by_cls = {(p.qualname, p.op): 0 for p in report.patched}
    for p in report.patched:
        by_cls[p.qualname, p.op] += 1
    assert by_cls == {("diffusers.RMSNorm", "kernelforge.rms_norm"): 4, ("torch.nn.RMSNorm", "kernelforge.rms_norm"): 8,
                      ("torch.nn.LayerNorm", "kernelforge.layer_norm"): 1}
