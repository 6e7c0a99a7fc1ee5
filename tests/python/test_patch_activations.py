"""kernelforge.patch / unpatch for the activation family: transformers gated MLPs (SiLU -> swiglu,
GELU -> geglu) and the diffusers GELU / GEGLU / SwiGLU / LinearActivation projections.

Tiny random models (float32 on CPU against the float64 reference kernels, bfloat16 on GPU) patched
vs unpatched: outputs and all parameter gradients agree (test_patch_models.check_model), the report
lists every replaced module, unpatch restores the class forwards; modules whose activation is not
exactly one kernelforge computes are skipped and reported.
"""

from __future__ import annotations

import copy
import importlib
import warnings

import pytest
import torch

import norm_ref as R
from norm_ref import DEVICES
from test_patch_models import (MODEL_CASES, _randomize_norms, check_model, ltx_forward, ltx_inputs, ltx_model,
                               ltx_norm_paths)

H, I = 32, 48  # hidden and intermediate sizes of the hand-built modules


def _transformers():
    return pytest.importorskip("transformers")


def _diffusers():
    return pytest.importorskip("diffusers")


def _activations():
    _diffusers()
    return importlib.import_module("diffusers.models.activations")


def _assert_unpatched(model):
    for name, m in model.named_modules():
        assert "forward" not in m.__dict__ and "_kf_patch" not in m.__dict__, name
        assert m.forward.__func__ is type(m).forward, name


# ---- tiny transformers models --------------------------------------------------------------------------

COMMON = dict(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, max_position_embeddings=64, attn_implementation="eager")


def _hf_model(arch: str, device, dtype, **extra):
    tf = _transformers()
    cfg = dict(COMMON, **extra)
    if arch == "llama":
        model = tf.LlamaForCausalLM(tf.LlamaConfig(**cfg))
    elif arch == "qwen2":
        model = tf.Qwen2ForCausalLM(tf.Qwen2Config(**cfg))
    elif arch == "qwen3":
        model = tf.Qwen3ForCausalLM(tf.Qwen3Config(head_dim=16, **cfg))
    elif arch == "mistral":
        model = tf.MistralForCausalLM(tf.MistralConfig(**cfg))
    elif arch == "gemma":
        model = tf.GemmaForCausalLM(tf.GemmaConfig(head_dim=16, **cfg))
    else:
        raise ValueError(arch)
    return _randomize_norms(model.to(device=device, dtype=dtype))


def _hf_norm_paths(arch: str) -> list[str]:
    if arch == "gemma":  # GemmaRMSNorm (x * (1 + w)) is skipped
        return []
    paths = ["model.norm"]
    for i in range(2):
        paths += [f"model.layers.{i}.input_layernorm", f"model.layers.{i}.post_attention_layernorm"]
        if arch == "qwen3":
            paths += [f"model.layers.{i}.self_attn.q_norm", f"model.layers.{i}.self_attn.k_norm"]
    return paths


def _hf_inputs(device):
    return {"ids": torch.randint(0, 128, (2, 9), device=device), "_dy": R.rand((2, 9, 128), torch.float32, device)}


def _hf_forward(m, inp):
    return m(input_ids=inp["ids"], use_cache=False).logits


MLP_OP = {"llama": "kernelforge.swiglu", "qwen2": "kernelforge.swiglu", "qwen3": "kernelforge.swiglu",
          "mistral": "kernelforge.swiglu", "gemma": "kernelforge.geglu"}


@pytest.mark.parametrize("families", ["default", "activations_only"])
@pytest.mark.parametrize("device,dtype", MODEL_CASES)
@pytest.mark.parametrize("arch", ["llama", "qwen2", "mistral", "qwen3", "gemma"])
def test_transformers_model(kf, arch, device, dtype, families):
    """Logits and every parameter gradient agree patched vs unpatched; the report lists every MLP (and, by
    default, the norms and the attention modules: rope)."""
    model = _hf_model(arch, device, dtype)
    mlps = [f"model.layers.{i}.mlp" for i in range(2)]
    attns = [f"model.layers.{i}.self_attn" for i in range(2)]
    kwargs = {} if families == "default" else {"norms": False, "rope": False, "loss": False}
    # default: the model itself too (family "loss"; without labels it runs the original forward)
    expected = mlps + (_hf_norm_paths(arch) + attns + [""] if families == "default" else [])
    report = check_model(kf, model, _hf_inputs(device), _hf_forward, expected, dtype, patch_kwargs=kwargs)
    by_path = {p.path: p for p in report.patched}
    for path in mlps:
        assert by_path[path].op == MLP_OP[arch] and by_path[path].cls == type(model.model.layers[0].mlp).__name__
    assert f"transformers.{type(model.model.layers[0].mlp).__name__} -> {MLP_OP[arch]}" in str(report)
    if families == "activations_only":
        assert not any("norm" in s.path for s in report.skipped)  # norms out of scope: not even reported
    _assert_unpatched(model)


