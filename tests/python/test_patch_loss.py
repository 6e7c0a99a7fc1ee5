"""patch(model, loss=True) on tiny random transformers causal LMs (Llama, Mistral, Qwen2, Qwen3, Gemma-2):
called with labels, the patched model computes ForCausalLMLoss with kernelforge.fused_linear_cross_entropy
from the hidden states. Loss and every parameter gradient (lm_head, tied embeddings, bias) agree with the
unpatched model; the ForCausalLMLoss details (-100, all ignored, num_items_in_batch, shift_labels,
logits_to_keep, return_dict=False) behave as the original; logits are not materialized unless asked for;
a few AdamW steps follow the unpatched loss curve. Only the loss family is patched here (LOSS_ONLY), so
the rest of the model computes exactly what the original does.
"""

from __future__ import annotations

import copy
import importlib
import warnings

import pytest
import torch

from test_patch_models import MODEL_TOL, _check_pair, rel_err

transformers = pytest.importorskip("transformers")

LOSS_ONLY = {"norms": False, "activations": False, "rope": False, "moe": False}
OP = "kernelforge.fused_linear_cross_entropy"

CASES = [
    pytest.param("cpu", torch.float32, id="cpu-float32"),
    pytest.param("cuda", torch.bfloat16, id="cuda-bfloat16", marks=pytest.mark.cuda),
    pytest.param("cuda", torch.float32, id="cuda-float32", marks=pytest.mark.cuda),
]

COMMON = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, max_position_embeddings=128, attn_implementation="eager")

# (vocab, tied embeddings) per architecture: an even and an odd vocab, tied and untied lm_head
ARCH = {"llama": (1000, False), "mistral": (1031, False), "qwen2": (1000, True), "qwen3": (1031, True)}


def _model(arch: str, device, dtype, vocab: int | None = None, tie: bool | None = None, **extra):
    v, t = ARCH.get(arch, (1000, False))
    cfg = dict(COMMON, vocab_size=vocab or v, tie_word_embeddings=t if tie is None else tie, **extra)
    tf = transformers
    if arch == "llama":
        model = tf.LlamaForCausalLM(tf.LlamaConfig(**cfg))
    elif arch == "mistral":
        model = tf.MistralForCausalLM(tf.MistralConfig(**cfg))
    elif arch == "qwen2":
        model = tf.Qwen2ForCausalLM(tf.Qwen2Config(**cfg))
    elif arch == "qwen3":
        model = tf.Qwen3ForCausalLM(tf.Qwen3Config(head_dim=16, **cfg))
    elif arch == "gemma2":
        model = tf.Gemma2ForCausalLM(tf.Gemma2Config(head_dim=16, **cfg))
    else:
        raise ValueError(arch)
    if cfg["tie_word_embeddings"]:
        assert model.lm_head.weight is model.model.embed_tokens.weight
    else:
        assert model.lm_head.weight is not model.model.embed_tokens.weight
    return model.to(device=device, dtype=dtype)


def _batch(model, device, b=2, s=24, seed=1):
    g = torch.Generator().manual_seed(seed)
    v = model.config.vocab_size
    ids = torch.randint(0, v, (b, s), generator=g)
    labels = ids.clone()
    labels[torch.rand(b, s, generator=g) < 0.2] = -100
    labels[0, :5] = -100  # a masked prompt
    return ids.to(device), labels.to(device)


def _loss_grads(model, call):
    model.zero_grad(set_to_none=True)
    out = call(model)
    out.loss.backward()
    grads = {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}
    return out, out.loss.detach(), grads


def _compare(kf, model, call, dtype, **patch_kwargs):
    """Loss and gradients of every parameter: patched vs unpatched (bf16: both vs a float32 run of the same
    weights, as test_patch_models.check_model). Leaves the model patched; returns (report, original output,
    patched output)."""
    truth, truth_grads = None, {}
    if dtype != torch.float32:
        ref = copy.deepcopy(model).float()
        _, truth, truth_grads = _loss_grads(ref, call)
        del ref
    out0, loss0, grads0 = _loss_grads(model, call)
    report = kf.patch(model, **LOSS_ONLY, **patch_kwargs, attention=False)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no runtime fallback may happen
        out1, loss1, grads1 = _loss_grads(model, call)
    assert loss1.dtype == loss0.dtype == torch.float32 and loss1.shape == loss0.shape == ()
    _check_pair("loss", loss1, loss0, truth, dtype)
    assert grads1.keys() == grads0.keys()
    for name in grads0:
        _check_pair(f"grad {name}", grads1[name], grads0[name], truth_grads.get(name), dtype)
    return report, out0, out1


