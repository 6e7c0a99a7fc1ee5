"""kernelforge.softmax / log_softmax forward and backward against float64 torch references
(kernelforge.specs.softmax, through sm_ref.py): shapes per code path, dim != -1, strided and unaligned views, empty tensors, special
values (NaN/Inf as torch.softmax), the CPU path, the float64-on-CUDA fallback and KF_STRICT."""

from __future__ import annotations

import pytest
import torch

import norm_ref as R
import sm_ref as S
from norm_ref import DEVICES, DTYPES

# Row lengths per code path (notes/softmax.md): 1, odd/prime (partial last vector), short rows packed
# per block, decode, one-CTA rows, cluster rows (sm_90), streaming rows (float32 262144) and the
# forward's bulk plan (sm_90: more rows than SMs and rows over 32 KB, 140 x 32000); odd rows over 1024
# elements with a scalar head before the vectors (row kernel: 4095, 12289; streaming: 100003).
SHAPES = [(1, 1), (3, 7), (5, 127), (129, 33), (4, 1024), (1, 4096), (7, 4096), (3, 8191), (2, 3, 1000)]
HUGE_SHAPES = [(2, 32768), (2, 65536), (2, 131072), (1, 262144), (3, 100003), (140, 32000), (4, 12289), (4, 4095)]  # CUDA only
DEVICE_SHAPES = [pytest.param("cpu", s, id=f"cpu-{s}") for s in SHAPES] + [
    pytest.param("cuda", s, id=f"cuda-{s}", marks=pytest.mark.cuda) for s in SHAPES + HUGE_SHAPES
]


def check_forward(kf, op, x, dim=-1, msg=""):
    want = S.ref(op, x, dim)
    R.poison(x.device)
    y = S.run(kf, op, x, dim)
    assert y.dtype == x.dtype and y.device == x.device and y.shape == x.shape
    S.assert_close(y, want, x.dtype, scaled=op == "log_softmax", msg=f"{op} {msg}")
    return y


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("device,shape", DEVICE_SHAPES)
@pytest.mark.parametrize("op", S.OPS)
def test_forward(kf, op, device, shape, dtype):
    y = check_forward(kf, op, S.logits(shape, dtype, device))
    assert y.is_contiguous()


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dim", [0, 1, -2, 2, -1])
@pytest.mark.parametrize("op", S.OPS)
def test_dim(kf, op, device, dim):
    """dim other than the last: moved last, made contiguous, moved back (the result has x's shape)."""
    x = S.logits((6, 5, 37), torch.float32, device)
    check_forward(kf, op, x, dim, msg=f"dim={dim}")
    xg = x.clone().requires_grad_()
    xr = x.double().requires_grad_()
    g = torch.randn_like(x)
    S.run(kf, op, xg, dim).backward(g)
    getattr(torch, op)(xr, dim).backward(g.double())
    S.assert_close(xg.grad, xr.grad, torch.float32, scaled=True, msg=f"{op} dx dim={dim}")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("op", S.OPS)
def test_dim_out_of_range_and_scalar(kf, op, device):
    x = S.logits((4, 8), torch.float32, device)
    with pytest.raises(IndexError, match="Dimension out of range"):
        S.run(kf, op, x, 2)
    s = torch.tensor(3.5, device=device)
    y = S.run(kf, op, s)
    assert y.shape == () and y.item() == (1.0 if op == "softmax" else 0.0)