@pytest.mark.parametrize("device,dtype", MODEL_CASES)
def test_transformers_gelu_exact_mlp(kf, device, dtype):
    """hidden_act="gelu" (erf GELU) maps to geglu(up, gate, "none")."""
    model = _hf_model("llama", device, dtype, hidden_act="gelu")
    mlps = [f"model.layers.{i}.mlp" for i in range(2)]
    report = check_model(kf, model, _hf_inputs(device), _hf_forward, mlps, dtype,
                         patch_kwargs={"norms": False, "rope": False, "loss": False})
    assert {p.op for p in report.patched} == {"kernelforge.geglu"}
    P = importlib.import_module("kernelforge.patch")
    model2 = _hf_model("llama", device, dtype, hidden_act="gelu")
    kf.patch(model2, norms=False, attention=False)
    assert model2.model.layers[0].mlp.__dict__[P.STATE_ATTR].extra[1] == "none"
    kf.unpatch(model2)


@pytest.mark.parametrize("device,dtype", MODEL_CASES)
def test_transformers_decode_step(kf, device, dtype):
    """Greedy decoding with a KV cache (one-row MLP calls) matches the unpatched model."""
    model = _hf_model("qwen2", device, dtype).eval()
    ids = torch.randint(0, 128, (1, 6), device=device)
    with torch.no_grad():
        want = model.generate(ids, max_new_tokens=4, do_sample=False, min_new_tokens=4)
        want_logits = model(input_ids=want).logits
        kf.patch(model, attention=False)
        got = model.generate(ids, max_new_tokens=4, do_sample=False, min_new_tokens=4)
        got_logits = model(input_ids=want).logits
        kf.unpatch(model)
    from test_patch_models import _check_pair

    _check_pair("logits", got_logits, want_logits, None, dtype)
    if dtype == torch.float32:
        assert torch.equal(got, want)


# ---- hand-built MLPs: what is patched, what is skipped -------------------------------------------------


class CopiedMLP(torch.nn.Module):
    """Not named like any transformers class; same structure and forward as LlamaMLP."""

    def __init__(self, act):
        super().__init__()
        self.gate_proj = torch.nn.Linear(H, I, bias=False)
        self.up_proj = torch.nn.Linear(H, I, bias=False)
        self.down_proj = torch.nn.Linear(I, H, bias=False)
        self.act_fn = act

    def forward(self, hidden_state):
        return self.down_proj(self.act_fn(self.gate_proj(hidden_state)) * self.up_proj(hidden_state))


class SwappedMLP(CopiedMLP):
    """gate and up swapped: act_fn(up_proj(x)) * gate_proj(x) must not be patched."""

    def forward(self, x):
        return self.down_proj(self.act_fn(self.up_proj(x)) * self.gate_proj(x))


class ScaledMLP(CopiedMLP):
    def forward(self, x):
        return self.down_proj(self.act_fn(self.gate_proj(x)) * self.up_proj(x)) * 0.5


def _llama_mlp(hidden_act: str, bias: bool = False):
    tf = _transformers()
    from transformers.models.llama.modeling_llama import LlamaMLP

    return LlamaMLP(tf.LlamaConfig(hidden_size=H, intermediate_size=I, hidden_act=hidden_act, mlp_bias=bias))


