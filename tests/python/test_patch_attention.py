"""patch(model) routes attention to kernelforge.attention: tiny random transformers models (Llama, Qwen2,
Mistral with a sliding window, Gemma 2 with softcap and sliding windows, gpt-oss with sinks,
DeepSeek-V2 with MLA head dims 192 / 128) and diffusers transformers (LTX-Video, Flux, Wan), patched
against unpatched, in eval mode without gradients and as training steps (loss and parameter
gradients, sinks included); padding masks (left padding) become varlen; dropout in training falls
back, announced; unpatch restores the previous implementation.

CPU: the patched attention runs the float64 reference (float32 inputs computed in float64, rounded
once), the unpatched model its eager float32 attention: they agree to float32 accuracy. CUDA (bf16):
both are compared with a float32 run of the same weights (the oracle); the patched model must be
about as accurate as the original.
"""

from __future__ import annotations

import copy
import importlib
import warnings

import pytest
import torch

transformers = pytest.importorskip("transformers")

CASES = [pytest.param("cpu", torch.float32, id="cpu-float32"),
         pytest.param("cuda", torch.bfloat16, id="cuda-bfloat16", marks=pytest.mark.cuda)]
TOL = {torch.float32: 1e-4, torch.bfloat16: 3e-2}
SLACK, FLOOR = 1.5, 5e-3


def rel_err(a, b):
    a, b = a.detach().double(), b.detach().double()
    assert torch.isfinite(a).all() and torch.isfinite(b).all()
    return ((a - b).norm() / b.norm().clamp_min(1e-30)).item()


def compare(name, got, want, truth, dtype):
    if truth is None:
        err = rel_err(got, want)
        assert err < TOL[dtype], f"{name}: patched vs original {err:.2e}"
        return
    e_p, e_o = rel_err(got, truth), rel_err(want, truth)
    assert e_p <= SLACK * e_o + FLOOR, f"{name}: patched {e_p:.2e} vs original {e_o:.2e} (float32 oracle)"
    assert rel_err(got, want) < max(TOL[dtype], 1.1 * (e_p + e_o))


# head_dim 64 (the kernels' smallest); 2 layers so that sliding and full layers alternate (Gemma 2,
# gpt-oss); sequences longer than the window
COMMON = dict(vocab_size=96, hidden_size=128, intermediate_size=128, num_hidden_layers=2, num_attention_heads=2,
              num_key_value_heads=1, head_dim=64, max_position_embeddings=64, attn_implementation="eager")


def hf_model(arch, device, dtype):
    if arch == "llama":
        model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**COMMON))
    elif arch == "qwen2":
        model = transformers.Qwen2ForCausalLM(transformers.Qwen2Config(**COMMON))
    elif arch == "mistral":
        model = transformers.MistralForCausalLM(transformers.MistralConfig(sliding_window=5, **COMMON))
    elif arch == "gemma2":
        model = transformers.Gemma2ForCausalLM(transformers.Gemma2Config(
            sliding_window=5, attn_logit_softcapping=5.0, final_logit_softcapping=30.0, query_pre_attn_scalar=64,
            **COMMON))
    elif arch == "gpt_oss":
        cfg = dict(COMMON, num_local_experts=4, num_experts_per_tok=2, sliding_window=5)
        model = transformers.GptOssForCausalLM(transformers.GptOssConfig(**cfg))
        with torch.no_grad():  # HF initializes the sinks to zeros: random ones test that they are used
            for layer in model.model.layers:
                layer.self_attn.sinks.normal_(0, 1.0)
    elif arch == "deepseek_v2":  # MLA: q / k head dim 128 + 64 (rope) = 192, v head dim 128
        cfg = dict(COMMON, num_key_value_heads=2, kv_lora_rank=32, q_lora_rank=None, qk_nope_head_dim=128,
                   qk_rope_head_dim=64, v_head_dim=128, n_routed_experts=4, num_experts_per_tok=2,
                   moe_intermediate_size=64, n_shared_experts=1, first_k_dense_replace=1)
        cfg.pop("head_dim")
        model = transformers.DeepseekV2ForCausalLM(transformers.DeepseekV2Config(**cfg))
    else:
        raise ValueError(arch)
    return model.to(device=device, dtype=dtype).eval()


