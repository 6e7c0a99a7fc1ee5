"""kernelforge.decode_step: the fused decode step of Llama / Mistral / Qwen2 and generate's fused_step.

CPU (float32, tiny random models with head dim 64, decode_attention's smallest): greedy tokens of
generate with the fused step equal HF generate's (biases, tied embeddings, llama3 rope scaling, GQA);
one step's logits and cache rows equal the HF forward's to float32 rounding; fusing the q/k/v and
gate/up weights re-points the parameters to views of one buffer without changing the model's values,
outputs or memory; replaced and in-place changed weights are seen; separate GEMMs when the parts
cannot share a buffer; unsupported models fall back announced (KF_STRICT=1: an error; fused_step=True:
ValueError). CUDA (bf16): the fused step's greedy tokens equal the model-forward step's except where
two logits are within bf16 noise, in a CUDA graph and without, and the graph is replayed and
recaptured as the weights change; KF_PDL=1 and KF_PDL=0 give the same tokens.
"""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
import warnings

import pytest
import torch

transformers = pytest.importorskip("transformers")

pytestmark = pytest.mark.filterwarnings("ignore:kernelforge. kernelforge.generate called with a model on cpu")

ARCHS = ["llama", "qwen2", "mistral"]
TINY = dict(vocab_size=128, hidden_size=128, intermediate_size=192, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, head_dim=64)
VARIANTS = {  # config overrides per case: one per code path of the step
    "plain": {},
    "bias_tied": dict(attention_bias=True, mlp_bias=True, tie_word_embeddings=True),  # llama only
    "llama3_rope": dict(rope_parameters=dict(rope_type="llama3", rope_theta=500000.0, factor=8.0, low_freq_factor=1.0,
                                             high_freq_factor=4.0, original_max_position_embeddings=16)),
}


def tiny_model(arch, device="cpu", dtype=torch.float32, **cfg):
    cls = {"llama": (transformers.LlamaForCausalLM, transformers.LlamaConfig),
           "qwen2": (transformers.Qwen2ForCausalLM, transformers.Qwen2Config),
           "mistral": (transformers.MistralForCausalLM, transformers.MistralConfig),
           "qwen3": (transformers.Qwen3ForCausalLM, transformers.Qwen3Config)}[arch]
    torch.manual_seed(0)
    model = cls[0](cls[1](**dict(TINY, **cfg))).to(device, dtype).eval()
    with torch.no_grad():  # biases and norm weights away from their 0 / 1 init, so that a wrong one shows
        for name, p in model.named_parameters():
            if name.endswith("bias") or "norm" in name:
                p.add_(torch.randn_like(p) * 0.1)
    return model


def prompt(batch, length, device="cpu", seed=1):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(3, TINY["vocab_size"], (batch, length), generator=g).to(device)


def hf_generate(model, ids, n):
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")
        return model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, do_sample=False)


@pytest.fixture(autouse=True)
def fused_by_default(monkeypatch):
    """These tests are about the fused step as generate's default for the models it supports."""
    monkeypatch.setattr(importlib.import_module("kernelforge.generate"), "FUSED_STEP_BY_DEFAULT", True)


@pytest.fixture
def ds():
    return importlib.import_module("kernelforge.decode_step")


@pytest.fixture
def gen():
    return importlib.import_module("kernelforge.generate")


@pytest.fixture
def fresh_warnings(monkeypatch):
    monkeypatch.delenv("KF_STRICT", raising=False)
    monkeypatch.setattr(importlib.import_module("kernelforge.patch._runtime"), "warned", set())


@pytest.fixture
def fused_calls(monkeypatch, ds):
    """How many times a DecodeStep ran."""
    calls, real = [], ds.DecodeStep.__call__

    def spy(self, *args, **kwargs):
        calls.append(self)
        return real(self, *args, **kwargs)

    monkeypatch.setattr(ds.DecodeStep, "__call__", spy)
    return calls


def _cases():
    for arch in ARCHS:
        for variant in VARIANTS:
            if variant == "bias_tied" and arch != "llama":
                continue
            yield arch, variant


# ---- CPU -------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("arch,variant", list(_cases()))
def test_greedy_equals_hf_generate(kf, fresh_warnings, fused_calls, arch, variant):
    model = tiny_model(arch, **VARIANTS[variant])
    ids = prompt(2, 7)
    want = hf_generate(model, ids, 12)
    got = kf.generate(model, ids, 12, fused_step=True)
    assert torch.equal(got, want)
    assert len(fused_calls) == 11  # every decode step after the prefill's token
    assert torch.equal(hf_generate(model, ids, 12), want)  # the fused model generates as before