def mlp_zoo():
    """name -> (module, expected: an op name when patched, else a substring of the skip reason)."""
    _transformers()
    from transformers.activations import ACT2FN
    from transformers.models.gemma.modeling_gemma import GemmaConfig, GemmaMLP
    from transformers.models.mistral.modeling_mistral import MistralConfig, MistralMLP
    from transformers.models.qwen2.modeling_qwen2 import Qwen2Config, Qwen2MLP

    no_kernel = "no kernelforge kernel computes exactly it"
    hooked = CopiedMLP(torch.nn.SiLU())
    hooked.act_fn.register_forward_hook(lambda m, i, o: None)
    return {
        "llama_silu": (_llama_mlp("silu"), "kernelforge.swiglu"),
        "llama_swish": (_llama_mlp("swish"), "kernelforge.swiglu"),  # nn.SiLU
        "llama_silu_bias": (_llama_mlp("silu", bias=True), "kernelforge.swiglu"),
        "mistral": (MistralMLP(MistralConfig(hidden_size=H, intermediate_size=I)), "kernelforge.swiglu"),
        "qwen2": (Qwen2MLP(Qwen2Config(hidden_size=H, intermediate_size=I)), "kernelforge.swiglu"),
        "gemma_tanh": (GemmaMLP(GemmaConfig(hidden_size=H, intermediate_size=I)), "kernelforge.geglu"),
        "llama_gelu": (_llama_mlp("gelu"), "kernelforge.geglu"),
        "copied_nn_silu": (CopiedMLP(torch.nn.SiLU()), "kernelforge.swiglu"),
        "copied_nn_gelu_tanh": (CopiedMLP(torch.nn.GELU(approximate="tanh")), "kernelforge.geglu"),
        "copied_hf_silu": (CopiedMLP(ACT2FN["silu"]), "kernelforge.swiglu"),
        "llama_relu": (_llama_mlp("relu"), no_kernel),
        "llama_gelu_new": (_llama_mlp("gelu_new"), no_kernel),  # tanh formula written out: not F.gelu
        "llama_gelu_python": (_llama_mlp("gelu_python"), no_kernel),
        "llama_quick_gelu": (_llama_mlp("quick_gelu"), no_kernel),
        "copied_relu": (CopiedMLP(torch.nn.ReLU()), no_kernel),
        "swapped": (SwappedMLP(torch.nn.SiLU()), "forward differs from LlamaMLP"),
        "scaled": (ScaledMLP(torch.nn.SiLU()), "forward differs from LlamaMLP"),
        "hooked_act": (hooked, "has hooks"),
        "linear": (torch.nn.Linear(H, H), None),  # neither patched nor reported
    }


def _check_module(kf, m, x, dtype, msg):
    """Patched forward vs the class forward: outputs, input and parameter gradients."""
    def run(fwd):
        m.zero_grad(set_to_none=True)
        xi = x.detach().clone().requires_grad_()
        y = fwd(xi)
        y.backward(R.rand(y.shape, y.dtype, y.device))
        return y.detach(), xi.grad, [p.grad.clone() for p in m.parameters()]

    torch.manual_seed(1)
    y0, dx0, dp0 = run(lambda t: type(m).forward(m, t))
    torch.manual_seed(1)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no runtime fallback may happen
        y1, dx1, dp1 = run(m)
    if dtype == torch.float32:
        R.assert_close(y1, y0, dtype, msg=msg)
        R.assert_close(dx1, dx0, torch.float32, grad=True, msg=f"{msg} dx")
        for a, b in zip(dp1, dp0):
            R.assert_close(a, b, torch.float32, grad=True, msg=f"{msg} dparam")
    else:  # eager rounds act(gate) before the multiply, the kernel once: compare as a whole
        from test_patch_models import rel_err

        assert y1.dtype == y0.dtype
        for a, b in [(y1, y0), (dx1, dx0), *zip(dp1, dp0)]:
            assert rel_err(a, b) < 2e-2, msg


def test_mlp_report(kf):
    zoo = mlp_zoo()
    model = torch.nn.ModuleDict({k: m for k, (m, _) in zoo.items()})
    report = kf.patch(model, attention=False)
    print(report)
    patched = {p.path: p for p in report.patched}
    skipped = {s.path: s for s in report.skipped}
    for name, (m, verdict) in zoo.items():
        if verdict is None:
            assert name not in patched and name not in skipped
        elif verdict.startswith("kernelforge."):
            assert name in patched, f"{name} not patched: {skipped.get(name)}"
            assert patched[name].op == verdict
        else:
            assert name in skipped, f"{name} should have been skipped"
            assert verdict in skipped[name].reason, (name, skipped[name].reason)
    # the projections and activations inside are not patched themselves
    assert not any(p.path.endswith(("_proj", "act_fn")) for p in report.patched)
    assert "transformers.LlamaMLP -> kernelforge.swiglu" in str(report)
    assert "transformers.GemmaMLP -> kernelforge.geglu" in str(report)
    assert "transformers.LlamaMLP: activation transformers.QuickGELUActivation" in str(report)
    assert kf.unpatch(model) == len(report.patched)
    _assert_unpatched(model)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("device", DEVICES)