def logits(model, ids, mask=None):
    with torch.no_grad():
        return model(input_ids=ids, attention_mask=mask, use_cache=False).logits.float()


ARCHS = ["llama", "qwen2", "mistral", "gemma2", "gpt_oss", "deepseek_v2"]


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("device,dtype", CASES)
def test_transformers_patched_matches(kf, arch, device, dtype):
    model = hf_model(arch, device, dtype)
    ids = torch.randint(0, 96, (2, 13), device=device)
    truth = None
    if dtype != torch.float32:
        truth = logits(copy.deepcopy(model).float(), ids)
    want = logits(model, ids)
    report = kf.patch(model, norms=False, activations=False, rope=False, loss=False, moe=False)
    assert [(p.path, p.op) for p in report.patched] == [("", "kernelforge.attention")], str(report)
    assert model.config._attn_implementation == "kernelforge"
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no fallback
        got = logits(model, ids)
    compare(arch, got, want, truth, dtype)
    assert kf.unpatch(model) == 1
    assert model.config._attn_implementation == "eager"
    assert torch.equal(logits(model, ids), want)


@pytest.mark.parametrize("arch", ["llama", "mistral", "gpt_oss"])
@pytest.mark.parametrize("device,dtype", CASES)
def test_transformers_left_padding(kf, arch, device, dtype):
    """A batch with left padding: the padding mask becomes varlen; valid positions match the eager
    model (padded positions are not compared: eager attends them to something, the kernel gives 0)."""
    model = hf_model(arch, device, dtype)
    ids = torch.randint(0, 96, (3, 11), device=device)
    mask = torch.ones(3, 11, dtype=torch.long, device=device)
    mask[1, :4] = 0
    mask[2, :9] = 0
    truth = logits(copy.deepcopy(model).float(), ids, mask) if dtype != torch.float32 else None
    want = logits(model, ids, mask)
    kf.patch(model, norms=False, activations=False, rope=False, loss=False, moe=False)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        got = logits(model, ids, mask)
    keep = mask.bool()
    compare(f"{arch} padded", got[keep], want[keep], None if truth is None else truth[keep], dtype)
    kf.unpatch(model)


@pytest.mark.parametrize("device,dtype", CASES)
def test_transformers_generate(kf, device, dtype):
    """Greedy generation with a KV cache (Sq = 1 < Sk: bottom-right causal) gives the same tokens."""
    model = hf_model("mistral", device, dtype)
    ids = torch.randint(0, 96, (1, 6), device=device)
    with torch.no_grad():
        want = model.generate(ids, max_new_tokens=6, do_sample=False, min_new_tokens=6)
        kf.patch(model, norms=False, activations=False, rope=False, loss=False, moe=False)
        got = model.generate(ids, max_new_tokens=6, do_sample=False, min_new_tokens=6)
    kf.unpatch(model)
    if dtype == torch.float32:
        assert torch.equal(got, want)


@pytest.mark.parametrize("arch", ["llama", "gemma2", "gpt_oss"])
@pytest.mark.parametrize("device,dtype", CASES)
def test_transformers_generate_decode_kernel(kf, monkeypatch, arch, device, dtype):
    """Generation steps after the prompt (one new row against the cache, no padding, no gradient) run
    kernelforge.decode_attention on the cache in place, with the layer's window, softcap and sinks; the
    greedy tokens match the unpatched model's (CPU: exactly)."""
    model = hf_model(arch, device, dtype)
    ids = torch.randint(0, 96, (2, 7), device=device)
    dec = importlib.import_module("kernelforge.decode")
    calls = []
    real = dec.decode_attention

    def spy(q, *args, **kw):
        calls.append((tuple(q.shape), kw.get("window_left"), kw.get("softcap"), kw.get("sinks") is not None))
        return real(q, *args, **kw)

    monkeypatch.setattr(dec, "decode_attention", spy)
    with torch.no_grad():
        want = model.generate(ids, max_new_tokens=6, do_sample=False, min_new_tokens=6)
        kf.patch(model, norms=False, activations=False, rope=False, loss=False, moe=False)
        got = model.generate(ids, max_new_tokens=6, do_sample=False, min_new_tokens=6)
    kf.unpatch(model)
    assert len(calls) == 5 * 2  # 5 decode steps after the prompt, 2 layers
    assert all(c[0] == (2, 1, 2, 64) for c in calls)
    if arch == "gemma2":
        assert {c[1] for c in calls} == {-1, 4} and all(c[2] == 5.0 for c in calls)  # window 5 on one layer
    if arch == "gpt_oss":
        assert all(c[3] for c in calls)
    if dtype == torch.float32:
        assert torch.equal(got, want)


