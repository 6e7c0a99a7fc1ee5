"""Softmax ops: bad inputs raise clear errors that name the op, the argument and the expectation
(the checks are in the C++ core; the Python wrapper only handles dim)."""

from __future__ import annotations

import pytest
import torch

import sm_ref as S
from norm_ref import DEVICES


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.int32, torch.int64, torch.bool], ids=str)
@pytest.mark.parametrize("op", S.OPS)
def test_integer_and_bool_inputs(kf, op, dtype, device):
    x = torch.ones((4, 64), dtype=dtype, device=device)
    with pytest.raises(RuntimeError, match=f"{op}: x must be a (float32/float16/bfloat16|floating-point) tensor"):
        S.run(kf, op, x)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("op", S.OPS)
def test_backward_shape_and_dtype_mismatch(kf, op, device):
    ops = torch.ops.kernelforge
    bwd = getattr(ops, f"{op}_backward").default
    dy, y = torch.randn(4, 64, device=device), torch.randn(4, 63, device=device)
    with pytest.raises(RuntimeError, match=rf"{op}_backward: y must have shape \[4, 64\] \(the shape of g\), got \[4, 63\]"):
        bwd(dy, y)
    with pytest.raises(RuntimeError, match=f"{op}_backward: y must have the same dtype as g"):
        bwd(dy, torch.randn(4, 64, device=device).half())


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("op", S.OPS)
def test_raw_op_rejects_strided_last_dim(kf, op, device):
    """The op itself needs a contiguous last dimension (kernelforge.softmax makes it so)."""
    x = torch.randn(64, 32, device=device).t()
    with pytest.raises(RuntimeError, match=f"{op}: x must be contiguous in its last dimension"):
        getattr(torch.ops.kernelforge, op).default(x)


@pytest.mark.parametrize("op", S.OPS)
def test_raw_op_rejects_scalar(kf, op):
    with pytest.raises(RuntimeError, match=f"{op}: x must have between 1 and 8 dimensions, got 0"):
        getattr(torch.ops.kernelforge, op).default(torch.tensor(1.0))


@pytest.mark.cuda
@pytest.mark.parametrize("op", S.OPS)
def test_mixed_devices(kf, op):
    bwd = getattr(torch.ops.kernelforge, f"{op}_backward").default
    with pytest.raises(RuntimeError, match=f"{op}_backward: y must be on the same device as g"):
        bwd(torch.randn(4, 8, device="cuda"), torch.randn(4, 8))


@pytest.mark.parametrize("op", S.OPS)
def test_dim_out_of_range(kf, op):
    with pytest.raises(IndexError, match="Dimension out of range"):
        S.run(kf, op, torch.randn(3, 4), -3)