def _assert_report(report, model):
    name = type(model).__name__
    assert report.patched_paths == [""], str(report)
    assert report.patched[0].op == OP and report.patched[0].cls == name
    assert f"transformers.{name} -> {OP}" in str(report)


# ---- patched vs unpatched: loss and gradients ------------------------------------------------------------


@pytest.mark.parametrize("device,dtype", CASES)
@pytest.mark.parametrize("arch", ["llama", "mistral", "qwen2", "qwen3"])
def test_loss_and_grads_match(kf, arch, device, dtype):
    model = _model(arch, device, dtype)
    ids, labels = _batch(model, device)
    report, out0, out1 = _compare(kf, model, lambda m: m(input_ids=ids, labels=labels), dtype)
    _assert_report(report, model)
    assert out1.logits is None and out0.logits is not None
    assert out1.past_key_values is not None  # the inner model's outputs are passed through
    if model.config.tie_word_embeddings:
        assert model.lm_head.weight.grad is model.model.embed_tokens.weight.grad  # one tied parameter
    assert kf.unpatch(model) == 1
    assert "forward" not in model.__dict__ and "_kf_patch" not in model.__dict__


@pytest.mark.parametrize("device,dtype", CASES)
def test_lm_head_bias(kf, device, dtype):
    model = _model("llama", device, dtype)
    v = model.config.vocab_size
    model.lm_head.bias = torch.nn.Parameter(torch.randn(v, device=device, dtype=dtype) * 0.5)
    ids, labels = _batch(model, device)
    _compare(kf, model, lambda m: m(input_ids=ids, labels=labels), dtype)
    assert model.lm_head.bias.grad is not None and model.lm_head.bias.grad.abs().sum() > 0
    kf.unpatch(model)


@pytest.mark.parametrize("device,dtype", CASES)
def test_gemma2_softcap(kf, device, dtype):
    """final_logit_softcapping reaches the op as softcap= (a small cap, so it matters on random weights)."""
    model = _model("gemma2", device, dtype, final_logit_softcapping=0.5)
    ids, labels = _batch(model, device)
    report, _, _ = _compare(kf, model, lambda m: m(input_ids=ids, labels=labels), dtype)
    _assert_report(report, model)
    loss_capped = model(input_ids=ids, labels=labels).loss
    model.config.final_logit_softcapping = None  # read at call time, as the original does
    loss_plain = model(input_ids=ids, labels=labels).loss
    assert abs(loss_capped.item() - loss_plain.item()) > 1e-3
    kf.unpatch(model)
    want_plain = model(input_ids=ids, labels=labels).loss
    _check_pair("loss without softcap", loss_plain.detach(), want_plain.detach(), None, torch.float32
                if dtype == torch.float32 else torch.bfloat16)


# ---- ForCausalLMLoss semantics ------------------------------------------------------------------------------


@pytest.mark.parametrize("device,dtype", CASES)
def test_all_labels_ignored(kf, device, dtype):
    """Every label -100: the mean is 0/0 = NaN, as the original; with num_items_in_batch, 0 / n = 0."""
    model = _model("llama", device, dtype)
    ids, _ = _batch(model, device)
    labels = torch.full_like(ids, -100)
    want = model(input_ids=ids, labels=labels).loss
    want_sum = model(input_ids=ids, labels=labels, num_items_in_batch=torch.tensor(5)).loss
    kf.patch(model, **LOSS_ONLY, attention=False)
    got = model(input_ids=ids, labels=labels).loss
    got_sum = model(input_ids=ids, labels=labels, num_items_in_batch=torch.tensor(5)).loss
    assert want.isnan() and got.isnan() and got.dtype == torch.float32
    assert want_sum.item() == got_sum.item() == 0.0
    got_sum.backward()  # finite zero gradients
    assert all(p.grad is None or p.grad.isfinite().all() for p in model.parameters())
    kf.unpatch(model)