@pytest.mark.parametrize("arch", ["llama", "mistral", "gpt_oss"])
@pytest.mark.parametrize("device,dtype", CASES)
def test_continuous_batching_paged_kernelforge(kf, monkeypatch, arch, device, dtype):
    """transformers' continuous batching (generate_batch) with "paged|kernelforge": prefill batches run
    kernelforge.attention (varlen) over the paged cache's context rows, with the layer's window and
    sinks; decode-only batches of full-attention layers run decode_attention on the pages through a
    block table built from the read index; the greedy tokens equal "paged|eager"'s (CPU float32:
    exactly; CUDA bf16: the kernels ran and every request produced its tokens)."""
    from transformers import GenerationConfig  # noqa: PLC0415
    from transformers.generation.configuration_utils import ContinuousBatchingConfig  # noqa: PLC0415
    from transformers.generation.continuous_batching import cache as cb_cache  # noqa: PLC0415

    if device == "cpu":  # the cache sizes itself from free GPU memory; give the CPU run a budget
        monkeypatch.setattr(cb_cache.PagedAttentionMemoryHandler, "get_available_memory", lambda self: 1 << 30)
    pa = importlib.import_module("kernelforge.patch.attention")
    assert pa.register_transformers()
    calls = []
    real = pa._attn.attention

    def spy(q, *args, **kw):
        calls.append(kw.get("window"))
        return real(q, *args, **kw)

    monkeypatch.setattr(pa._attn, "attention", spy)
    decodes = []
    real_decode = pa._dec.decode_attention

    def decode_spy(q, k_cache, v_cache, seq_lens, block_table=None, **kw):
        decodes.append((q.shape[0], block_table.shape))
        return real_decode(q, k_cache, v_cache, seq_lens, block_table, **kw)

    monkeypatch.setattr(pa._dec, "decode_attention", decode_spy)
    model = hf_model(arch, device, dtype)
    prompts = [[1, 2, 3, 4], [5, 6, 7], [9] * 12]
    gc = GenerationConfig(max_new_tokens=5, do_sample=False, eos_token_id=-1, pad_token_id=0)
    cfg = ContinuousBatchingConfig(block_size=16, num_blocks=16, max_batch_tokens=64)
    got = {}
    for impl in ("paged|eager", pa.PAGED_NAME):
        model.set_attn_implementation(impl)
        try:
            out = model.generate_batch(inputs=prompts, generation_config=gc, continuous_batching_config=cfg)
        except ValueError as e:  # newer transformers run continuous batching on their own implementations only
            if impl == pa.PAGED_NAME and "not supported for continuous batching" in str(e):
                pytest.skip(f"transformers {transformers.__version__} refuses custom continuous-batching attention")
            raise
        got[impl] = {k: list(r.generated_tokens) for k, r in out.items()}
    assert calls, "paged|kernelforge did not reach kernelforge.attention"
    if arch != "mistral":  # decode-only batches of full-attention layers: decode_attention on the pages
        assert decodes and all(n == rows for n, (rows, _) in decodes)
    if arch == "mistral":
        assert (4, 0) in calls  # sliding window 5: the last 5 keys including the token's own
    assert all(len(t) == 5 for t in got[pa.PAGED_NAME].values())
    if dtype == torch.float32:
        assert got[pa.PAGED_NAME] == got["paged|eager"]


def test_paged_kernelforge_needs_the_paged_cache():
    pa = importlib.import_module("kernelforge.patch.attention")
    q = torch.randn(1, 2, 3, 64)
    with pytest.raises(ValueError, match="paged cache"):
        pa.hf_paged_attention(torch.nn.Module(), q, q, q, None)


