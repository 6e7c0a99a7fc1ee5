"""cross_entropy and fused_linear_cross_entropy against the float64 references of
kernelforge.specs.cross_entropy (written from the formulas of cross_entropy.h and checked against
F.cross_entropy where that has the option). Forward outputs are poisoned first (norm_ref.poison), so
an unwritten loss or lse would show as NaN; NaN never passes. Tolerances: the one table
kernelforge.specs.TOL:
  lse:        float32 math on exactly representable inputs, rows up to 262144 terms -> TOL.lse
  loss:       in the logits' dtype, as F.cross_entropy: one rounding more -> TOL.loss
  gradients:  one rounding to the dtype -> TOL.grad, relative to max |reference|
  fused loss: through a GEMM of dtype-rounded logits -> TOL.gemm
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F

import norm_ref as R
from norm_ref import DEVICES, DTYPES

from kernelforge.specs import TOL
from kernelforge.specs.cross_entropy import cross_entropy_ref as ref_ce
from kernelforge.specs.cross_entropy import fused_linear_cross_entropy_ref as flce_reference

f64 = torch.float64


def logits(shape, dtype, device, scale=3.0):
    return R.rand(shape, dtype, device, scale=scale)


def targets(t, v, device, ignore_every=5, dtype=torch.int64):
    tg = torch.randint(0, v, (t,), device=device, dtype=dtype)
    if ignore_every:
        tg[2::ignore_every] = -100  # rows 2, 7, ...: a one-row call keeps its row
    return tg


def check(kf, x, tg, dtype, device, *, grad=True, msg="", **opts):
    xr = x.detach().clone().double().requires_grad_()
    exp_loss, exp_lse = ref_ce(xr, tg, **opts)
    R.poison(device)
    xk = x.detach().clone().requires_grad_()
    loss, lse = kf.cross_entropy(xk, tg, return_lse=True, **opts)
    assert loss.dtype == x.dtype and lse.dtype == torch.float32, msg
    assert loss.shape == exp_loss.shape and lse.shape == exp_lse.shape, msg
    torch.testing.assert_close(lse.double().cpu(), exp_lse.detach().cpu(), rtol=TOL[dtype].lse, atol=TOL[dtype].lse,
                               msg=lambda m: f"lse {msg}\n{m}")
    tol = TOL[dtype].loss
    torch.testing.assert_close(loss.double().cpu(), exp_loss.detach().cpu(), rtol=tol, atol=tol,
                               msg=lambda m: f"loss {msg}\n{m}")
    if grad:
        g = torch.rand_like(exp_loss) + 0.5
        (gx,) = torch.autograd.grad(exp_loss, xr, g)
        (gk,) = torch.autograd.grad(loss, xk, g.to(loss.dtype).to(device))
        assert gk.dtype == x.dtype and gk.shape == x.shape
        R.assert_close(gk, gx, dtype, grad=True, msg=f"dlogits {msg}")
    return loss


SHAPES = [(1, 1), (1, 7), (7, 13), (5, 4099), (3, 16385), (257, 130)]
CUDA_SHAPES = [(4, 32000), (2, 128256), (1, 262144), (3, 8193), (3, 50257)]
DEVICE_SHAPES = [pytest.param("cpu", s, id=f"cpu-{s}") for s in SHAPES] + [
    pytest.param("cuda", s, id=f"cuda-{s}", marks=pytest.mark.cuda) for s in SHAPES + CUDA_SHAPES
]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("device,shape", DEVICE_SHAPES)
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_forward_backward(kf, reduction, device, shape, dtype):
    t, v = shape
    check(kf, logits(shape, dtype, device), targets(t, v, device), dtype, device, reduction=reduction,
          msg=f"{shape} {reduction}")


OPTIONS = [
    dict(label_smoothing=0.1),
    dict(z_loss_scale=1e-4),
    dict(softcap=30.0),
    dict(label_smoothing=0.2, z_loss_scale=1e-3, softcap=10.0, reduction="sum"),
    dict(ignore_index=3, reduction="none"),
]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("opts", OPTIONS, ids=lambda o: ",".join(f"{k}={v}" for k, v in o.items()))
def test_options(kf, opts, device, dtype):
    t, v = 9, 20011
    scale = 20.0 if "softcap" in opts else 3.0
    tg = targets(t, v, device, ignore_every=0 if "ignore_index" in opts else 5)
    if "ignore_index" in opts:
        tg[1] = tg[4] = opts["ignore_index"]
    check(kf, logits((t, v), dtype, device, scale), tg, dtype, device, msg=str(opts), **opts)


def test_matches_torch_cross_entropy(kf):
    """The reference (and so the op) is F.cross_entropy for the options torch has."""
    x = torch.randn(11, 57, dtype=f64)
    tg = targets(11, 57, "cpu", ignore_every=4)
    for red in ("mean", "sum", "none"):
        for ls in (0.0, 0.3):
            exp = F.cross_entropy(x, tg, reduction=red, label_smoothing=ls)
            torch.testing.assert_close(ref_ce(x, tg, reduction=red, label_smoothing=ls)[0], exp)
            torch.testing.assert_close(kf.cross_entropy(x, tg, reduction=red, label_smoothing=ls), exp,
                                       rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("device", DEVICES)
def test_all_ignored(kf, device):
    x = logits((6, 50), torch.float32, device).requires_grad_()
    tg = torch.full((6,), -100, device=device)
    loss = kf.cross_entropy(x, tg)
    assert torch.isnan(loss), "mean over no valid rows is NaN, as F.cross_entropy"
    assert torch.isnan(F.cross_entropy(x, tg))
    (g,) = torch.autograd.grad(loss, x)
    assert torch.equal(g, torch.zeros_like(g))
    assert kf.cross_entropy(x, tg, reduction="sum").item() == 0.0
    assert torch.equal(kf.cross_entropy(x, tg, reduction="none"), torch.zeros(6, device=device))


@pytest.mark.parametrize("device", DEVICES)
def test_empty_and_shapes(kf, device):
    x = torch.randn(0, 10, device=device)
    tg = torch.zeros(0, dtype=torch.long, device=device)
    assert torch.isnan(kf.cross_entropy(x, tg)) and torch.isnan(F.cross_entropy(x, tg))
    assert kf.cross_entropy(x, tg, reduction="sum").item() == 0.0
    assert kf.cross_entropy(x, tg, reduction="none").shape == (0,)
    # leading dimensions: logits [B, S, V], target [B, S]
    x = logits((2, 3, 40), torch.float32, device)
    tg = torch.randint(0, 40, (2, 3), device=device)
    out = kf.cross_entropy(x, tg, reduction="none")
    assert out.shape == (2, 3)
    torch.testing.assert_close(out, F.cross_entropy(x.reshape(6, 40), tg.reshape(6), reduction="none").view(2, 3))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("layout", ["rows_strided", "rows_strided_odd", "unaligned"])
def test_layouts(kf, layout, device, dtype):
    x = logits((7, 1000), dtype, device)
    tg = targets(7, 1000, device)
    loss = check(kf, R.with_layout(x, layout), tg, dtype, device, msg=layout)
    assert torch.equal(loss, kf.cross_entropy(x, tg))
    # strided target and int32 target
    big = torch.stack([tg, tg], 1)
    assert torch.equal(kf.cross_entropy(x, big[:, 0]), loss)
    assert torch.equal(kf.cross_entropy(x, tg.int()), loss)


@pytest.mark.parametrize("device", DEVICES)
def test_nan_and_inf_propagate(kf, device):
    x = logits((4, 300), torch.float32, device)
    x[1, 7] = float("nan")
    x[2, 9] = float("-inf")  # a masked class: fine unless it is the target
    tg = torch.tensor([0, 1, 2, 3], device=device)
    out = kf.cross_entropy(x, tg, reduction="none")
    exp = F.cross_entropy(x, tg, reduction="none")
    assert torch.isnan(out[1]) and torch.isnan(exp[1])
    torch.testing.assert_close(out[[0, 2, 3]], exp[[0, 2, 3]], rtol=1e-5, atol=1e-5)


@pytest.mark.cuda
def test_out_of_range_target_gpu(kf):
    """No host sync on the GPU: the row's loss is NaN (documented), the others are fine."""
    x = logits((3, 100), torch.float32, "cuda").requires_grad_()
    tg = torch.tensor([5, 100, 7], device="cuda")
    out = kf.cross_entropy(x, tg, reduction="none")
    assert torch.isnan(out[1]) and not torch.isnan(out[[0, 2]]).any()
    assert torch.isnan(kf.cross_entropy(x, tg))
    (g,) = torch.autograd.grad(out.sum(), x)
    assert torch.isnan(g[1]).all() and not torch.isnan(g[[0, 2]]).any()