@pytest.mark.parametrize("num_items", ["tensor", "int"])
@pytest.mark.parametrize("device,dtype", CASES)
def test_num_items_in_batch(kf, device, dtype, num_items):
    """num_items_in_batch: reduction "sum" divided by it (a CPU tensor is moved to the loss's device)."""
    model = _model("qwen2", device, dtype)
    ids, labels = _batch(model, device)
    n = torch.tensor(37) if num_items == "tensor" else 37  # e.g. tokens of the whole gradient-accumulation batch
    _, out0, out1 = _compare(kf, model, lambda m: m(input_ids=ids, labels=labels, num_items_in_batch=n), dtype)
    mean = model(input_ids=ids, labels=labels).loss
    valid = (labels[:, 1:] != -100).sum().item()
    torch.testing.assert_close(out1.loss.detach() * 37 / valid, mean.detach(), rtol=1e-5, atol=1e-5)
    kf.unpatch(model)


@pytest.mark.parametrize("device,dtype", CASES)
def test_shift_labels(kf, device, dtype):
    """A precomputed shift_labels is used as it is (labels only switch the loss on)."""
    model = _model("mistral", device, dtype)
    ids, labels = _batch(model, device)
    shift = torch.randint(0, model.config.vocab_size, ids.shape, device=device)
    shift[:, ::3] = -100
    _, out0, out1 = _compare(kf, model, lambda m: m(input_ids=ids, labels=labels, shift_labels=shift), dtype)
    # differs from the loss of the shifted labels
    assert abs(out1.loss.item() - model(input_ids=ids, labels=labels).loss.item()) > 1e-3
    kf.unpatch(model)


@pytest.mark.parametrize("device,dtype", CASES)
def test_ignore_index_kwarg(kf, device, dtype):
    model = _model("llama", device, dtype)
    ids, labels = _batch(model, device)
    labels = torch.where(labels == -100, torch.full_like(labels, 7), labels)
    _compare(kf, model, lambda m: m(input_ids=ids, labels=labels, ignore_index=7), dtype)
    kf.unpatch(model)


@pytest.mark.parametrize("device,dtype", CASES[:2])
def test_logits_to_keep(kf, device, dtype):
    """logits_to_keep != 0 with labels: the loss of the kept positions, as the original (which needs targets
    of that many positions: shift_labels); with full-length labels both raise F.cross_entropy's ValueError."""
    model = _model("llama", device, dtype)
    ids, labels = _batch(model, device)
    shift = labels[:, -6:].clone()
    _compare(kf, model, lambda m: m(input_ids=ids, labels=labels, shift_labels=shift, logits_to_keep=6), dtype)
    with pytest.raises(ValueError, match="batch_size"):
        model(input_ids=ids, labels=labels, logits_to_keep=6)
    kf.unpatch(model)
    with pytest.raises(ValueError, match="batch_size"):
        model(input_ids=ids, labels=labels, logits_to_keep=6)


def test_return_dict_false(kf):
    """can_return_tuple as the original: a tuple (to_tuple drops the None logits: (loss, past_key_values))."""
    model = _model("llama", "cpu", torch.float32)
    ids, labels = _batch(model, "cpu")
    want = model(input_ids=ids, labels=labels, return_dict=False)
    kf.patch(model, **LOSS_ONLY, attention=False)
    got = model(input_ids=ids, labels=labels, return_dict=False)
    assert isinstance(got, tuple) and len(got) == len(want) - 1
    torch.testing.assert_close(got[0], want[0], rtol=1e-5, atol=1e-5)
    kf.unpatch(model)


# ---- logits ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("device,dtype", CASES)
def test_labels_none_runs_the_original(kf, device, dtype):
    model = _model("qwen3", device, dtype)
    ids, _ = _batch(model, device)
    with torch.no_grad():
        want = model(input_ids=ids)
        want_kept = model(input_ids=ids, logits_to_keep=1)
        report = kf.patch(model, **LOSS_ONLY, attention=False)
        _assert_report(report, model)
        got = model(input_ids=ids)
        got_kept = model(input_ids=ids, logits_to_keep=1)
    assert type(got) is type(want) and got.loss is None
    assert torch.equal(got.logits, want.logits)
    assert torch.equal(got_kept.logits, want_kept.logits)
    kf.unpatch(model)


