"""float64 PyTorch references for the norm family, written from the model libraries' semantics, plus
the tolerance table and input builders shared by the tests.

Each reference takes tensors of any dtype, computes in float64 and applies the roundings the model
library applies (``dtype`` = the tensor dtype). With ``dtype=torch.float64`` nothing is rounded and
the function is differentiable: that is the gradient reference.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

f64 = torch.float64

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.cuda)]

# Tolerance per dtype, used as assert_close(rtol=tol, atol=tol). The kernels compute in float32 and
# round once; rms_norm rounds twice (x * rstd is cast to the dtype before * weight, as in HF), so a
# float32 rounding difference at the first cast moves the result by |w| ulp(x_hat) + ulp(y)/2: up to
# 1.5 ulp relative. The half-precision entries allow 2 ulp (fp16 2^-9, bf16 2^-6); float32 allows
# the accumulation error of 131072-element rows with margin.
TOL = {
    torch.float32: 1e-5,
    torch.float16: 2e-3,
    torch.bfloat16: 1.6e-2,
    torch.float64: 1e-12,
}
# Gradients: compared with rtol=tol and atol=tol * max|reference| (dx and dweight involve row/column
# reductions whose terms cancel, so elementwise relative error is meaningless near zero).
GRAD_TOL = {
    torch.float32: 1e-4,
    torch.float16: 3e-3,
    torch.bfloat16: 1e-2,
    torch.float64: 1e-10,
}

DTYPES = [torch.float32, torch.float16, torch.bfloat16]


def assert_close(actual, expected, dtype, *, grad=False, msg=""):
    tol = (GRAD_TOL if grad else TOL)[dtype]
    if not grad:  # gradient references stay float64
        assert actual.dtype == expected.dtype, f"{msg}: dtype {actual.dtype} != {expected.dtype}"
    assert actual.shape == expected.shape, f"{msg}: shape {tuple(actual.shape)} != {tuple(expected.shape)}"
    a, e = actual.detach().double().cpu(), expected.detach().double().cpu()
    atol = tol * max(1.0, e.abs().max().item()) if grad and e.numel() else tol
    torch.testing.assert_close(a, e, rtol=tol, atol=atol, equal_nan=False, msg=lambda m: f"{msg}\n{m}")


# ---- references -----------------------------------------------------------------------------------


def _round(t: torch.Tensor, dtype) -> torch.Tensor:
    return t if dtype == f64 else t.to(dtype).to(f64)


def rms_norm(x, weight, eps, dtype):
    """HF LlamaRMSNorm: normalize in high precision, cast to the input dtype, then * weight."""
    x = x.to(f64)
    y = _round(x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps), dtype)
    if weight is not None:
        y = y * weight.to(f64)
    return y.to(dtype)


def add_rms_norm(x, residual, weight, eps, dtype):
    s = _round(x.to(f64) + residual.to(f64), dtype)
    return rms_norm(s, weight, eps, dtype), s.to(dtype)


def layer_norm(x, weight, bias, eps, dtype):
    w = None if weight is None else weight.to(f64)
    b = None if bias is None else bias.to(f64)
    return F.layer_norm(x.to(f64), (x.shape[-1],), w, b, eps).to(dtype)


def ada_norm(x, scale, shift, weight, bias, eps, kind, dtype):
    """norm(x) * (1 + scale) + shift, all in float64, one rounding at the end."""
    x = x.to(f64)
    if kind == "layer":
        n = F.layer_norm(x, (x.shape[-1],), None, None, eps)
    else:
        n = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
    if weight is not None:
        n = n * weight.to(f64)
    if bias is not None:
        n = n + bias.to(f64)
    return (n * (1 + scale.to(f64)) + shift.to(f64)).to(dtype)


# ---- inputs ---------------------------------------------------------------------------------------


def rand(shape, dtype, device, scale=1.0, offset=0.0) -> torch.Tensor:
    """Fresh N(offset, scale^2) values (never all zeros), generated in float32 then cast."""
    return (torch.randn(shape, device=device) * scale + offset).to(dtype)


def with_layout(t: torch.Tensor, layout: str) -> torch.Tensor:
    """The same values as t, stored as `layout`:
    contiguous | rows_strided (rows of a wider buffer, big[..., :N]) | rows_strided_odd (odd row
    stride: misaligned rows) | unaligned (base pointer one element into a buffer)."""
    if layout == "contiguous":
        return t
    n = t.shape[-1]
    if layout in ("rows_strided", "rows_strided_odd"):
        pad = 64 if layout == "rows_strided" else 3
        big = torch.full((*t.shape[:-1], n + pad), float("nan"), dtype=t.dtype, device=t.device)
        big[..., :n] = t
        v = big[..., :n]
    elif layout == "unaligned":
        buf = torch.full((t.numel() + 1,), float("nan"), dtype=t.dtype, device=t.device)
        v = buf[1:].view(t.shape)
        v.copy_(t)
    else:
        raise ValueError(layout)
    assert torch.equal(v, t)
    return v


def numel(shape) -> int:
    return math.prod(shape)


# ---- the ops under test, driven by one table --------------------------------------------------------
# Each case: how to call kernelforge, how to call the reference, which inputs it takes.
OPS = ["rms_norm", "add_rms_norm", "layer_norm", "ada_norm_layer", "ada_norm_rms"]
EPS = {"rms_norm": 1e-6, "add_rms_norm": 1e-6, "layer_norm": 1e-5, "ada_norm_layer": 1e-6, "ada_norm_rms": 1e-6}
HAS_BIAS = {"layer_norm", "ada_norm_layer", "ada_norm_rms"}


def make_inputs(op, shape, dtype, device, affine=True, mod_shape=None):
    """Random inputs for `op`. mod_shape: shape of ada_norm's scale/shift (default [N])."""
    n = shape[-1]
    inp = {"x": rand(shape, dtype, device)}
    if op == "add_rms_norm":
        inp["residual"] = rand(shape, dtype, device)
    inp["weight"] = rand(n, dtype, device, scale=0.5, offset=1.0) if affine else None
    inp["bias"] = rand(n, dtype, device, scale=0.5) if affine and op in HAS_BIAS else None
    if op.startswith("ada_norm"):
        mod_shape = (n,) if mod_shape is None else mod_shape
        inp["scale"] = rand(mod_shape, dtype, device, scale=0.5)
        inp["shift"] = rand(mod_shape, dtype, device)
    return inp