def test_out_of_range_target_cpu_error(kf):
    x = torch.randn(3, 100)
    with pytest.raises(RuntimeError, match=r"target\[1\] = -5 is outside \[0, 100\)"):
        kf.cross_entropy(x, torch.tensor([5, -5, 7]))


@pytest.mark.parametrize("device", DEVICES)
def test_bad_inputs(kf, device):
    x = torch.randn(4, 10, device=device)
    tg = torch.randint(0, 10, (4,), device=device)
    with pytest.raises(ValueError, match="target must have the shape"):
        kf.cross_entropy(x, tg[:3])
    with pytest.raises(RuntimeError, match="target must be an int64"):
        kf.cross_entropy(x, tg.float())
    with pytest.raises(RuntimeError, match="logits must be a"):
        kf.cross_entropy(x.long(), tg)
    with pytest.raises(RuntimeError, match="label_smoothing must be in"):
        kf.cross_entropy(x, tg, label_smoothing=1.5)
    with pytest.raises(RuntimeError, match="z_loss_scale must be"):
        kf.cross_entropy(x, tg, z_loss_scale=-1.0)
    with pytest.raises(ValueError, match="softcap must be None or > 0"):
        kf.cross_entropy(x, tg, softcap=-2.0)
    with pytest.raises(ValueError, match="reduction must be"):
        kf.cross_entropy(x, tg, reduction="avg")
    with pytest.raises(RuntimeError, match="contiguous in its last dimension"):
        kf.cross_entropy(torch.randn(10, 4, device=device).t(), tg)
    if device == "cuda":
        with pytest.raises(RuntimeError, match="same device as logits"):
            kf.cross_entropy(x, tg.cpu())


