"""Softmax ops on tensors of more than 2^31 elements (CUDA only): 64-bit row offsets in the forward
and backward kernels, with 128 K-element rows (the cluster path on sm_90).

The float64 reference of ~2^31 elements would take minutes on the host, so rows at both ends are
checked (the last ones lie past element 2^31; rows are independent), with every output allocated
from a NaN-filled block so that rows a kernel leaves unwritten fail.
"""

from __future__ import annotations

import pytest
import torch

import sm_ref as S

pytestmark = pytest.mark.cuda

N = 131072
M = (1 << 31) // N + 3  # 2^31 + 3·2^17 elements
ROWS = [0, 1, M // 2, M - 3, M - 2, M - 1]  # the last rows start past element 2^31
DT = torch.bfloat16


@pytest.fixture(scope="module")
def big():
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    free, _ = torch.cuda.mem_get_info()
    need = 5 * M * N * 2  # x, y, dy, dx and slack (bytes)
    if free < need:
        pytest.skip(f"needs {need / 2**30:.0f} GiB of free GPU memory, {free / 2**30:.0f} GiB free")
    x = S.logits((M, N), DT, "cuda")
    yield x
    del x
    torch.cuda.empty_cache()


def poison_next(shape):
    """The next allocation of `shape` reuses a NaN-filled block (the caching allocator hands back
    the block just freed)."""
    torch.full(shape, float("nan"), dtype=DT, device="cuda")
    torch.cuda.synchronize()


@pytest.mark.parametrize("op", S.OPS)
def test_forward_backward_over_2_31(kf, big, op):
    idx = torch.tensor(ROWS, device="cuda")
    x = big.detach().requires_grad_()
    poison_next((M, N))
    y = S.run(kf, op, x)
    xr = big.index_select(0, idx)
    S.assert_close(y.index_select(0, idx), S.ref(op, xr), DT, scaled=op == "log_softmax", msg=f"{op} > 2^31")
    dy = torch.randn((M, N), device="cuda", dtype=DT)
    poison_next((M, N))
    y.backward(dy)
    del y
    xd = xr.double().requires_grad_()
    getattr(torch, op)(xd, -1).backward(dy.index_select(0, idx).double())
    S.assert_close(x.grad.index_select(0, idx), xd.grad.to(DT), DT, scaled=True, msg=f"{op} dx > 2^31")
