"""Activation ops on tensors of more than 2^31 elements (CUDA only): 64-bit row offsets in the
forward and backward kernels, for the fused [M, 2I] layout (both halves of one row), two row-strided
views of one buffer, and a flat gelu.

The float64 reference of ~2^31 elements would take minutes on the host, so rows at both ends are
checked (the last ones lie past element 2^31; rows are independent), with every output allocated
from a NaN-filled block so that rows a kernel leaves unwritten fail.
"""

from __future__ import annotations

import pytest
import torch

import norm_ref as R
from kernelforge.specs.activation import geglu_ref, gelu_ref, silu_and_mul_ref

pytestmark = pytest.mark.cuda

I = 8192
M = (1 << 31) // (2 * I) + 4  # x [M, 2I] has 2^31 + 4·16384 elements
ROWS = [0, 1, M // 2, M - 3, M - 2, M - 1]  # the last rows start past element 2^31
DT = torch.bfloat16


@pytest.fixture(scope="module")
def big():
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    free, _ = torch.cuda.mem_get_info()
    need = 5 * M * 2 * I * 2  # x, dx, y / dy / dgate-dup and slack (bytes)
    if free < need:
        pytest.skip(f"needs {need / 2**30:.0f} GiB of free GPU memory, {free / 2**30:.0f} GiB free")
    x = R.rand((M, 2 * I), DT, "cuda", scale=2.0)
    yield x
    del x
    torch.cuda.empty_cache()


def poison_next(shape):
    """The next allocation of `shape` reuses a NaN-filled block (the caching allocator hands back
    the block just freed)."""
    torch.full(shape, float("nan"), dtype=DT, device="cuda")
    torch.cuda.synchronize()


def rows_of(t, idx):
    return t.index_select(0, idx)


def test_silu_and_mul_forward_backward(kf, big):
    idx = torch.tensor(ROWS, device="cuda")
    poison_next((M, I))
    y = kf.silu_and_mul(big)
    R.assert_close(rows_of(y, idx), silu_and_mul_ref(rows_of(big, idx), DT), DT, msg="silu_and_mul > 2^31")
    del y
    x = big.detach().requires_grad_()
    dy = R.rand((M, I), DT, "cuda")
    out = kf.silu_and_mul(x)
    poison_next((M, 2 * I))  # for dx
    out.backward(dy)
    del out
    xr = rows_of(big, idx).double().requires_grad_()
    silu_and_mul_ref(xr, torch.float64).backward(rows_of(dy, idx).double())
    R.assert_close(rows_of(x.grad, idx), xr.grad, DT, grad=True, msg="silu_and_mul dx > 2^31")


def test_geglu_strided_halves(kf, big):
    """hidden, gate = big.chunk(2, -1): two row-strided views whose last rows lie past 2^31."""
    idx = torch.tensor(ROWS, device="cuda")
    hidden, gate = big.chunk(2, dim=-1)
    poison_next((M, I))
    y = kf.geglu(hidden, gate, approximate="tanh")
    want = geglu_ref(rows_of(hidden, idx), rows_of(gate, idx), "tanh", DT)
    R.assert_close(rows_of(y, idx), want, DT, msg="geglu > 2^31")


def test_gelu_flat(kf, big):
    idx = torch.tensor(ROWS, device="cuda")
    poison_next((M, 2 * I))
    y = kf.gelu(big)
    R.assert_close(rows_of(y, idx), gelu_ref(rows_of(big, idx), "none", DT), DT, msg="gelu > 2^31")