LAYOUTS = ["rows_strided", "rows_strided_odd", "unaligned"]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("n", [1000, 4096], ids=str)
@pytest.mark.parametrize("op", S.OPS)
def test_layouts(kf, op, n, layout, device, dtype):
    """Row-strided views (big[..., :N]) and base pointers one element into a buffer: forward and
    gradient match those of the contiguous input. Misaligned rows take the one-element path, whose
    float32 sums run in another order than the 16-byte path's: equal within the dtype tolerance,
    bit-equal only where both take the same path (the aligned row-strided view)."""
    x = S.logits((5, 3, n), dtype, device)
    xv = R.with_layout(x, layout).requires_grad_()
    xc = x.clone().requires_grad_()
    yv = check_forward(kf, op, xv, msg=layout)
    yc = S.run(kf, op, xc)
    g = R.rand(x.shape, dtype, device)
    yv.backward(R.with_layout(g, layout))
    yc.backward(g)
    if layout == "rows_strided":
        assert torch.equal(yv, yc) and torch.equal(xv.grad, xc.grad), f"{op} ({layout}) differs from contiguous"
    else:
        R.assert_close(yv, yc.detach(), dtype, msg=f"{op} y ({layout}) vs contiguous")
        R.assert_close(xv.grad, xc.grad.double(), dtype, grad=True, msg=f"{op} dx ({layout}) vs contiguous")


def test_transposed_last_dim(kf):
    """A last dimension of stride != 1 (x.t()) is made contiguous by the Python wrapper."""
    x = S.logits((64, 33), torch.float32, "cpu").t()
    check_forward(kf, "softmax", x)


def check_grads(kf, op, x, msg=""):
    xl = x.detach().clone().requires_grad_()
    y = S.run(kf, op, xl)
    xr = x.detach().double().requires_grad_()
    yr = getattr(torch, op)(xr, -1)
    g = R.rand(y.shape, x.dtype, x.device)
    R.poison(x.device)
    y.backward(g)
    yr.backward(g.double())
    assert xl.grad.dtype == x.dtype and xl.grad.shape == x.shape and xl.grad.device == x.device
    S.assert_close(xl.grad, xr.grad.to(x.dtype), x.dtype, scaled=True, msg=f"{op} dx {msg}")


GRAD_DEVICE_DTYPES = [pytest.param("cpu", d, id=f"cpu-{d}") for d in DTYPES] + [
    pytest.param("cuda", d, id=f"cuda-{d}", marks=pytest.mark.cuda) for d in DTYPES
]


@pytest.mark.parametrize("shape", [(1, 1), (7, 127), (3, 4097), (64, 4096)], ids=str)
@pytest.mark.parametrize("device,dtype", GRAD_DEVICE_DTYPES)
@pytest.mark.parametrize("op", S.OPS)
def test_backward(kf, op, device, dtype, shape):
    check_grads(kf, op, S.logits(shape, dtype, device))


@pytest.mark.cuda
@pytest.mark.parametrize("shape", [(2, 65536), (2, 131072), (1, 262144)], ids=str)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("op", S.OPS)
def test_backward_long_rows(kf, op, dtype, shape):
    check_grads(kf, op, S.logits(shape, dtype, "cuda"))


@pytest.mark.parametrize("device,dtype", GRAD_DEVICE_DTYPES)
@pytest.mark.parametrize("op", S.OPS)
def test_backward_expanded_grad(kf, op, device, dtype):
    """y.sum() hands the backward an expanded (stride-0) gradient."""
    x = S.logits((4, 300), dtype, device).requires_grad_()
    S.run(kf, op, x).sum().backward()
    xr = x.detach().double().requires_grad_()
    getattr(torch, op)(xr, -1).sum().backward()
    S.assert_close(x.grad, xr.grad.to(dtype), dtype, scaled=True, msg=f"{op} dx")


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("shape", [(0, 64), (2, 0, 64), (3, 0)], ids=str)
@pytest.mark.parametrize("op", S.OPS)
def test_empty(kf, op, shape, device, dtype):
    x = torch.empty(shape, dtype=dtype, device=device, requires_grad=True)
    y = S.run(kf, op, x)
    assert y.shape == x.shape and y.dtype == dtype
    y.sum().backward()
    assert x.grad is None or x.grad.shape == x.shape