def test_default_is_the_forward_until_enabled(kf, fresh_warnings, fused_calls, monkeypatch):
    """FUSED_STEP_BY_DEFAULT unset: fused_step=None runs the model's forward, with no notice; True the fused step."""
    monkeypatch.setattr(importlib.import_module("kernelforge.generate"), "FUSED_STEP_BY_DEFAULT", False)
    model = tiny_model("llama")
    ids = prompt(2, 7)
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        got = kf.generate(model, ids, 6, cuda_graph=False)
    assert torch.equal(got, hf_generate(model, ids, 6)) and not fused_calls
    assert not [x for x in w if "fused" in str(x.message)]
    assert torch.equal(kf.generate(model, ids, 6, cuda_graph=False, fused_step=True), got) and fused_calls


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_fused_rope_append_equals_hf_generate(kf, monkeypatch, arch):
    """FUSED_ROPE_APPEND: RoPE and the cache append as one rope_kv_append launch give HF's tokens too."""
    import kernelforge.decode_step as ds  # noqa: PLC0415

    monkeypatch.setattr(ds, "FUSED_ROPE_APPEND", True)
    calls = []
    real = ds._dec.rope_kv_append
    monkeypatch.setattr(ds._dec, "rope_kv_append", lambda *a, **k: calls.append(1) or real(*a, **k))
    model = tiny_model(arch)
    ids = prompt(2, 7)
    assert torch.equal(kf.generate(model, ids, 12, fused_step=True), hf_generate(model, ids, 12))
    assert calls  # the fused launch ran


