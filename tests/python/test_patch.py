"""kernelforge.patch / unpatch on hand-built models: matching table, report, runtime fallback."""

from __future__ import annotations

import copy
import importlib
import types
import warnings

import pytest
import torch

import norm_ref as R
from norm_ref import DEVICES

N = 64


# transformers / diffusers are imported per test (not at module level): a module-level skip would
# hide this file's GPU tests from the KF_REQUIRE_GPU=1 check in conftest.py.
def _hf():
    pytest.importorskip("transformers")
    from transformers.models.gemma.modeling_gemma import GemmaRMSNorm
    from transformers.models.llama.modeling_llama import LlamaRMSNorm
    from transformers.models.olmo2.modeling_olmo2 import Olmo2RMSNorm
    from transformers.models.qwen2.modeling_qwen2 import Qwen2RMSNorm

    return types.SimpleNamespace(Gemma=GemmaRMSNorm, Llama=LlamaRMSNorm, Olmo2=Olmo2RMSNorm, Qwen2=Qwen2RMSNorm)


def _diffusers():
    return pytest.importorskip("diffusers.models.normalization")


class MyLayerNorm(torch.nn.LayerNorm):
    def forward(self, x):  # different math: must not be patched
        return super().forward(x) * 2


class CustomRMSNorm(torch.nn.Module):
    """Named like an RMSNorm, computes something else."""

    def __init__(self, n):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(n))
        self.variance_epsilon = 1e-6

    def forward(self, x):
        return x * self.weight


def _randomize(model):
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(R.rand(p.shape, p.dtype, p.device, scale=0.3, offset=1.0))
    return model