@pytest.mark.cuda
@pytest.mark.parametrize("op", S.OPS)
def test_empty_launches_nothing(kf, op):
    x = torch.empty((0, 4096), dtype=torch.bfloat16, device="cuda", requires_grad=True)
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        y = S.run(kf, op, x)
        torch.cuda.synchronize()
    kernels = [e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    assert kernels == [], f"{op} on 0 rows launched {kernels}"
    assert y.numel() == 0


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("n", [4, 4099, 131072], ids=str)
@pytest.mark.parametrize("op", S.OPS)
def test_nonfinite_like_torch(kf, op, n, device, dtype):
    """NaN, +inf, all -inf rows give NaN where torch.softmax does; -inf elements give 0 (log: -inf);
    huge finite values do not overflow."""
    if device == "cpu" and n > 4099:
        pytest.skip("CPU reference: long rows covered on CUDA")
    inf, nan = float("inf"), float("nan")
    huge = 60000.0 if dtype == torch.float16 else 1e30
    pats = [[1.0, nan, 2.0, 3.0], [1.0, inf, 2.0, 3.0], [-inf] * 4, [-inf, 1.0, -inf, 2.0],
            [huge, -huge, 0.0, huge], [5.0] * 4, [-huge] * 4]
    x = torch.randn((len(pats), n), device=device).to(dtype)
    if n == 4:
        x.copy_(torch.tensor(pats, device=device).to(dtype))
    else:
        x[:, :4] = torch.tensor(pats, device=device).to(dtype)
        x[2, :] = -inf  # keep one all -inf row
    y = S.run(kf, op, x)
    want = getattr(torch, op)(x.double(), -1).to(dtype)
    assert torch.equal(torch.isnan(y.cpu()), torch.isnan(want.cpu())), f"{op}: NaN pattern differs from torch"
    S.assert_close(y, want, dtype, scaled=op == "log_softmax", msg=f"{op} special values")


@pytest.mark.parametrize("op", S.OPS)
def test_gradcheck_float64_cpu(kf, op):
    """Finite differences in float64 on the CPU implementation (the C++ reference)."""
    x = S.logits((3, 2, 8), torch.float64, "cpu", scale=1.5).requires_grad_()
    assert torch.autograd.gradcheck(lambda t: S.run(kf, op, t), (x,), eps=1e-6, atol=1e-7, rtol=1e-5)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("op", S.OPS)
def test_opcheck(kf, op, device):
    ops = torch.ops.kernelforge
    x = S.logits((2, 3, 40), torch.float32, device).requires_grad_()
    y = getattr(ops, op).default(x.detach())
    dy = R.rand((2, 3, 40), torch.float32, device)
    torch.library.opcheck(getattr(ops, op).default, (x,))
    torch.library.opcheck(getattr(ops, f"{op}_backward").default, (dy, y))


@pytest.mark.parametrize("op", S.OPS)
def test_double_backward_is_an_error(kf, op):
    x = S.logits((3, 16), torch.float32, "cpu").requires_grad_()
    with pytest.raises(RuntimeError, match=f"{op}: double backward"):
        torch.autograd.grad((S.run(kf, op, x) ** 2).sum(), x, create_graph=True)


@pytest.mark.cuda
@pytest.mark.parametrize("op", S.OPS)
def test_float64_on_cuda_falls_back(kf, op, monkeypatch):
    """float64 on CUDA runs the reference (CPU round trip) with a one-time warning; KF_STRICT=1
    makes it an error."""
    monkeypatch.delenv("KF_STRICT", raising=False)
    x = S.logits((4, 64), torch.float64, "cuda").requires_grad_()
    y = S.run(kf, op, x)
    assert y.device == x.device and y.dtype == torch.float64
    S.assert_close(y, S.ref(op, x), torch.float64, scaled=True)
    y.sum().backward()
    assert x.grad is not None and x.grad.device == x.device
    monkeypatch.setenv("KF_STRICT", "1")
    with pytest.raises(RuntimeError, match="KF_STRICT=1"):
        S.run(kf, op, x.detach())


@pytest.mark.cuda
def test_float64_warning_text(kf):
    """The fallback warns (TORCH_WARN_ONCE: only the first call per process shows it)."""
    import warnings

    x = S.logits((2, 8), torch.float64, "cuda")
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        kf.softmax(x)
        kf.log_softmax(x)
    texts = [str(m.message) for m in w]
    assert all("float64 CUDA tensors have no kernel" in t for t in texts)