@pytest.mark.parametrize("arch,variant", list(_cases()))
def test_step_logits_equal_hf_forward(ds, gen, arch, variant):
    """One step at position 9 after a 9-token prefill: logits and the appended cache rows as the HF forward
    of the same token on a static cache (float32 rounding: kernelforge's ops run the float64 reference).
    The caches are generate's (Mistral's window covers them: full StaticLayers)."""
    model = tiny_model(arch, **VARIANTS[variant])
    ids, nxt = prompt(3, 9), prompt(3, 1, seed=5)
    with torch.no_grad():
        ref = gen._new_cache(model, 16)
        model(input_ids=ids, past_key_values=ref, use_cache=True)
        want = model(input_ids=nxt, position_ids=torch.full((3, 1), 9), past_key_values=ref,
                     use_cache=True).logits[:, -1]
        step = ds.DecodeStep(model)
        assert step.fused
        cache = gen._new_cache(model, 16)
        model(input_ids=ids, past_key_values=cache, use_cache=True)
        seq_lens = torch.full((3,), 10, dtype=torch.int32)
        got = step(nxt, torch.full((3, 1), 9), seq_lens, step.caches(cache), *step.rope_table(16))
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    for a, b in zip(cache.layers, ref.layers):
        torch.testing.assert_close(a.keys, b.keys, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(a.values, b.values, atol=1e-5, rtol=1e-5)
    assert torch.equal(seq_lens, torch.full((3,), 10, dtype=torch.int32))  # read, never written by the step


@pytest.mark.parametrize("arch,variant", list(_cases()))
def test_prefill_equals_hf_forward(ds, gen, arch, variant):
    """DecodeStep.prefill of a 9-token prompt: the last position's logits and the 9 cache rows of every layer as
    the HF forward of the prompt on a static cache (float32), the rows after them untouched; then a step after
    it as after HF's prefill."""
    model = tiny_model(arch, **VARIANTS[variant])
    ids, nxt = prompt(3, 9), prompt(3, 1, seed=5)
    with torch.no_grad():
        ref = gen._new_cache(model, 16)
        want = model(input_ids=ids, past_key_values=ref, use_cache=True).logits[:, -1]
        step = ds.DecodeStep(model)
        cache = gen._new_cache(model, 16)
        cache.early_initialization(3, step.n_kv, step.head_dim, torch.float32, "cpu")
        for layer in cache.layers:  # poison: prefill must write rows 0..8 and leave the others alone
            layer.keys.fill_(float("nan"))
            layer.values.fill_(float("nan"))
        kv = step.caches(cache)
        got = step.prefill(ids, kv, *step.rope_table(16))
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
        for a, b in zip(cache.layers, ref.layers):
            torch.testing.assert_close(a.keys[:, :, :9], b.keys[:, :, :9], atol=1e-5, rtol=1e-5)
            torch.testing.assert_close(a.values[:, :, :9], b.values[:, :, :9], atol=1e-5, rtol=1e-5)
            assert a.keys[:, :, 9:].isnan().all() and a.values[:, :, 9:].isnan().all()
        seq_lens = torch.full((3,), 10, dtype=torch.int32)
        want_next = model(input_ids=nxt, position_ids=torch.full((3, 1), 9), past_key_values=ref,
                          use_cache=True).logits[:, -1]
        got_next = step(nxt, torch.full((3, 1), 9), seq_lens, kv, *step.rope_table(16))
    torch.testing.assert_close(got_next, want_next, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("arch", ARCHS)
def test_fused_prefill_equals_hf_generate(kf, monkeypatch, fresh_warnings, ds, gen, arch):
    """FUSED_PREFILL: the prompt through DecodeStep.prefill, then the fused steps, gives HF generate's tokens;
    a prompt that fills the cache but one row too; a padded batch keeps HF's masked forward."""
    monkeypatch.setattr(gen, "FUSED_PREFILL", True)
    calls, real = [], ds.DecodeStep.prefill
    monkeypatch.setattr(ds.DecodeStep, "prefill", lambda self, *a: calls.append(a[0].shape) or real(self, *a))
    model = tiny_model(arch)
    for batch, length, new in [(2, 7, 12), (1, 1, 5), (3, 30, 2)]:
        ids = prompt(batch, length)
        assert torch.equal(kf.generate(model, ids, new, fused_step=True), hf_generate(model, ids, new))
    assert calls == [(2, 7), (1, 1), (3, 30)]
    ids, mask = _left_padded()
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")
        want = model.generate(ids, attention_mask=mask, max_new_tokens=6, do_sample=False)
    assert torch.equal(kf.generate(model, ids, 6, attention_mask=mask), want)
    assert len(calls) == 3


def test_prefill_longer_than_the_cache(ds, gen):
    model = tiny_model("llama")
    step = ds.DecodeStep(model)
    cache = gen._new_cache(model, 8)
    cache.early_initialization(1, step.n_kv, step.head_dim, torch.float32, "cpu")
    with pytest.raises(ValueError, match="DecodeStep.prefill: 9 prompt tokens do not fit the cache's 8 rows"):
        step.prefill(prompt(1, 9), step.caches(cache), *step.rope_table(8))


def test_l2_prefetch_option(ds, gen):
    """l2_prefetch: bytes >= 0 (bool, negative, non-integer: ValueError); on a CPU model there is no L2 branch
    and the logits are the default step's; decode_step() builds a new step when the option changes."""
    model = tiny_model("llama")
    for bad in (-1, True, 1.5, "8"):
        with pytest.raises(ValueError, match="l2_prefetch must be a number of bytes"):
            ds.DecodeStep(model, l2_prefetch=bad)
    for bad in (1, "yes"):
        with pytest.raises(ValueError, match="l2_prefetch_kv must be True, False or None"):
            ds.DecodeStep(model, l2_prefetch_kv=bad)
    ids, nxt = prompt(2, 9), prompt(2, 1, seed=5)
    out = []
    for n in (0, 1 << 20):
        with torch.no_grad():
            step = ds.DecodeStep(model, l2_prefetch=n, l2_prefetch_kv=n > 0)
            assert step.l2_prefetch == n and step.l2_prefetch_kv == (n > 0) and step._side is None
            cache = gen._new_cache(model, 16)
            model(input_ids=ids, past_key_values=cache, use_cache=True)
            out.append(step(nxt, torch.full((2, 1), 9), torch.full((2,), 10, dtype=torch.int32), step.caches(cache),
                            *step.rope_table(16)))
    assert torch.equal(out[0], out[1])
    assert len(step._ws) == 1 and next(iter(step._ws.values())).numel() == 0  # the CPU reference needs none
    a = ds.decode_step(model)
    assert ds.decode_step(model) is a and a.l2_prefetch == ds.L2_PREFETCH_BYTES
    b = ds.decode_step(model, l2_prefetch=4096)
    assert b is not a and b.l2_prefetch == 4096 and ds.decode_step(model, l2_prefetch=4096) is b
    c = ds.decode_step(model, l2_prefetch=4096, l2_prefetch_kv=True)
    assert c is not b and c.l2_prefetch_kv and ds.decode_step(model, l2_prefetch=4096, l2_prefetch_kv=True) is c


@pytest.mark.parametrize("arch", ARCHS)
def test_fusion_keeps_the_model(ds, tmp_path, arch):
    """q/k/v and gate/up become views of one buffer each, in order; the parameters keep their values, the
    model its outputs (bit for bit) and its memory; a second step reuses the buffers; the model saves
    and loads."""
    model = tiny_model(arch, attention_bias=True) if arch == "llama" else tiny_model(arch)
    ids = prompt(2, 11)
    with torch.no_grad():
        before_out = model(ids).logits
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    storage = sum(p.nbytes for p in model.parameters())
    step = ds.DecodeStep(model)
    for n, p in model.named_parameters():
        assert torch.equal(p, before[n]), n
    with torch.no_grad():
        assert torch.equal(model(ids).logits, before_out)
    unique = {p.untyped_storage().data_ptr(): p.untyped_storage().nbytes() for p in model.parameters()}
    assert sum(unique.values()) == storage  # the fused buffers replace the parts: no copy kept
    for layer, lay in zip(model.model.layers, step.layers):
        a, m = layer.self_attn, layer.mlp
        W, b = lay.qkv
        assert a.q_proj.weight.data_ptr() == W.data_ptr() and W.shape[0] == sum(
            p.weight.shape[0] for p in (a.q_proj, a.k_proj, a.v_proj))
        assert a.v_proj.weight.data_ptr() == W[-a.v_proj.weight.shape[0]:].data_ptr()
        assert (b is None) == (a.q_proj.bias is None)
        if b is not None:
            assert a.k_proj.bias.data_ptr() == b[a.q_proj.bias.shape[0]:].data_ptr()
        assert m.up_proj.weight.data_ptr() == lay.gate_up[0][m.gate_proj.weight.shape[0]:].data_ptr()
    ptrs = [p.data_ptr() for p in model.parameters()]
    again = ds.DecodeStep(model)  # already adjacent: views, nothing copied
    assert [p.data_ptr() for p in model.parameters()] == ptrs
    assert again.layers[0].qkv[0].data_ptr() == step.layers[0].qkv[0].data_ptr()
    model.save_pretrained(tmp_path)
    loaded = type(model).from_pretrained(tmp_path).eval()
    for (n, p), q in zip(model.named_parameters(), loaded.parameters()):
        assert torch.equal(p, q), n


def test_fuse_linears_refuses_mixed_parts(ds):
    """Parts that cannot share a buffer are left alone (the step then runs separate GEMMs)."""
    with_bias, without = torch.nn.Linear(8, 4), torch.nn.Linear(8, 4, bias=False)
    ptr = with_bias.weight.data_ptr()
    assert ds.fuse_linears([with_bias, without]) is None
    assert with_bias.weight.data_ptr() == ptr
    half = torch.nn.Linear(8, 4).half()
    assert ds.fuse_linears([torch.nn.Linear(8, 4), half]) is None
    assert ds.fuse_linears([torch.nn.Linear(8, 4), torch.nn.Linear(6, 4)]) is None
    W, b = ds.fuse_linears([torch.nn.Linear(8, 4), torch.nn.Linear(8, 2)])
    assert W.shape == (6, 8) and b.shape == (6,)


def test_separate_gemms(kf, fresh_warnings, ds):
    """fuse=False (what unfusable parts run): separate q / k / v and gate / up GEMMs, swiglu; the model is
    not changed; kernelforge.linear for the projections too (a DecodeStep passed as fused_step)."""
    model = tiny_model("qwen2")
    ids = prompt(2, 7)
    want = hf_generate(model, ids, 10)
    ptrs = [p.data_ptr() for p in model.parameters()]
    step = ds.DecodeStep(model, fuse=False, proj_linear=kf.linear)
    assert not step.fused and [p.data_ptr() for p in model.parameters()] == ptrs
    assert torch.equal(kf.generate(model, ids, 10, fused_step=step), want)
    other = tiny_model("qwen2")
    with pytest.raises(ValueError, match="DecodeStep built from this model"):
        kf.generate(other, ids, 3, fused_step=step)


def test_weights_changed(kf, fresh_warnings, ds):
    """A weight changed in place is seen by the step (the fused buffer is the parameter's storage); a
    replaced parameter rebuilds the step (fused again), as does a replaced buffer."""
    model = tiny_model("llama")
    ids = prompt(2, 7)
    kf.generate(model, ids, 4)
    with torch.no_grad():
        model.model.layers[1].self_attn.k_proj.weight.mul_(-1.5)
        model.model.layers[0].mlp.up_proj.weight.mul_(2.0)
    assert torch.equal(kf.generate(model, ids, 10), hf_generate(model, ids, 10))
    old = ds._STEPS[model]
    q = model.model.layers[0].self_attn.q_proj
    q.weight = torch.nn.Parameter(torch.randn_like(q.weight) * 0.2)
    assert torch.equal(kf.generate(model, ids, 10), hf_generate(model, ids, 10))
    new = ds._STEPS[model]
    assert new is not old and new.fused
    assert q.weight.data_ptr() == new.layers[0].qkv[0].data_ptr()


def test_unsupported_reasons(ds):
    assert ds.unsupported_reason(tiny_model("llama")) is None
    cases = [
        (tiny_model("qwen3"), "Qwen3ForCausalLM"),
        (tiny_model("llama", hidden_act="gelu"), "hidden_act='gelu'"),
        (tiny_model("llama", head_dim=32), "head dim 32"),
        (tiny_model("llama", rope_parameters=dict(rope_type="dynamic", rope_theta=10000.0, factor=2.0)),
         "rope_type 'dynamic'"),
        (_mixed_dtypes(), "several dtypes"),
    ]
    for model, match in cases:
        why = ds.unsupported_reason(model)
        assert why is not None and match in why, (match, why)
    mistral = tiny_model("mistral", sliding_window=12)
    assert ds.unsupported_reason(mistral, 12) is None
    assert "sliding window of 12" in ds.unsupported_reason(mistral, 13)
    hooked = tiny_model("llama")
    hooked.model.layers[0].mlp.register_forward_hook(lambda *a: None)
    assert "forward hooks" in ds.unsupported_reason(hooked)
    sub = type("MyLlama", (transformers.LlamaForCausalLM,), {})(tiny_model("llama").config)
    assert "MyLlama" in ds.unsupported_reason(sub)
    with pytest.raises(ValueError, match="not supported: a Qwen3ForCausalLM"):
        ds.DecodeStep(tiny_model("qwen3"))


def _mixed_dtypes():
    model = tiny_model("llama")
    model.model.norm.weight.data = model.model.norm.weight.data.double()
    return model


def test_unsupported_falls_back_announced(kf, fresh_warnings, fused_calls, monkeypatch):
    """A model the step does not take runs the model's forward: announced once, tokens as HF's;
    fused_step=True is an error, fused_step=False silent, KF_STRICT=1 makes the announcement an error."""
    model = tiny_model("qwen3")
    ids = prompt(2, 7)
    want = hf_generate(model, ids, 8)
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        got = kf.generate(model, ids, 8)
        kf.generate(model, ids, 8)
        kf.generate(model, ids, 8, fused_step=False)
    msgs = [str(x.message) for x in w if "Qwen3ForCausalLM" in str(x.message)]
    assert len(msgs) == 1 and "the model's forward of one token" in msgs[0]
    assert torch.equal(got, want) and not fused_calls
    with pytest.raises(ValueError, match="fused_step=True needs a model"):
        kf.generate(model, ids, 8, fused_step=True)
    with pytest.raises(TypeError, match="fused_step must be None, a bool or a DecodeStep"):
        kf.generate(model, ids, 8, fused_step="yes")
    monkeypatch.setenv("KF_STRICT", "1")
    with pytest.raises(RuntimeError, match="KF_STRICT"):
        kf.generate(model, ids, 8, cuda_graph=False)
    assert torch.equal(kf.generate(model, ids, 8, cuda_graph=False, fused_step=False), want)
    supported = tiny_model("llama")  # strict and supported: nothing to announce (no graph asked on CPU)
    assert torch.equal(kf.generate(supported, ids, 8, cuda_graph=False), hf_generate(supported, ids, 8))


def test_sliding_window_shorter_than_the_cache_runs_the_forward(kf, fresh_warnings, fused_calls):
    model = tiny_model("mistral", sliding_window=5)
    ids = prompt(2, 7)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        got = kf.generate(model, ids, 8)
    assert torch.equal(got, hf_generate(model, ids, 8)) and not fused_calls


def _left_padded(batch=3, length=9, device="cpu"):
    """A left-padded batch: row 0 four pads, row 1 none, row 2 one; pads hold token 0 (the pad id)."""
    ids = prompt(batch, length, device)
    mask = torch.ones_like(ids)
    mask[0, :4] = 0
    mask[2, :1] = 0
    return ids.masked_fill(mask == 0, 0), mask


@pytest.mark.parametrize("arch", ARCHS)
def test_left_padded_batch_equals_hf_generate(kf, arch):
    """attention_mask with left padding: HF's prefill (its mask, positions from each row's first token),
    then the fused step with the pads skipped by decode_attention's key_starts; greedy tokens equal HF
    generate's with the same mask, pads included in the output."""
    model = tiny_model(arch)
    model.generation_config.pad_token_id = 0
    ids, mask = _left_padded()
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")
        want = model.generate(ids, attention_mask=mask, max_new_tokens=10, do_sample=False)
    assert torch.equal(kf.generate(model, ids, 10, attention_mask=mask, cuda_graph=False), want)
    # an all-ones mask is no padding: the unpadded loop
    assert torch.equal(kf.generate(model, ids[1:2], 6, attention_mask=mask[1:2], cuda_graph=False),
                       hf_generate(model, ids[1:2], 6))


def test_left_padded_batch_errors(kf):
    model = tiny_model("llama")
    ids, mask = _left_padded()
    with pytest.raises(ValueError, match="only left padding"):
        kf.generate(model, ids, 2, attention_mask=mask.flip(1), cuda_graph=False)
    with pytest.raises(ValueError, match="holds no token"):
        kf.generate(model, ids, 2, attention_mask=torch.zeros_like(mask).index_fill(0, torch.tensor([1]), 1),
                    cuda_graph=False)
    with pytest.raises(ValueError, match=r"attention_mask must be an int or bool tensor of input_ids' shape \[3, 9\]"):
        kf.generate(model, ids, 2, attention_mask=mask[:, 1:], cuda_graph=False)
    with pytest.raises(ValueError, match="0 \\(pad\\) and 1 \\(token\\) only"):
        kf.generate(model, ids, 2, attention_mask=mask * 2, cuda_graph=False)
    with pytest.raises(ValueError, match="fused_step=False runs the model's forward"):
        kf.generate(model, ids, 2, attention_mask=mask, cuda_graph=False, fused_step=False)
    with pytest.raises(ValueError, match="needs the fused decode step"):
        kf.generate(tiny_model("qwen3"), ids, 2, attention_mask=mask, cuda_graph=False)


# ---- CUDA --------------------------------------------------------------------------------------------------------


def _first_difference_is_a_near_tie(model, a, b, prompt_len):
    """a, b int64 [B, S + n] from two generate calls: per row, the first new token where they differ must
    be one whose two best logits (the model's forward of the common prefix) are within bf16 noise."""
    for row in range(a.shape[0]):
        diff = (a[row, prompt_len:] != b[row, prompt_len:]).nonzero()
        if diff.numel() == 0:
            continue
        i = prompt_len + int(diff[0])
        with torch.no_grad():
            top2 = model(a[row:row + 1, :i]).logits[0, -1].float().topk(2).values
        gap = float(top2[0] - top2[1])
        assert gap <= 0.05 * max(abs(float(top2[0])), 1.0), (row, i, gap, top2)


@pytest.mark.cuda
@pytest.mark.parametrize("arch", ARCHS)
def test_cuda_bf16_tokens_as_the_forward_step(kf, gen, fused_calls, arch):
    """bf16, 32 new tokens: the fused step's greedy tokens equal the model-forward step's (both
    kernelforge.generate) up to a first difference at a near tie; the graph replays the eager fused loop
    bit for bit, and a second call replays the same graph."""
    model = tiny_model(arch, "cuda", torch.bfloat16, num_hidden_layers=4)
    ids = prompt(2, 24, "cuda")
    unfused = kf.generate(model, ids, 32, ignore_eos=True, fused_step=False)
    fused = kf.generate(model, ids, 32, ignore_eos=True)
    loop = gen._GRAPHS[model][(2, 56, False)]
    assert loop.fused is not None and loop.graph is not None and loop.fused.fused
    assert len(fused_calls) == 2  # the warm-up step and the capture; the other 30 steps are replays
    _first_difference_is_a_near_tie(model, unfused, fused, 24)
    assert torch.equal(fused, kf.generate(model, ids, 32, ignore_eos=True, cuda_graph=False))
    graph = loop.graph
    ids2 = prompt(2, 24, "cuda", seed=3)
    again = kf.generate(model, ids2, 32, ignore_eos=True)
    assert gen._GRAPHS[model][(2, 56, False)] is loop and loop.graph is graph
    assert torch.equal(again, kf.generate(model, ids2, 32, ignore_eos=True, cuda_graph=False))


@pytest.mark.cuda
@pytest.mark.parametrize("arch", ARCHS)
def test_cuda_bf16_fused_prefill(kf, monkeypatch, gen, ds, arch):
    """bf16: DecodeStep.prefill's logits as the HF forward's of the same prompt within bf16 rounding, and
    generate with FUSED_PREFILL gives the forward prefill's tokens up to a first difference at a near tie;
    a second call replays the same graph after its prefill."""
    model = tiny_model(arch, "cuda", torch.bfloat16, num_hidden_layers=4)
    ids = prompt(2, 40, "cuda")
    step = ds.decode_step(model)
    with torch.no_grad():
        want = model(input_ids=ids, past_key_values=gen._new_cache(model, 48), use_cache=True).logits[:, -1].float()
        cache = gen._new_cache(model, 48)
        cache.early_initialization(2, step.n_kv, step.head_dim, torch.bfloat16, "cuda")
        got = step.prefill(ids, step.caches(cache), *step.rope_table(48)).float()
    torch.testing.assert_close(got, want, atol=0.06 * want.abs().max().item(), rtol=0.05)
    base = kf.generate(model, ids, 24, ignore_eos=True)
    monkeypatch.setattr(gen, "FUSED_PREFILL", True)
    fused = kf.generate(model, ids, 24, ignore_eos=True)
    _first_difference_is_a_near_tie(model, base, fused, 40)
    loop = gen._GRAPHS[model][(2, 64, False)]
    graph = loop.graph
    assert torch.equal(kf.generate(model, ids, 24, ignore_eos=True), fused) and loop.graph is graph


@pytest.mark.cuda
@pytest.mark.parametrize("budget,kv", [(4096, False), (1 << 20, False), (1 << 30, False), (0, True), (1 << 20, True)])
def test_cuda_l2_prefetch_same_tokens(kf, gen, ds, monkeypatch, budget, kv):
    """The L2 prefetch branch changes no result: bf16 greedy tokens with l2_prefetch (and l2_prefetch_kv)
    equal the step's without, in a CUDA graph (the branch forked and joined inside the capture) and without;
    each layer asks for its K and V cache first (kv), then min(budget, its o and gate/up bytes), W_o first."""
    model = tiny_model("llama", "cuda", torch.bfloat16, num_hidden_layers=3)
    ids = prompt(2, 24, "cuda")
    want = kf.generate(model, ids, 16, ignore_eos=True, fused_step=ds.DecodeStep(model))
    calls = []
    real = ds._dec.prefetch_l2
    monkeypatch.setattr(ds._dec, "prefetch_l2",
                        lambda t, n=None: calls.append((t.data_ptr(), n)) or real(t, n))
    step = ds.DecodeStep(model, l2_prefetch=budget, l2_prefetch_kv=kv)
    assert step._side is not None
    got = kf.generate(model, ids, 16, ignore_eos=True, fused_step=step)
    assert torch.equal(got, want)
    loop = gen._GRAPHS[model][(2, 40, False)]
    assert loop.fused is step
    (ws,) = step._ws.values()  # one decode_attention workspace for every layer and step, made by the warm-up
    assert ws.numel() <= 256 or not ws[:256].any()
    lay = step.layers[0]
    w_o, w_gu = lay.w_o, lay.gate_up[0]
    n_o = min(budget, w_o.numel() * w_o.element_size())
    n_gu = min(budget - n_o, w_gu.numel() * w_gu.element_size())
    per_layer = [(w_o.data_ptr(), n_o)] if n_o > 0 else []
    per_layer += [(w_gu.data_ptr(), n_gu)] if n_gu > 0 else []
    if kv:
        K, V = loop.kv[0]
        per_layer = [(K.data_ptr(), None), (V.data_ptr(), None)] + per_layer
    assert calls[:len(per_layer)] == per_layer
    assert len(calls) == 2 * 3 * len(per_layer)  # the warm-up step and the capture, 3 layers each
    calls.clear()
    assert torch.equal(kf.generate(model, ids, 16, ignore_eos=True, cuda_graph=False, fused_step=step), want)
    assert len(calls) == 15 * 3 * len(per_layer)  # eager: every step after the prefill's token


@pytest.mark.cuda
def test_cuda_graph_sees_weight_changes(kf, gen):
    """In place: the same graph replays the new values (its buffers are the parameters' storage); a
    replaced parameter: a new step and a new graph."""
    model = tiny_model("llama", "cuda", torch.bfloat16)
    ids = prompt(1, 9, "cuda")
    kf.generate(model, ids, 8, ignore_eos=True)
    loop = gen._GRAPHS[model][(1, 17, False)]
    with torch.no_grad():
        model.model.layers[0].mlp.gate_proj.weight.mul_(-1.0)
    got = kf.generate(model, ids, 8, ignore_eos=True)
    assert gen._GRAPHS[model][(1, 17, False)] is loop
    assert torch.equal(got, kf.generate(model, ids, 8, ignore_eos=True, cuda_graph=False))
    v = model.model.layers[1].self_attn.v_proj
    v.weight = torch.nn.Parameter(v.weight.detach().clone().mul_(0.5))
    got = kf.generate(model, ids, 8, ignore_eos=True)
    assert gen._GRAPHS[model][(1, 17, False)] is not loop
    assert torch.equal(got, kf.generate(model, ids, 8, ignore_eos=True, cuda_graph=False))


@pytest.mark.cuda
def test_cuda_float32_falls_back(kf, fresh_warnings):
    """CUDA float32 (decode_attention takes 16-bit types there): the model's forward, announced."""
    model = tiny_model("llama", "cuda", torch.float32)
    ids = prompt(2, 7, "cuda")
    with pytest.warns(UserWarning, match="float32 CUDA parameters"):
        got = kf.generate(model, ids, 6)
    assert torch.equal(got, hf_generate(model, ids, 6))


@pytest.mark.cuda
def test_cuda_left_padded_batch_graph(kf):
    """bf16 left-padded batch: the captured graph replays the eager fused loop bit for bit, and a padded
    call after an unpadded one of the same shapes takes its own graph."""
    model = tiny_model("llama", "cuda", torch.bfloat16, num_hidden_layers=4)
    model.generation_config.pad_token_id = 0
    ids, mask = _left_padded(device="cuda")
    eager = kf.generate(model, ids, 24, ignore_eos=True, attention_mask=mask, cuda_graph=False)
    assert torch.equal(kf.generate(model, ids, 24, ignore_eos=True, attention_mask=mask), eager)
    kf.generate(model, ids, 24, ignore_eos=True)
    assert torch.equal(kf.generate(model, ids, 24, ignore_eos=True, attention_mask=mask), eager)


_PDL_CHILD = """
import sys
import torch, kernelforge as kf, kernelforge.decode_step as ds
sys.path.insert(0, {here!r})
from test_decode_step import tiny_model, prompt
out = []
for batch, layers in ((1, 4), (2, 2)):
    model = tiny_model("llama", "cuda", torch.bfloat16, num_hidden_layers=layers)
    ids = prompt(batch, 24, "cuda")
    out.append(kf.generate(model, ids, 24, ignore_eos=True, fused_step=True))
    step = ds.decode_step(model, proj_linear=kf.linear)  # the projections on the skinny linear kernels too
    out.append(kf.generate(model, ids, 24, ignore_eos=True, fused_step=step))
    out.append(kf.generate(model, ids, 24, ignore_eos=True, fused_step=step, cuda_graph=False))
print(repr([t.tolist() for t in out]))
"""


@pytest.mark.cuda
def test_cuda_pdl_switch_same_tokens():
    """KF_PDL=1 and KF_PDL=0 (programmatic dependent launch of the kernels, read once per process: one
    process each): the fused step's greedy tokens are the same, with its default projections and with
    kernelforge.linear ones, in a CUDA graph and without."""
    code = _PDL_CHILD.format(here=os.path.dirname(os.path.abspath(__file__)))
    tokens = {}
    for pdl in ("1", "0"):
        env = {**os.environ, "KF_PDL": pdl, "PYTHONPATH": os.pathsep.join(sys.path)}
        r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=600)
        assert r.returncode == 0, r.stdout + r.stderr
        tokens[pdl] = r.stdout.strip().splitlines()[-1]
    assert tokens["1"] == tokens["0"]