@pytest.mark.cuda
def test_float64_cuda_fallback_warns_or_errors(kf, monkeypatch):
    """The reference fallback warns once per process (an earlier test may have used it up): the warning
    is checked in a fresh interpreter, the result and KF_STRICT=1 here."""
    code = ("import warnings, torch, kernelforge as kf\n"
            "x = torch.randn(3, 20, dtype=torch.float64, device='cuda')\n"
            "with warnings.catch_warnings(record=True) as w:\n"
            "    warnings.simplefilter('always')\n"
            "    kf.cross_entropy(x, torch.randint(0, 20, (3,), device='cuda'))\n"
            "print('WARNED' if any('float64' in str(m.message) for m in w) else 'SILENT')\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    env.pop("KF_STRICT", None)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    # TORCH_WARN reaches Python's warnings or, without a Python handler, stderr: either is seen
    seen = "WARNED" in r.stdout or "float64 CUDA tensors have no kernel; cross_entropy" in r.stderr
    assert r.returncode == 0 and seen, r.stdout + r.stderr
    x = torch.randn(3, 20, dtype=f64, device="cuda")
    tg = torch.randint(0, 20, (3,), device="cuda")
    torch.testing.assert_close(kf.cross_entropy(x, tg), F.cross_entropy(x, tg), rtol=1e-6, atol=1e-6)
    monkeypatch.setenv("KF_STRICT", "1")
    with pytest.raises(RuntimeError, match="KF_STRICT"):
        kf.cross_entropy(x, tg)


# ---- fused linear cross-entropy ---------------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("bias", [False, True], ids=["nobias", "bias"])
@pytest.mark.parametrize("chunk", [0, 5])
def test_flce(kf, chunk, bias, reduction, device, dtype):
    t, hd, v = 23, 32, 1031
    h = R.rand((t, hd), dtype, device)
    w = R.rand((v, hd), dtype, device, scale=0.3)
    b = R.rand((v,), dtype, device) if bias else None
    tg = targets(t, v, device)
    opts = dict(reduction=reduction, label_smoothing=0.05)
    leaves = [p.detach().clone().requires_grad_() for p in (h, w, b) if p is not None]
    hk, wk, bk = leaves[0], leaves[1], (leaves[2] if bias else None)
    R.poison(device)
    loss = kf.fused_linear_cross_entropy(hk, wk, tg, bk, chunk_tokens=chunk, **opts)
    assert loss.dtype == torch.float32
    refs = [p.detach().clone().double().requires_grad_() for p in leaves]
    exp = flce_reference(refs[0], refs[1], tg, refs[2] if bias else None, **opts)
    tol = TOL[dtype].gemm
    torch.testing.assert_close(loss.double().cpu(), exp.detach().cpu(), rtol=tol, atol=tol)
    g = torch.rand_like(exp) + 0.5
    gk = torch.autograd.grad(loss, leaves, g.float())
    ge = torch.autograd.grad(exp, refs, g)
    for name, a, e in zip(("dhidden", "dweight", "dbias"), gk, ge):
        assert a.dtype == dtype and a.shape == e.shape
        # the chunked weight gradient is accumulated in the dtype: one rounding per chunk
        tol_g = TOL[dtype].grad * (2 if chunk else 1)
        a64, e64 = a.double().cpu(), e.cpu()
        torch.testing.assert_close(a64, e64, rtol=tol_g, atol=tol_g * max(1.0, e64.abs().max().item()),
                                   msg=lambda m: f"{name}\n{m}")


@pytest.mark.parametrize("device", DEVICES)
def test_flce_matches_cross_entropy_and_partial_grads(kf, device):
    """Same loss as logits + cross_entropy; gradients only for the inputs that want them; 3-D hidden."""
    h = R.rand((2, 5, 16), torch.float32, device).requires_grad_()
    w = R.rand((300, 16), torch.float32, device, scale=0.3)  # frozen: no gradient wanted
    tg = targets(10, 300, device).view(2, 5)
    loss = kf.fused_linear_cross_entropy(h, w, tg)
    exp = F.cross_entropy((h @ w.t()).view(10, 300), tg.view(10))
    torch.testing.assert_close(loss, exp, rtol=1e-5, atol=1e-5)
    (gh,) = torch.autograd.grad(loss, h)
    (ge,) = torch.autograd.grad(exp, h)
    torch.testing.assert_close(gh, ge, rtol=1e-5, atol=1e-6)
    assert w.grad is None
    none = kf.fused_linear_cross_entropy(h, w, tg, reduction="none")
    assert none.shape == (2, 5)
    with torch.no_grad():
        torch.testing.assert_close(kf.fused_linear_cross_entropy(h, w, tg), exp, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("device", DEVICES)
def test_flce_all_ignored_and_errors(kf, device):
    h = torch.randn(4, 8, device=device, requires_grad=True)
    w = torch.randn(20, 8, device=device, requires_grad=True)
    tg = torch.full((4,), -100, device=device)
    loss = kf.fused_linear_cross_entropy(h, w, tg)
    assert torch.isnan(loss)
    gh, gw = torch.autograd.grad(loss, (h, w))
    assert torch.equal(gh, torch.zeros_like(gh)) and torch.equal(gw, torch.zeros_like(gw))
    with pytest.raises(RuntimeError, match=r"weight must have shape \[vocab, 8\]"):
        kf.fused_linear_cross_entropy(h, torch.randn(20, 7, device=device), tg)
    with pytest.raises(RuntimeError, match="weight must have hidden's dtype"):
        kf.fused_linear_cross_entropy(h, w.double(), tg)
    with pytest.raises(RuntimeError, match="bias must have shape"):
        kf.fused_linear_cross_entropy(h, w, tg, torch.randn(19, device=device))
    with pytest.raises(ValueError, match="target must have the shape of hidden"):
        kf.fused_linear_cross_entropy(h, w, tg[:3])


@pytest.mark.cuda
def test_flce_memory_no_full_logits(kf):
    """Peak memory above inputs and outputs stays near one chunk (plus cuBLASLt's 32 MiB workspace), far below
    [T, V] float32 logits."""
    t, hd, v = 4096, 256, 32000
    h = torch.randn(t, hd, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    w = (torch.randn(v, hd, device="cuda", dtype=torch.bfloat16) * 0.05).requires_grad_()
    tg = torch.randint(0, v, (t,), device="cuda")
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    loss = kf.fused_linear_cross_entropy(h, w, tg, chunk_tokens=512)
    loss.backward()
    torch.cuda.synchronize()
    extra = torch.cuda.max_memory_allocated() - base - h.numel() * 2 - w.numel() * 2
    chunk = 512 * v * 2
    assert extra < 2 * chunk + (40 << 20), f"extra peak {extra / 2**20:.1f} MiB vs chunk {chunk / 2**20:.1f} MiB"
    assert extra < t * v * 4 / 4


@pytest.mark.parametrize("device", DEVICES)
def test_flce_backward_scaling_and_retain_graph(kf, device):
    """The loss gradient scales the gradients computed in the forward; a second backward through the
    same graph is a clear error (the saved gradients were scaled in place), not a wrong answer."""
    h = R.rand((9, 16), torch.float32, device).requires_grad_()
    w = R.rand((50, 16), torch.float32, device, scale=0.3).requires_grad_()
    tg = targets(9, 50, device)
    loss = kf.fused_linear_cross_entropy(h, w, tg, reduction="sum")
    (gh,) = torch.autograd.grad(loss * 3.0, h, retain_graph=True)
    (ge,) = torch.autograd.grad(F.cross_entropy(h @ w.t(), tg, reduction="sum") * 3.0, h)
    torch.testing.assert_close(gh, ge, rtol=1e-5, atol=1e-5)
    with pytest.raises(RuntimeError, match="retain_graph|modified by an inplace operation"):
        torch.autograd.grad(loss, h)