def test_mlps_match_original(kf, device, dtype):
    zoo = mlp_zoo()
    for name, (m, verdict) in zoo.items():
        if not (verdict or "").startswith("kernelforge."):
            continue
        m = m.to(device=device, dtype=dtype)
        with torch.no_grad():
            for p in m.parameters():
                p.copy_(R.rand(p.shape, p.dtype, p.device, scale=0.5))
        assert kf.patch(m, attention=False).patched_paths == [""], name
        x = R.rand((3, 5, H), dtype, device, scale=2.0)
        _check_module(kf, m, x, dtype, name)
        # a row-strided (non-contiguous) input
        big = R.rand((7, H + 3), dtype, device, scale=2.0)
        _check_module(kf, m, big[:, :H], dtype, f"{name} strided")
        assert kf.unpatch(m) == 1


# ---- diffusers ---------------------------------------------------------------------------------------


def _diffusers_modules():
    A = _activations()
    return A, {
        "gelu": (A.GELU(H, I), "kernelforge.gelu"),
        "gelu_tanh": (A.GELU(H, I, approximate="tanh"), "kernelforge.gelu"),
        "gelu_nobias": (A.GELU(H, I, bias=False), "kernelforge.gelu"),
        "geglu": (A.GEGLU(H, I), "kernelforge.gelu_and_mul"),
        "swiglu": (A.SwiGLU(H, I), "kernelforge.swiglu"),
        "linear_gelu": (A.LinearActivation(H, I, activation="gelu"), "kernelforge.gelu"),
        "linear_silu": (A.LinearActivation(H, I, activation="silu"), "no ungated silu op"),
        "approx_gelu": (A.ApproximateGELU(H, I), "sigmoid(1.702 x)"),
    }


def test_diffusers_report(kf):
    A, zoo = _diffusers_modules()

    class MyGEGLU(A.GEGLU):
        def forward(self, hidden_states):  # gate first: not diffusers' order
            h, gate = self.proj(hidden_states).chunk(2, dim=-1)
            return torch.nn.functional.gelu(h) * gate

    zoo["my_geglu"] = (MyGEGLU(H, I), "forward differs")
    odd = A.GELU(H, I)
    odd.approximate = "erf"
    zoo["gelu_bad_mode"] = (odd, "approximate='erf'")
    model = torch.nn.ModuleDict({k: m for k, (m, _) in zoo.items()})
    report = kf.patch(model, attention=False)
    print(report)
    patched = {p.path: p.op for p in report.patched}
    skipped = {s.path: s.reason for s in report.skipped}
    for name, (_, verdict) in zoo.items():
        if verdict.startswith("kernelforge."):
            assert patched.get(name) == verdict, (name, skipped.get(name))
        else:
            assert verdict in skipped.get(name, ""), (name, skipped.get(name))
    assert "diffusers.GEGLU -> kernelforge.gelu_and_mul" in str(report)
    kf.unpatch(model)
    _assert_unpatched(model)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("device", DEVICES)
def test_diffusers_modules_match_original(kf, device, dtype):
    _, zoo = _diffusers_modules()
    for name, (m, verdict) in zoo.items():
        if not verdict.startswith("kernelforge."):
            continue
        m = m.to(device=device, dtype=dtype)
        assert kf.patch(m, attention=False).patched_paths == [""], name
        x = R.rand((2, 5, H), dtype, device, scale=2.0)
        _check_module(kf, m, x, dtype, name)
        assert kf.unpatch(m) == 1


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("device", DEVICES)
def test_diffusers_gelu_tanh_fuses_a_plain_projection(kf, device, dtype, monkeypatch):
    """GELU(approximate="tanh") over a plain nn.Linear runs as one GEMM with the GELU in its epilogue; a
    hooked projection (LoRA, quantization and hooks look like this) is still called, then kernelforge.gelu."""
    import sys  # noqa: PLC0415

    PA = sys.modules["kernelforge.patch.activation"]  # (kernelforge.gemm / .activation are also function names)
    fused = not (device == "cuda" and dtype == torch.float32)  # float32 CUDA: torch's projection, kernelforge.gelu
    calls = []
    real = PA._linear_act
    monkeypatch.setattr(PA, "_linear_act", lambda *a, **k: calls.append(a[3]) or real(*a, **k))
    A = _activations()
    m = A.GELU(H, I, approximate="tanh").to(device=device, dtype=dtype)
    x = R.rand((2, 5, H), dtype, device, scale=2.0)
    kf.patch(m, attention=False)
    _check_module(kf, m, x, dtype, "gelu_tanh fused")
    assert set(calls) == ({"gelu_tanh"} if fused else set())
    calls.clear()
    seen = []
    m.proj.register_forward_hook(lambda mod, i, o: seen.append(o.shape))
    y = m(x)
    assert not calls and seen == [(2, 5, I)] and y.shape == (2, 5, I)
    kf.unpatch(m)