@pytest.mark.parametrize("device,dtype", CASES)
def test_logits_with_loss(kf, device, dtype):
    """patch(model, logits_with_loss=True): the logits are computed (the original's lm_head call) and returned
    next to the fused loss."""
    model = _model("llama", device, dtype)
    ids, labels = _batch(model, device)
    _, out0, out1 = _compare(kf, model, lambda m: m(input_ids=ids, labels=labels), dtype, logits_with_loss=True)
    assert out1.logits is not None and torch.equal(out1.logits, out0.logits)
    assert model.__dict__["_kf_patch"].options == {"logits_with_loss": True}
    kf.unpatch(model)


@pytest.mark.cuda
def test_logits_not_materialized_cuda(kf):
    """The patched loss's forward + backward never holds a [tokens, vocab] float32 buffer: its peak is well
    below one (the unpatched model holds several: logits, their float32 copy, log-softmax, gradients)."""
    device = "cuda"
    model = _model("llama", device, torch.bfloat16, vocab=32768)
    model.config._attn_implementation = "sdpa"
    b, s = 4, 2048
    ids = torch.randint(0, 32768, (b, s), device=device)
    labels = ids.clone()
    buffer = b * s * 32768 * 4  # bytes of [tokens, vocab] float32 logits: 1 GiB

    def peak(m):
        m.zero_grad(set_to_none=True)
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        out = m(input_ids=ids, labels=labels)
        out.loss.backward()
        torch.cuda.synchronize()
        return torch.cuda.max_memory_allocated() - base, out

    unpatched, _ = peak(model)
    kf.patch(model, **LOSS_ONLY, attention=False)
    patched, out = peak(model)
    kf.unpatch(model)
    print(f"peak extra memory: unpatched {unpatched / 2**20:.0f} MiB, patched {patched / 2**20:.0f} MiB, "
          f"[T, V] float32 {buffer / 2**20:.0f} MiB")
    assert out.logits is None
    assert unpatched > buffer  # the yardstick: the original does materialize it
    assert patched < buffer / 4


# ---- the report, unpatch, what is not patched, runtime fallback -----------------------------------------------


def test_unpatch_restores(kf):
    model = _model("llama", "cpu", torch.float32)
    ids, labels = _batch(model, "cpu")
    with torch.no_grad():
        want = model(input_ids=ids, labels=labels)
        report = kf.patch(model, attention=False)  # all families
        assert "" in report.patched_paths
        assert kf.patch(model, **LOSS_ONLY, attention=False).patched == []  # patching twice is patching once
        assert kf.unpatch(model) == len(report.patched)
        for name, m in model.named_modules():
            assert "forward" not in m.__dict__ and "_kf_patch" not in m.__dict__, name
        got = model(input_ids=ids, labels=labels)
    assert torch.equal(got.loss, want.loss) and torch.equal(got.logits, want.logits)


def test_loss_flag_off(kf):
    model = _model("llama", "cpu", torch.float32)
    report = kf.patch(model, loss=False, attention=False)
    assert "" not in report.patched_paths and report.patched
    assert not any(p.op == OP for p in report.patched)
    kf.unpatch(model)


def test_not_a_causal_lm(kf):
    """Models without the causal-LM head are not touched (nor reported) by the loss family; causal LMs with
    another forward or loss are reported as skipped, with the reason."""
    cfg = transformers.LlamaConfig(vocab_size=1000, **COMMON)
    for model in (transformers.LlamaModel(cfg), transformers.LlamaForSequenceClassification(cfg)):
        report = kf.patch(model, **LOSS_ONLY, attention=False)
        assert report.patched == [] and report.skipped == [], str(report)
    mixtral = transformers.MixtralForCausalLM(transformers.MixtralConfig(vocab_size=1000, num_local_experts=2,
                                                                         **COMMON))
    report = kf.patch(mixtral, **LOSS_ONLY, attention=False)
    assert report.patched == [] and report.skipped_paths == [""]
    assert "forward differs" in report.skipped[0].reason

    def my_loss(logits, labels, vocab_size, **kwargs):
        return logits.float().mean()

    model = _model("llama", "cpu", torch.float32)
    model.loss_function = my_loss
    report = kf.patch(model, **LOSS_ONLY, attention=False)
    assert report.patched == [] and "my_loss" in report.skipped[0].reason, str(report)
    model = _model("llama", "cpu", torch.float32)
    model.loss_type = "ForMaskedLM"
    report = kf.patch(model, **LOSS_ONLY, attention=False)
    assert report.patched == [] and "ForMaskedLM" in report.skipped[0].reason, str(report)