def run_kf(kf, op, inp, eps=None):
    eps = EPS[op] if eps is None else eps
    if op == "rms_norm":
        return (kf.rms_norm(inp["x"], inp["weight"], eps),)
    if op == "add_rms_norm":
        return kf.add_rms_norm(inp["x"], inp["residual"], inp["weight"], eps)
    if op == "layer_norm":
        return (kf.layer_norm(inp["x"], inp["weight"], inp["bias"], eps),)
    kind = op.rsplit("_", 1)[1]
    return (kf.ada_norm(inp["x"], inp["scale"], inp["shift"], inp["weight"], inp["bias"], eps, kind=kind),)


def run_ref(op, inp, dtype, eps=None):
    eps = EPS[op] if eps is None else eps
    if op == "rms_norm":
        return (rms_norm(inp["x"], inp["weight"], eps, dtype),)
    if op == "add_rms_norm":
        return add_rms_norm(inp["x"], inp["residual"], inp["weight"], eps, dtype)
    if op == "layer_norm":
        return (layer_norm(inp["x"], inp["weight"], inp["bias"], eps, dtype),)
    kind = op.rsplit("_", 1)[1]
    return (ada_norm(inp["x"], inp["scale"], inp["shift"], inp["weight"], inp["bias"], eps, kind, dtype),)


# ---- poisoned allocator ---------------------------------------------------------------------------
# The ops allocate their outputs. Filling the caching allocator's free blocks with NaN before a call
# makes any output element the kernel forgot to write show up as NaN (asserts use equal_nan=False).

_SMALL_BLOCK = 1 << 20  # requests up to 1 MiB come from the CUDA allocator's small pool
_LARGE_BLOCK = 256 << 20


def poison(device) -> None:
    device = torch.device(device)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.empty_cache()  # drop unpoisoned cached blocks so new allocations reuse ours
        small = [torch.full((_SMALL_BLOCK // 4,), float("nan"), device=device) for _ in range(32)]
        large = torch.full((_LARGE_BLOCK // 4,), float("nan"), device=device)
        del small, large
    else:
        t = torch.full((1 << 20,), float("nan"))
        del t
