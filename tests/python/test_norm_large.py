"""Tensors of more than 2^31 elements (CUDA only): 64-bit addressing of rows in every kernel, with
AdaLN's scale/shift both as a small [4, 1, N] table and as an [M, N] one whose offsets pass 2^31.

The full float64 reference of ~2^31 elements per tensor would take minutes on the host, so the
forward is checked on rows at both ends (the last ones lie past element 2^31; rows are independent)
and the backward's dweight with a float64 column sum computed on the GPU in chunks.
"""

from __future__ import annotations

import pytest
import torch

import norm_ref as R
from kernelforge.specs.norm import ada_norm_ref, layer_norm_ref, rms_norm_ref

pytestmark = pytest.mark.cuda

N = 8192
M = (1 << 31) // N + 4  # 2^31 + 4·8192 elements (a multiple of 4: AdaLN's [4, M/4, N] view)
ROWS = [0, 1, M // 2, M - 3, M - 2, M - 1]  # the last rows start past element 2^31
DT = torch.bfloat16


@pytest.fixture(scope="module")
def big():
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    free, _ = torch.cuda.mem_get_info()
    need = 6 * M * N * 2  # x, dy, y/dx, scale, shift and slack (bytes)
    if free < need:
        pytest.skip(f"needs {need / 2**30:.0f} GiB of free GPU memory, {free / 2**30:.0f} GiB free")
    x = R.rand((M, N), DT, "cuda")
    yield x
    del x
    torch.cuda.empty_cache()


def poison_next():
    """The next [M, N] allocation reuses a NaN-filled block (the caching allocator hands back the
    block just freed), so rows a kernel leaves unwritten fail the check."""
    torch.full((M, N), float("nan"), dtype=DT, device="cuda")
    torch.cuda.synchronize()


def check_rows(out, ref_fn, msg):
    idx = torch.tensor(ROWS, device=out.device)
    R.assert_close(out.index_select(0, idx), ref_fn(idx), DT, msg=msg)


def test_rms_norm_forward(kf, big):
    w = R.rand((N,), DT, "cuda")
    poison_next()
    y = kf.rms_norm(big, w, eps=1e-6)
    check_rows(y, lambda i: rms_norm_ref(big.index_select(0, i), w, 1e-6, DT), "rms_norm > 2^31 elements")


def test_layer_norm_forward(kf, big):
    w, b = R.rand((N,), DT, "cuda"), R.rand((N,), DT, "cuda")
    poison_next()
    y = kf.layer_norm(big, w, b, eps=1e-5)
    check_rows(y, lambda i: layer_norm_ref(big.index_select(0, i), w, b, 1e-5, DT), "layer_norm > 2^31 elements")


@pytest.mark.parametrize("mod", ["per_batch", "per_row"])
def test_ada_norm_forward(kf, big, mod):
    """per_batch: scale [4, 1, N] (the group index of rows past element 2^31); per_row: scale [M, N]
    (offsets into scale/shift past 2^31)."""
    if mod == "per_batch":
        sc, sh = R.rand((4, 1, N), DT, "cuda", 0.1), R.rand((4, 1, N), DT, "cuda", 0.1)
        poison_next()
        y = kf.ada_norm(big.view(4, M // 4, N), sc, sh).view(M, N)
        sc2, sh2 = sc.view(4, N), sh.view(4, N)
        check_rows(y, lambda i: ada_norm_ref(big.index_select(0, i), sc2.index_select(0, i // (M // 4)),
                                           sh2.index_select(0, i // (M // 4)), None, None, 1e-6, "layer", DT),
                   "ada_norm [4,1,N] > 2^31 elements")
    else:
        sc, sh = R.rand((M, N), DT, "cuda", 0.1), R.rand((M, N), DT, "cuda", 0.1)
        poison_next()
        y = kf.ada_norm(big, sc, sh)
        check_rows(y, lambda i: ada_norm_ref(big.index_select(0, i), sc.index_select(0, i), sh.index_select(0, i),
                                           None, None, 1e-6, "layer", DT), "ada_norm [M,N] > 2^31 elements")


def test_rms_norm_backward(kf, big):
    """dx on the end rows, dweight against a float64 column sum over all rows (chunked, on the GPU)."""
    w = R.rand((N,), DT, "cuda").requires_grad_()
    x = big.detach().requires_grad_()
    dy = R.rand((M, N), DT, "cuda")
    y = kf.rms_norm(x, w, eps=1e-6)
    poison_next()  # for dx
    y.backward(dy)
    idx = torch.tensor(ROWS, device="cuda")
    xr = big.index_select(0, idx).double().requires_grad_()
    wr = w.detach().double().requires_grad_()
    rms_norm_ref(xr, wr, 1e-6, torch.float64).backward(dy.index_select(0, idx).double())
    R.assert_close(x.grad.index_select(0, idx), xr.grad, DT, grad=True, msg="rms_norm dx > 2^31 elements")
    del x
    dw = torch.zeros(N, dtype=torch.float64, device="cuda")
    for r0 in range(0, M, 16384):  # dweight = Σ_rows dy · T(x · rstd) in float64 (HF rounds x·rstd)
        xc = big[r0:r0 + 16384].double()
        xh = (xc * torch.rsqrt(xc.pow(2).mean(-1, keepdim=True) + 1e-6)).to(DT).double()
        dw += (dy[r0:r0 + 16384].double() * xh).sum(0)
    R.assert_close(w.grad, dw, DT, grad=True, msg="rms_norm dweight > 2^31 elements")