def test_decode_path_needs_no_grad_and_aligned_cache(kf):
    """hf_attention's decode route: not taken when a gradient is needed or for more rows than a decode
    step; the output equals kernelforge.attention's (bottom-right causal) on the same states."""
    pa = importlib.import_module("kernelforge.patch.attention")
    q = torch.randn(2, 1, 4, 64, dtype=torch.float64)
    k, v = torch.randn(2, 9, 2, 64, dtype=torch.float64), torch.randn(2, 9, 2, 64, dtype=torch.float64)
    out = pa._decode(q, k, v, True, (-1, -1), 0.0, None, None)
    assert out is not None
    torch.testing.assert_close(out, kf.attention(q, k, v, causal=True), rtol=1e-12, atol=1e-12)
    out_w = pa._decode(q, k, v, True, (3, 0), 2.0, 0.1, None)
    torch.testing.assert_close(out_w, kf.attention(q, k, v, causal=True, window=(3, 0), softcap=2.0, scale=0.1),
                               rtol=1e-12, atol=1e-12)
    assert pa._decode(q.requires_grad_(), k, v, True, (-1, -1), 0.0, None, None) is None
    assert pa._decode(torch.randn(2, 17, 4, 64, dtype=torch.float64), torch.randn(2, 40, 2, 64, dtype=torch.float64),
                      torch.randn(2, 40, 2, 64, dtype=torch.float64), True, (-1, -1), 0.0, None, None) is None
    assert pa._decode(q.detach(), k, v, False, (-1, -1), 0.0, None, None) is None  # bidirectional: not a decode step