def zoo():
    """name -> (module, expected verdict: an op name when patched, else a substring of the reason)."""
    hf, diffusers_norm = _hf(), _diffusers()
    LlamaRMSNorm, Qwen2RMSNorm, GemmaRMSNorm, Olmo2RMSNorm = hf.Llama, hf.Qwen2, hf.Gemma, hf.Olmo2
    return {
        "llama": (LlamaRMSNorm(N, eps=1e-5), "kernelforge.rms_norm"),
        "qwen2": (Qwen2RMSNorm(N, eps=1e-6), "kernelforge.rms_norm"),
        "gemma": (GemmaRMSNorm(N), "Gemma-style"),
        "olmo2": (Olmo2RMSNorm(N), "forward differs from LlamaRMSNorm"),
        "custom": (CustomRMSNorm(N), "forward differs from LlamaRMSNorm"),
        "torch_rms": (torch.nn.RMSNorm(N, eps=1e-5), "kernelforge.rms_norm"),
        "torch_rms_eps_none": (torch.nn.RMSNorm(N), "kernelforge.rms_norm"),
        "torch_rms_2d": (torch.nn.RMSNorm((4, N // 4)), "kernelforge.rms_norm"),
        "torch_rms_noaffine": (torch.nn.RMSNorm(N, elementwise_affine=False), "kernelforge.rms_norm"),
        "torch_ln": (torch.nn.LayerNorm(N), "kernelforge.layer_norm"),
        "torch_ln_nobias": (torch.nn.LayerNorm(N, bias=False), "kernelforge.layer_norm"),
        "torch_ln_noaffine": (torch.nn.LayerNorm(N, elementwise_affine=False, eps=1e-6), "kernelforge.layer_norm"),
        "torch_ln_2d": (torch.nn.LayerNorm((4, N // 4)), "kernelforge.layer_norm"),
        "my_ln": (MyLayerNorm(N), "subclass overrides forward"),
        "diff_rms": (diffusers_norm.RMSNorm(N, eps=1e-6), "kernelforge.rms_norm"),
        "diff_rms_noaffine": (diffusers_norm.RMSNorm(N, eps=1e-6, elementwise_affine=False), "kernelforge.rms_norm"),
        "diff_rms_bias": (diffusers_norm.RMSNorm(N, eps=1e-6, bias=True), "has a bias"),
        "linear": (torch.nn.Linear(N, N), None),  # not a norm: neither patched nor reported
    }


def _model():
    z = zoo()
    model = torch.nn.ModuleDict({k: m for k, (m, _) in z.items()})
    return _randomize(model), {k: v for k, (_, v) in z.items()}


def _input(name, dtype, device, rows=(3, 5)):
    shape = (*rows, 4, N // 4) if name.endswith("_2d") else (*rows, N)
    return R.rand(shape, dtype, device)


def test_report_lists_patched_and_skipped(kf):
    model, expected = _model()
    report = kf.patch(model, attention=False)
    patched = {p.path: p for p in report.patched}
    skipped = {s.path: s for s in report.skipped}
    for name, verdict in expected.items():
        if verdict is None:
            assert name not in patched and name not in skipped
        elif verdict.startswith("kernelforge."):
            assert name in patched, f"{name} not patched: {skipped.get(name)}"
            assert patched[name].op == verdict and patched[name].cls == type(model[name]).__name__
        else:
            assert name in skipped, f"{name} should have been skipped"
            assert verdict in skipped[name].reason, skipped[name].reason
    assert "" not in patched and "" not in skipped  # the ModuleDict itself
    text = str(report)
    assert f"{len(report.patched)} module(s) patched, {len(report.skipped)} skipped" in text
    assert "transformers.LlamaRMSNorm -> kernelforge.rms_norm" in text and "Gemma-style" in text
    assert "diffusers.RMSNorm -> kernelforge.rms_norm" in text and "torch.nn.RMSNorm -> kernelforge.rms_norm" in text
    print(text)
    assert kf.unpatch(model) == len(report.patched)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("device", DEVICES)
def test_patched_matches_original(kf, device, dtype):
    """Every patched module: same output dtype/shape and values (and grads) as its original forward."""
    model, expected = _model()
    model.to(device=device, dtype=dtype)
    originals = {}
    for name in expected:
        m = model[name]
        x = _input(name, dtype, device).requires_grad_()
        y = m(x)
        y.backward(torch.ones_like(y))
        originals[name] = (x, y.detach(), x.grad, [p.grad.clone() for p in m.parameters()])
        m.zero_grad(set_to_none=True)
    report = kf.patch(model, attention=False)
    assert len(report.patched) == sum(1 for v in expected.values() if v and v.startswith("kernelforge."))
    for p in report.patched:
        m = model[p.path]
        assert isinstance(m.forward, types.MethodType) and "forward" in m.__dict__
        x0, y0, dx0, dps0 = originals[p.path]
        x = x0.detach().clone().requires_grad_()
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # same dtypes everywhere: no fallback may happen
            y = m(x)
        R.assert_close(y, y0, dtype, msg=p.path)
        y.backward(torch.ones_like(y))
        R.assert_close(x.grad, dx0.double(), dtype, grad=True, msg=f"{p.path} dx")
        for q, g0 in zip(m.parameters(), dps0):
            R.assert_close(q.grad, g0.double(), dtype, grad=True, msg=f"{p.path} dparam")


def test_unpatch_restores_exactly(kf):
    model, expected = _model()
    before = {name: dict(m.__dict__) for name, m in model.named_modules()}
    report = kf.patch(model, attention=False)
    assert report.patched
    assert kf.unpatch(model) == len(report.patched)
    for name, m in model.named_modules():
        assert m.__dict__.keys() == before[name].keys(), name
        assert "forward" not in m.__dict__
        assert m.forward.__func__ is type(m).forward
    assert kf.unpatch(model) == 0


def test_patch_twice_is_idempotent(kf):
    model, _ = _model()
    first = kf.patch(model, attention=False)
    fwd = {p.path: model[p.path].forward for p in first.patched}
    second = kf.patch(model, attention=False)
    assert not second.patched
    assert {s.path for s in second.skipped if s.reason == "already patched by kernelforge"} == set(fwd)
    for path, f in fwd.items():
        assert model[path].forward is f
    kf.unpatch(model)


def test_instance_forward_is_left_alone(kf):
    """A forward already overridden on the instance (accelerate hooks do this) is not replaced."""
    m = _hf().Llama(N)
    hook = types.MethodType(lambda self, x: x, m)
    m.forward = hook
    report = kf.patch(m, attention=False)
    assert not report.patched and "already overridden" in report.skipped[0].reason
    assert m.forward is hook


def test_root_module_can_be_patched(kf):
    m = _randomize(_hf().Llama(N))
    report = kf.patch(m, attention=False)
    assert report.patched_paths == [""] and "<root>" in str(report)
    x = R.rand((2, N), torch.float32, "cpu")
    R.assert_close(m(x), type(m).forward(m, x), torch.float32)
    kf.unpatch(m)


# ---- runtime fallback ------------------------------------------------------------------------------------


@pytest.mark.parametrize("make", [
    lambda: _hf().Llama(N),
    lambda: torch.nn.RMSNorm(N),
    lambda: torch.nn.LayerNorm(N),
    lambda: _diffusers().RMSNorm(N, eps=1e-6),
], ids=["llama", "torch_rms", "torch_ln", "diffusers"])
def test_mixed_dtype_falls_back_with_one_warning(kf, make, monkeypatch):
    """float32 weights with a bfloat16 input: the original forward runs (its dtype promotion rules
    included), with one warning; KF_STRICT=1 turns it into an error."""
    P = importlib.import_module("kernelforge.patch")  # `kernelforge.patch` the attribute is the function

    monkeypatch.setattr(importlib.import_module("kernelforge.patch._runtime"), "warned", set())
    monkeypatch.delenv("KF_STRICT", raising=False)
    m = _randomize(make())
    x = R.rand((3, N), torch.bfloat16, "cpu")
    want = m(x)
    kf.patch(m, attention=False)
    with pytest.warns(UserWarning, match="original forward runs instead"):
        got = m(x)
    assert got.dtype == want.dtype and torch.equal(got, want)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        m(x)  # warned once already
    monkeypatch.setenv("KF_STRICT", "1")
    with pytest.raises(RuntimeError, match="KF_STRICT"):
        m(x)
    kf.unpatch(m)


def test_diffusers_bias_added_after_patch_falls_back(kf, monkeypatch):
    P = importlib.import_module("kernelforge.patch")  # `kernelforge.patch` the attribute is the function

    monkeypatch.setattr(importlib.import_module("kernelforge.patch._runtime"), "warned", set())
    m = _randomize(_diffusers().RMSNorm(N, eps=1e-6))
    kf.patch(m, attention=False)
    m.bias = torch.nn.Parameter(torch.randn(N))
    x = R.rand((3, N), torch.float32, "cpu")
    with pytest.warns(UserWarning, match="bias"):
        got = m(x)
    torch.testing.assert_close(got, type(m).forward(m, x))


@pytest.mark.parametrize("device", DEVICES)
def test_non_contiguous_input(kf, device):
    """Layouts the op cannot read as rows are copied (same values), row-strided views go straight in."""
    model, _ = _model()
    model.to(device)
    kf.patch(model, attention=False)
    for name in ("llama", "torch_rms", "torch_ln", "diff_rms", "torch_ln_2d"):
        m = model[name]
        x = _input(name, torch.float32, device, rows=(5, 3)).transpose(0, 1)  # leading dims do not collapse
        assert not x.is_contiguous()
        R.assert_close(m(x), type(m).forward(m, x), torch.float32, msg=name)
    big = R.rand((6, N + 5), torch.float32, device)
    for name in ("llama", "torch_rms", "diff_rms"):
        m = model[name]
        R.assert_close(m(big[:, :N]), type(m).forward(m, big[:, :N]), torch.float32, msg=name)


def test_wrong_shape_still_raises(kf):
    model, _ = _model()
    kf.patch(model, attention=False)
    with pytest.raises(RuntimeError):
        model["torch_rms_2d"](torch.randn(3, 8, 8))
    with pytest.raises(RuntimeError):
        model["torch_ln"](torch.randn(3, N + 1))


def test_deepcopy_rebinds(kf):
    model, _ = _model()
    kf.patch(model, attention=False)
    clone = copy.deepcopy(model)
    assert clone["llama"].forward.__self__ is clone["llama"]
    x = R.rand((2, N), torch.float32, "cpu")
    R.assert_close(clone["llama"](x), model["llama"](x), torch.float32)
    assert kf.unpatch(clone) == kf.unpatch(model) > 0


def test_compile_patched_module(kf):
    torch._dynamo.reset()
    model, _ = _model()
    m = torch.nn.Sequential(model["llama"], model["torch_ln"], model["diff_rms"])
    x = R.rand((4, N), torch.float32, "cpu")
    want = m(x)
    kf.patch(m, attention=False)
    got = torch.compile(m, fullgraph=True, backend="aot_eager")(x)
    R.assert_close(got, want, torch.float32)


def test_register_replacement(kf):
    """The table is the extension point: a new entry patches its class."""
    P = importlib.import_module("kernelforge.patch")

    class ScaleNorm(torch.nn.Module):
        def forward(self, x):
            return x

    def fwd(self, x):
        return x + 1

    entry = P.Replacement("test ScaleNorm", "kernelforge.test", lambda m: True if isinstance(m, ScaleNorm) else None, fwd)
    P.register_replacement(entry, before="transformers LlamaRMSNorm")
    try:
        m = torch.nn.Sequential(ScaleNorm())
        report = kf.patch(m, attention=False)
        assert report.patched[0].op == "kernelforge.test"
        assert torch.equal(m(torch.zeros(2)), torch.ones(2))
        kf.unpatch(m)
        assert torch.equal(m(torch.zeros(2)), torch.zeros(2))
    finally:
        P.REPLACEMENTS.remove(entry)
