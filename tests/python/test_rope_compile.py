"""torch.compile (fullgraph, no recompiles) of apply_rope: functional with autograd, and in place
(the mutating op through functionalization), on a fused qkv projection."""

from __future__ import annotations

import pytest
import torch

import norm_ref as R

COMPILE_CASES = [pytest.param("cpu", torch.float32, "aot_eager", id="cpu-aot_eager")] + [
    pytest.param("cuda", torch.bfloat16, "inductor", id="cuda-inductor", marks=pytest.mark.cuda)
]


def attention_inputs(x, cos, sin, kf, inplace, interleaved):
    B, S, _ = x.shape
    # x * 2 is exact in every dtype: inductor computes elementwise ops in float32 without rounding
    # the bf16 intermediate (x * 1.5 differed from eager by a bf16 ulp, 0.01 after the sum and sin)
    qkv = (x * 2.0).view(B, S, 12, 16)  # Hq = 8, Hk = 2, Hv = 2, D = 16
    q, k, v = qkv.split([8, 2, 2], dim=2)
    q, k = kf.apply_rope(q, k, cos, sin, interleaved=interleaved, inplace=inplace)
    return (q.float().sum(2) + k.float().sum(2) + v.float().sum(2)).sin()


@pytest.mark.parametrize("device,dtype,backend", COMPILE_CASES)
@pytest.mark.parametrize("interleaved", [False, True])
def test_compile_autograd(kf, device, dtype, backend, interleaved):
    torch._dynamo.reset()
    B, S = 2, 5
    x = R.rand((B, S, 12 * 16), dtype, device).requires_grad_()
    cos, sin = torch.randn(S, 16, device=device), torch.randn(S, 16, device=device)
    fn = lambda x: attention_inputs(x, cos, sin, kf, False, interleaved)  # noqa: E731
    compiled = torch.compile(fn, backend=backend, fullgraph=True)
    with torch._dynamo.config.patch(error_on_recompile=True):
        y = compiled(x)
        (g,) = torch.autograd.grad(y.sum(), x)
        y2 = compiled(x)
    y_eager = fn(x)
    (g_eager,) = torch.autograd.grad(y_eager.sum(), x)
    torch.testing.assert_close(y, y_eager)
    torch.testing.assert_close(y2, y_eager)
    torch.testing.assert_close(g, g_eager)


@pytest.mark.parametrize("device,dtype,backend", COMPILE_CASES)
def test_compile_inplace(kf, device, dtype, backend):
    torch._dynamo.reset()
    B, S = 2, 5
    x = R.rand((B, S, 12 * 16), dtype, device)
    cos, sin = torch.randn(S, 16, device=device), torch.randn(S, 16, device=device)
    fn = lambda x: attention_inputs(x, cos, sin, kf, True, False)  # noqa: E731
    compiled = torch.compile(fn, backend=backend, fullgraph=True)
    torch.testing.assert_close(compiled(x), fn(x))
