"""apply_rope on q of more than 2^31 elements (CUDA only): 64-bit token/head offsets. Tokens at both
ends are checked against the CPU reference on slices (tokens are independent); the output comes from
a NaN-filled block so that tokens the kernel leaves unwritten fail."""

from __future__ import annotations

import pytest
import torch

import norm_ref as R

pytestmark = pytest.mark.cuda

H, D = 32, 128
S = (1 << 31) // (H * D) + 3  # q [1, S, H, D] has 2^31 + 3·4096 elements
TOKENS = [0, 1, S // 2, S - 2, S - 1]  # the last tokens start past element 2^31
DT = torch.bfloat16


@pytest.mark.parametrize("interleaved", [False, True])
def test_large_q(kf, interleaved):
    free, _ = torch.cuda.mem_get_info()
    need = 3 * S * H * D * 2
    if free < need:
        pytest.skip(f"needs {need / 2**30:.0f} GiB of free GPU memory, {free / 2**30:.0f} GiB free")
    q = R.rand((1, S, H, D), DT, "cuda")
    k = R.rand((1, S, 1, D), DT, "cuda")
    cos, sin = torch.rand(S, D, device="cuda"), torch.rand(S, D, device="cuda")
    torch.cuda.empty_cache()
    filler = torch.full((S * H * D,), float("nan"), dtype=DT, device="cuda")
    del filler  # the output reuses the NaN-filled block
    q_out, k_out = kf.apply_rope(q, k, cos, sin, interleaved=interleaved)
    for t in TOKENS:
        sl = slice(t, t + 1)
        want_q, want_k = kf.apply_rope(
            q[:, sl].cpu(), k[:, sl].cpu(), cos[sl].cpu(), sin[sl].cpu(), interleaved=interleaved
        )
        R.assert_close(q_out[:, sl].cpu(), want_q, DT, msg=f"q token {t}")
        R.assert_close(k_out[:, sl].cpu(), want_k, DT, msg=f"k token {t}")