@pytest.mark.parametrize("device,dtype", MODEL_CASES)
def test_diffusers_ltx_video(kf, device, dtype):
    """LTX-Video's feed-forward is FeedForward(activation_fn="gelu-approximate"): GELU(approximate="tanh")."""
    model = ltx_model(device, dtype)
    ffs = [f"transformer_blocks.{i}.ff.net.0" for i in range(2)]
    for p in ffs:
        gelu = model.get_submodule(p)
        assert type(gelu) is _activations().GELU and gelu.approximate == "tanh"
    norms = ltx_norm_paths()
    attns = [f"transformer_blocks.{i}.attn{a}" for i in range(2) for a in (1, 2)]  # rope (default family)
    report = check_model(kf, model, ltx_inputs(device, dtype), ltx_forward, norms + ffs + attns, dtype,
                         patch_kwargs={})
    assert {p.op for p in report.patched if p.path in ffs} == {"kernelforge.gelu"}
    _assert_unpatched(model)


@pytest.mark.parametrize("device,dtype", MODEL_CASES)
@pytest.mark.parametrize("activation_fn", ["geglu", "swiglu", "gelu", "gelu-approximate"])
def test_diffusers_basic_transformer_block(kf, device, dtype, activation_fn):
    diffusers = _diffusers()
    from diffusers.models.attention import BasicTransformerBlock

    block = BasicTransformerBlock(32, 2, 16, cross_attention_dim=24, activation_fn=activation_fn)
    block = _randomize_norms(block.to(device=device, dtype=dtype))
    op = {"geglu": "kernelforge.gelu_and_mul", "swiglu": "kernelforge.swiglu"}.get(activation_fn, "kernelforge.gelu")
    inputs = {
        "x": R.rand((2, 10, 32), dtype, device),
        "ctx": R.rand((2, 7, 24), dtype, device),
        "_dy": R.rand((2, 10, 32), torch.float32, device),
    }

    def forward(m, inp):
        return m(inp["x"], encoder_hidden_states=inp["ctx"])

    norms = [n for n, m in block.named_modules() if isinstance(m, torch.nn.LayerNorm)]
    assert norms == ["norm1", "norm2", "norm3"]
    report = check_model(kf, block, inputs, forward, norms + ["ff.net.0"], dtype, patch_kwargs={})
    assert next(p.op for p in report.patched if p.path == "ff.net.0") == op
    assert type(block.ff.net[0]).__module__ == _activations().__name__
    _assert_unpatched(block)


# ---- conventions: idempotence, re-patching, families, runtime fallback --------------------------------------


def test_patch_twice_is_patch_once(kf):
    model = _hf_model("llama", "cpu", torch.float32)
    first = kf.patch(model, attention=False)
    fwd = {p.path: model.get_submodule(p.path).forward for p in first.patched}
    assert any(p.op == "kernelforge.swiglu" for p in first.patched)
    second = kf.patch(model, attention=False)
    assert not second.patched
    assert {s.path for s in second.skipped if s.reason == "already patched by kernelforge"} == set(fwd)
    for path, f in fwd.items():
        assert model.get_submodule(path).forward is f
    assert kf.unpatch(model) == len(first.patched)
    _assert_unpatched(model)