def test_lm_head_hooked_at_patch_time(kf):
    model = _model("llama", "cpu", torch.float32)
    model.lm_head.register_forward_hook(lambda *a: None)
    report = kf.patch(model, **LOSS_ONLY, attention=False)
    assert report.patched == [] and "hooks" in report.skipped[0].reason


def test_runtime_fallback(kf, monkeypatch):
    """lm_head hooked or loss_function replaced after patching: the original tail runs, with one warning
    (an error with KF_STRICT=1)."""
    monkeypatch.setattr(importlib.import_module("kernelforge.patch._runtime"), "warned", set())  # warn-once per process
    model = _model("llama", "cpu", torch.float32)
    ids, labels = _batch(model, "cpu")
    kf.patch(model, **LOSS_ONLY, attention=False)
    calls = []
    handle = model.lm_head.register_forward_hook(lambda m, i, o: calls.append(o.shape))
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        out = model(input_ids=ids, labels=labels)
    assert calls and out.logits is not None and any("lm_head has hooks" in str(x.message) for x in w)
    handle.remove()
    model.loss_function = lambda logits, labels, vocab_size, **kw: logits.float().sum() * 0
    with pytest.warns(UserWarning, match="loss_function replaced"):
        assert model(input_ids=ids, labels=labels).loss.item() == 0
    monkeypatch.setenv("KF_STRICT", "1")
    with pytest.raises(RuntimeError, match="KF_STRICT"):
        model(input_ids=ids, labels=labels)
    kf.unpatch(model)


def test_autocast_cpu(kf):
    """Under autocast the hidden states and lm_head run in the autocast dtype, as the original lm_head."""
    model = _model("llama", "cpu", torch.float32)
    ids, labels = _batch(model, "cpu")
    with torch.autocast("cpu", dtype=torch.bfloat16):
        want = model(input_ids=ids, labels=labels).loss
        kf.patch(model, **LOSS_ONLY, attention=False)
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            got = model(input_ids=ids, labels=labels).loss
    got.backward()
    assert model.lm_head.weight.grad.dtype == torch.float32
    assert rel_err(got, want) < MODEL_TOL[torch.bfloat16]
    kf.unpatch(model)


# ---- acceptance: a few training steps follow the unpatched loss curve ------------------------------------------


def _train(model, ids, labels, steps):
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.01)
    curve = []
    for _ in range(steps):
        opt.zero_grad(set_to_none=True)
        loss = model(input_ids=ids, labels=labels).loss
        loss.backward()
        opt.step()
        curve.append(loss.item())
    return curve


@pytest.mark.parametrize("device,dtype", CASES)
def test_training_curve(kf, device, dtype):
    """Tiny Llama, random weights, 8 AdamW steps on the same batch (fixed seed): the patched loss curve
    matches the unpatched one (float32: to rounding; bf16: within the bf16 noise of the unpatched run vs a
    float32 run of the same steps)."""
    steps = 8
    torch.manual_seed(0)
    base = _model("llama", device, torch.float32)
    ids, labels = _batch(base, device, b=4, s=32)
    want = _train(copy.deepcopy(base).to(dtype), ids, labels, steps)
    patched = copy.deepcopy(base).to(dtype)
    kf.patch(patched, **LOSS_ONLY, attention=False)
    got = _train(patched, ids, labels, steps)
    print("unpatched", want, "\npatched  ", got)
    assert want[-1] < want[0] - 0.5, "the steps must actually train"
    diff = max(abs(a - b) for a, b in zip(got, want))
    if dtype == torch.float32:
        assert diff < 1e-4 * max(want), (got, want)
    else:
        truth = _train(copy.deepcopy(base), ids, labels, steps)
        noise = max(abs(a - b) for a, b in zip(want, truth))
        print("float32  ", truth)
        assert diff < max(2 * noise, 2e-2), (got, want, truth)
