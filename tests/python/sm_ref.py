"""float64 references and the tolerance table of the softmax tests.

The reference is torch's own softmax / log_softmax in float64, rounded once to the dtype (the
kernels compute in float32 and round once). One tolerance table per dtype: the kernels' error is
relative to the terms of each formula, so softmax outputs are compared relatively (atol only covers
flushed denormals) and log_softmax outputs and gradients with an atol scaled by the largest reference
magnitude (the terms that cancel are of that size).
"""

from __future__ import annotations

import torch

# rtol per dtype (one rounding to the dtype, plus float32 math for float32)
RTOL = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1.6e-2, torch.float64: 1e-12}
# smallest magnitudes a kernel may flush or round differently (ex2.ftz flushes below 2^-126;
# float16 subnormals go down to 2^-24)
FLOOR = {torch.float32: 1e-37, torch.float16: 6e-8, torch.bfloat16: 1e-37, torch.float64: 1e-300}
OPS = ["softmax", "log_softmax"]


def ref(op: str, x: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """torch's op in float64, rounded to x's dtype."""
    f = torch.softmax if op == "softmax" else torch.log_softmax
    return f(x.double(), dim).to(x.dtype)


def run(kf, op: str, x: torch.Tensor, dim: int = -1) -> torch.Tensor:
    return getattr(kf, op)(x, dim)


def assert_close(actual, expected, dtype, *, scaled=False, msg=""):
    """|a - e| <= rtol |e| + atol; atol = rtol * max|e| (scaled: log_softmax, gradients) or the floor."""
    rtol = RTOL[dtype]
    a, e = actual.detach().double().cpu(), expected.detach().double().cpu()
    assert a.shape == e.shape, f"{msg}: shape {tuple(a.shape)} != {tuple(e.shape)}"
    finite = e[torch.isfinite(e)]
    atol = rtol * max(1.0, finite.abs().max().item()) if scaled and finite.numel() else FLOOR[dtype]
    torch.testing.assert_close(a, e, rtol=rtol, atol=atol, equal_nan=True, msg=lambda m: f"{msg}\n{m}")


def logits(shape, dtype, device, scale=4.0) -> torch.Tensor:
    """Normal logits times `scale` with a per-row offset: rows do not share a max."""
    x = torch.randn(shape, dtype=torch.float32, device=device) * scale
    if len(shape) >= 1 and shape[-1] > 0:
        x = x + torch.randn((*shape[:-1], 1), device=device) * 10.0
    return x.to(dtype)
