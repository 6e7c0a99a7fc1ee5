"""Test harness of the norm family, shared by the other families' tests: devices and dtypes, the
tolerance comparison, random inputs, memory layouts, the NaN-poisoned allocator, and the op table the
norm tests are driven by.

The float64 references and the one tolerance table live in kernelforge.specs (specs/norm.py,
specs/_spec.py TOL); the names below re-export them for the tests that use this module.
"""

from __future__ import annotations

import math

import pytest
import torch

from kernelforge.specs import TOL as SPEC_TOL
from kernelforge.specs.norm import EPS as SPEC_EPS
from kernelforge.specs.norm import ada_norm_ref as ada_norm
from kernelforge.specs.norm import add_rms_norm_ref as add_rms_norm
from kernelforge.specs.norm import layer_norm_ref as layer_norm
from kernelforge.specs.norm import rms_norm_ref as rms_norm

f64 = torch.float64

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.cuda)]

# Views of the one tolerance table (kernelforge.specs.TOL): outputs with rtol = atol = TOL[dtype];
# gradients with rtol = GRAD_TOL[dtype] and atol = GRAD_TOL[dtype] * max|reference| (dx and dweight
# involve row/column reductions whose terms cancel, so elementwise relative error is meaningless near 0).
TOL = {dt: t.out for dt, t in SPEC_TOL.items()}
GRAD_TOL = {dt: t.grad for dt, t in SPEC_TOL.items()}

DTYPES = [torch.float32, torch.float16, torch.bfloat16]


def assert_close(actual, expected, dtype, *, grad=False, msg=""):
    tol = (GRAD_TOL if grad else TOL)[dtype]
    if not grad:  # gradient references stay float64
        assert actual.dtype == expected.dtype, f"{msg}: dtype {actual.dtype} != {expected.dtype}"
    assert actual.shape == expected.shape, f"{msg}: shape {tuple(actual.shape)} != {tuple(expected.shape)}"
    a, e = actual.detach().double().cpu(), expected.detach().double().cpu()
    atol = tol * max(1.0, e.abs().max().item()) if grad and e.numel() else tol
    torch.testing.assert_close(a, e, rtol=tol, atol=atol, equal_nan=False, msg=lambda m: f"{msg}\n{m}")


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
EPS = {op: SPEC_EPS["ada_norm" if op.startswith("ada_norm") else op] for op in OPS}
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