def train_step(model, ids, mask=None, labels=None):
    """One training step (train mode): the loss and every parameter's gradient, float32 copies."""
    model.train()
    model.zero_grad(set_to_none=True)
    loss = model(input_ids=ids, attention_mask=mask, labels=ids if labels is None else labels, use_cache=False).loss
    loss.backward()
    grads = {n: p.grad.detach().float().clone() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad(set_to_none=True)
    model.eval()
    return loss.detach().float(), grads


def compare_step(name, got, want, truth, dtype):
    """Loss, the gradients of the first layer's attention parameters (projections, sinks) one by one,
    and all gradients as one vector."""
    (l_g, g_g), (l_w, g_w) = got, want
    l_t, g_t = truth if truth is not None else (None, None)
    assert g_g.keys() == g_w.keys(), f"{name}: gradients of different parameters"
    compare(f"{name} loss", l_g.view(1), l_w.view(1), None if truth is None else l_t.view(1), dtype)
    attn = [n for n in g_w if ".layers.0.self_attn." in n]
    assert attn, f"{name}: no attention parameter has a gradient"
    for n in attn:
        compare(f"{name} grad {n}", g_g[n], g_w[n], None if truth is None else g_t[n], dtype)

    def flat(g):
        return torch.cat([g[n].flatten() for n in sorted(g_w)])

    compare(f"{name} all grads", flat(g_g), flat(g_w), None if truth is None else flat(g_t), dtype)


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("device,dtype", CASES)
def test_transformers_training_matches(kf, arch, device, dtype):
    """A training step (train mode, gradients of every parameter) runs the kernel's forward and backward
    (no fallback) and matches the unpatched model's step (CUDA: both against a float32 oracle)."""
    model = hf_model(arch, device, dtype)
    ids = torch.randint(0, 96, (2, 13), device=device)
    truth = train_step(copy.deepcopy(model).float(), ids) if dtype != torch.float32 else None
    want = train_step(model, ids)
    kf.patch(model, norms=False, activations=False, rope=False, loss=False, moe=False)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no fallback
        got = train_step(model, ids)
    compare_step(arch, got, want, truth, dtype)
    if arch == "gpt_oss":
        assert any(n.endswith("self_attn.sinks") for n in got[1]), "gpt-oss sinks got no gradient"
    assert kf.unpatch(model) == 1


@pytest.mark.parametrize("device,dtype", CASES)
def test_transformers_training_left_padding(kf, device, dtype):
    """Training with left padding: the varlen path (gather, kernel, scatter) carries the gradients."""
    model = hf_model("mistral", device, dtype)
    ids = torch.randint(0, 96, (3, 11), device=device)
    mask = torch.ones(3, 11, dtype=torch.long, device=device)
    mask[1, :4] = 0
    mask[2, :9] = 0
    # no loss term reads a padded position's output (eager attends padded rows to something, the kernel
    # gives them 0): labels at pads and at the tokens a pad predicts (the causal LM shift) are ignored
    labels = ids.masked_fill(mask == 0, -100)
    labels[:, 1:] = labels[:, 1:].masked_fill(mask[:, :-1] == 0, -100)
    truth = train_step(copy.deepcopy(model).float(), ids, mask, labels) if dtype != torch.float32 else None
    want = train_step(model, ids, mask, labels)
    kf.patch(model, norms=False, activations=False, rope=False, loss=False, moe=False)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        got = train_step(model, ids, mask, labels)
    compare_step("mistral padded", got, want, truth, dtype)
    kf.unpatch(model)


def test_transformers_dropout_falls_back(kf, monkeypatch):
    """Attention dropout in training mode: torch's attention runs, announced once; gradients flow. In
    eval mode (no dropout) the kernel runs again."""
    from kernelforge.patch import _runtime

    monkeypatch.setattr(_runtime, "warned", set())
    model = hf_model("llama", "cpu", torch.float32)
    model.config.attention_dropout = 0.1
    for layer in model.model.layers:
        layer.self_attn.attention_dropout = 0.1
    ids = torch.randint(0, 96, (2, 9))
    want = logits(model, ids)
    kf.patch(model, norms=False, activations=False, rope=False, loss=False, moe=False)
    model.train()
    with pytest.warns(UserWarning, match=r"dropout=0\.1 in training mode"):
        loss = model(input_ids=ids, labels=ids, use_cache=False).loss
    loss.backward()
    assert model.model.layers[0].self_attn.q_proj.weight.grad is not None
    model.eval()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        got = logits(model, ids)
    assert rel_err(got, want) < 1e-4
    model.train()
    monkeypatch.setenv("KF_STRICT", "1")
    with pytest.raises(RuntimeError, match="KF_STRICT=1"):
        model(input_ids=ids, use_cache=False)
    kf.unpatch(model)


def test_window_conversion_matches_eager_mask():
    """sliding_window W: transformers' eager mask (kv > q - W, causal) is window (W - 1, 0)."""
    from transformers.masking_utils import sliding_window_causal_mask_function

    from kernelforge.attention import visible_keys
    from kernelforge.patch.attention import _window

    W, S = 4, 10
    fn = sliding_window_causal_mask_function(W)
    t = torch.tensor
    eager = torch.tensor([[bool(fn(t(0), t(0), t(q), t(k))) for k in range(S)] for q in range(S)])
    assert torch.equal(visible_keys(S, S, True, _window(W, True), "cpu"), eager)


def test_mask_function_plain_patterns():
    from transformers import masking_utils as mu

    from kernelforge.patch.attention import plain_mask_function

    assert plain_mask_function(mu.causal_mask_function)
    assert plain_mask_function(mu.sliding_window_causal_mask_function(8))
    assert plain_mask_function(mu.sliding_window_bidirectional_mask_function(8))
    packed = mu.and_masks(mu.causal_mask_function, mu.packed_sequence_mask_function(torch.zeros(1, 4)))
    assert not plain_mask_function(packed)
    assert not plain_mask_function(mu.or_masks(mu.causal_mask_function, mu.bidirectional_mask_function))


# ---- diffusers -----------------------------------------------------------------------------------------


def _ltx(device, dtype):
    diffusers = pytest.importorskip("diffusers")
    model = diffusers.LTXVideoTransformer3DModel(in_channels=8, out_channels=8, num_attention_heads=2,
                                                 attention_head_dim=64, cross_attention_dim=128, num_layers=1,
                                                 caption_channels=16)
    inputs = {"hidden_states": torch.randn(2, 32, 8), "encoder_hidden_states": torch.randn(2, 6, 16),
              "timestep": torch.tensor([10, 500])}

    def forward(m, inp):
        return m(inp["hidden_states"], inp["encoder_hidden_states"], inp["timestep"], None, num_frames=2, height=4,
                 width=4).sample
    return model, inputs, forward, 2


def _flux(device, dtype):
    diffusers = pytest.importorskip("diffusers")
    model = diffusers.FluxTransformer2DModel(patch_size=1, in_channels=8, num_layers=1, num_single_layers=1,
                                             attention_head_dim=64, num_attention_heads=2, joint_attention_dim=16,
                                             pooled_projection_dim=16, axes_dims_rope=(16, 24, 24))
    inputs = {"hidden_states": torch.randn(1, 16, 8), "encoder_hidden_states": torch.randn(1, 5, 16),
              "pooled_projections": torch.randn(1, 16), "timestep": torch.tensor([0.5]),
              "img_ids": torch.randn(16, 3), "txt_ids": torch.zeros(5, 3)}

    def forward(m, inp):
        return m(**inp).sample
    return model, inputs, forward, 2


def _wan(device, dtype):
    diffusers = pytest.importorskip("diffusers")
    model = diffusers.WanTransformer3DModel(patch_size=(1, 2, 2), num_attention_heads=2, attention_head_dim=64,
                                            in_channels=4, out_channels=4, text_dim=16, freq_dim=16, ffn_dim=64,
                                            num_layers=1, rope_max_seq_len=32)
    inputs = {"hidden_states": torch.randn(1, 4, 2, 8, 8), "timestep": torch.tensor([10]),
              "encoder_hidden_states": torch.randn(1, 6, 16)}

    def forward(m, inp):
        return m(**inp).sample
    return model, inputs, forward, 2


@pytest.mark.parametrize("build", [_ltx, _flux, _wan], ids=["ltx", "flux", "wan"])
def test_diffusers_patched_matches(kf, build):
    model, inputs, forward, n_attn = build("cpu", torch.float32)
    model.eval()
    with torch.no_grad():
        want = forward(model, inputs)
        report = kf.patch(model, norms=False, activations=False, rope=False, loss=False, moe=False)
        attn = [p for p in report.patched if p.op == "kernelforge.attention"]
        assert len(attn) == n_attn, str(report)
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            got = forward(model, inputs)
        assert rel_err(got, want) < 1e-4
        assert kf.unpatch(model) == n_attn
        assert torch.equal(forward(model, inputs), want)


@pytest.mark.parametrize("build", [_ltx, _flux, _wan], ids=["ltx", "flux", "wan"])
def test_diffusers_training_matches(kf, build):
    """A training step through the patched processors: the kernel's backward (no fallback); the loss and
    the attention parameters' gradients match the unpatched model's."""
    model, inputs, forward, n_attn = build("cpu", torch.float32)

    def step():
        model.train()
        model.zero_grad(set_to_none=True)
        loss = forward(model, inputs).square().mean()
        loss.backward()
        grads = {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}
        model.eval()
        return loss.detach(), grads

    want_loss, want = step()
    report = kf.patch(model, norms=False, activations=False, rope=False, loss=False, moe=False)
    assert len([p for p in report.patched if p.op == "kernelforge.attention"]) == n_attn, str(report)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        got_loss, got = step()
    assert rel_err(got_loss.view(1), want_loss.view(1)) < 1e-4
    attn = [n for n in want if ".to_q." in n or ".to_k." in n or ".to_v." in n]
    assert attn and got.keys() == want.keys()
    for n in attn:
        assert rel_err(got[n], want[n]) < 1e-4, n
    kf.unpatch(model)


def test_ltx_rope_and_attention_compose(kf, monkeypatch):
    """LTX attention modules get both entries: the RoPE entry's forward runs the processor's code with
    apply_rotary_emb -> apply_rope_bsc and dispatch_attention_fn -> kernelforge.attention (no fallback);
    the patched model matches, and unpatch restores both."""
    model, inputs, forward, n_attn = _ltx("cpu", torch.float32)
    model.eval()
    patch_attn = importlib.import_module("kernelforge.patch.attention")
    real, calls = patch_attn._attn.attention, []

    def counted(*args, **kwargs):
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(patch_attn._attn, "attention", counted)
    with torch.no_grad():
        want = forward(model, inputs)
        report = kf.patch(model, norms=False, activations=False, loss=False)
        rope = [p for p in report.patched if p.op == "kernelforge.apply_rope_bsc"]
        attn = [p for p in report.patched if p.op == "kernelforge.attention"]
        assert len(rope) == n_attn and len(attn) == n_attn, str(report)
        assert not [s for s in report.skipped if "attention" in s.cls.lower()], str(report)
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            got = forward(model, inputs)
        assert len(calls) == n_attn
        assert rel_err(got, want) < 1e-4
        assert kf.unpatch(model) == 2 * n_attn
        assert torch.equal(forward(model, inputs), want)