def test_patch_unpatch_patch(kf):
    model = _hf_model("qwen2", "cpu", torch.float32)
    inputs = _hf_inputs("cpu")
    with torch.no_grad():
        want = _hf_forward(model, inputs)
        first = kf.patch(model, attention=False)
        y1 = _hf_forward(model, inputs)
        assert kf.unpatch(model) == len(first.patched)
        _assert_unpatched(model)
        assert torch.equal(_hf_forward(model, inputs), want)
        second = kf.patch(model, attention=False)
        assert second.patched_paths == first.patched_paths
        y2 = _hf_forward(model, inputs)
    assert torch.equal(y1, y2)
    R.assert_close(y2, want, torch.float32)
    kf.unpatch(model)


def test_families_compose(kf):
    """patch(norms only) then patch(): the second call adds the MLPs and the attention modules (rope),
    skips what is already patched."""
    model = _hf_model("llama", "cpu", torch.float32)
    norms = kf.patch(model, activations=False, rope=False, loss=False, attention=False)
    assert norms.patched and all(p.op == "kernelforge.rms_norm" for p in norms.patched)
    acts = kf.patch(model, attention=False)
    assert sorted(acts.patched_paths) == ["", "model.layers.0.mlp", "model.layers.0.self_attn", "model.layers.1.mlp",
                                          "model.layers.1.self_attn"]
    assert sorted(s.path for s in acts.skipped) == sorted(norms.patched_paths)
    assert kf.patch(model, norms=False, activations=False, rope=False, loss=False, attention=False).patched == []
    assert kf.unpatch(model) == len(norms.patched) + len(acts.patched)
    _assert_unpatched(model)


def test_act_fn_replaced_after_patch_falls_back(kf, monkeypatch):
    P = importlib.import_module("kernelforge.patch")
    monkeypatch.setattr(importlib.import_module("kernelforge.patch._runtime"), "warned", set())
    monkeypatch.delenv("KF_STRICT", raising=False)
    m = _llama_mlp("silu")
    kf.patch(m, attention=False)
    m.act_fn = torch.nn.ReLU()
    x = R.rand((3, H), torch.float32, "cpu")
    with pytest.warns(UserWarning, match="replaced after patching"):
        got = m(x)
    assert torch.equal(got, type(m).forward(m, x))
    monkeypatch.setenv("KF_STRICT", "1")
    with pytest.raises(RuntimeError, match="KF_STRICT"):
        m(x)
    monkeypatch.delenv("KF_STRICT")
    assert kf.unpatch(m) == 1
    # a hook added to the activation after patching: the original forward runs (and calls the hook)
    m = CopiedMLP(torch.nn.SiLU())
    kf.patch(m, attention=False)
    calls = []
    m.act_fn.register_forward_hook(lambda *a: calls.append(1))
    with pytest.warns(UserWarning, match="hooked"):
        m(x)
    assert calls == [1]
    kf.unpatch(m)


def test_keyword_input_and_deepcopy(kf):
    m = _llama_mlp("silu")
    x = R.rand((3, H), torch.float32, "cpu")
    want = m(x)
    kf.patch(m, attention=False)
    R.assert_close(m(x=x), want, torch.float32)
    clone = copy.deepcopy(m)
    assert clone.forward.__self__ is clone
    assert clone.__dict__["_kf_patch"].extra[0] is clone.act_fn  # the runtime check follows the copy
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        R.assert_close(clone(x), want, torch.float32)
    assert kf.unpatch(clone) == kf.unpatch(m) == 1


def test_compile_patched_mlp(kf):
    torch._dynamo.reset()
    A = _activations()
    m = torch.nn.Sequential(_llama_mlp("silu"), A.GEGLU(H, H), A.SwiGLU(H, H))
    x = R.rand((4, H), torch.float32, "cpu")
    want = m(x)
    kf.patch(m, attention=False)
    got = torch.compile(m, fullgraph=True, backend="aot_eager")(x)
    R.assert_close(got, want, torch.float32)
    kf.unpatch(m)


def test_register_replacement_family_default(kf):
    """Entries registered without a family (Replacement's 4 positional fields) apply whatever the flags."""
    P = importlib.import_module("kernelforge.patch")
    entry = P.Replacement("test Identity", "kernelforge.test", lambda m: True if isinstance(m, torch.nn.Identity) else None,
                          lambda self, x: x + 1)
    P.register_replacement(entry)
    try:
        m = torch.nn.Sequential(torch.nn.Identity())
        assert kf.patch(m, norms=False, activations=False, attention=False).patched_paths == ["0"]
        assert torch.equal(m(torch.zeros(2)), torch.ones(2))
        kf.unpatch(m)
    finally:
        P.REPLACEMENTS.remove(entry)
