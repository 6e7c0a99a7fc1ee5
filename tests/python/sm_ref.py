"""Test harness of the softmax family: inputs, calls and the comparison.

The references (torch's softmax / log_softmax in float64, rounded once to the dtype) live in
kernelforge.specs.softmax; tolerances are the one table kernelforge.specs.TOL: softmax outputs are
compared relatively (TOL.out, atol only TOL.floor for flushed denormals), log_softmax outputs and the
gradients with an atol of TOL.out * max|reference| (the terms that cancel are of that size).
"""

from __future__ import annotations

import torch

from kernelforge.specs import TOL
from kernelforge.specs.softmax import REFS

OPS = ["softmax", "log_softmax"]


def ref(op: str, x: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """torch's op in float64, rounded to x's dtype."""
    return REFS[op](x, dim)


def run(kf, op: str, x: torch.Tensor, dim: int = -1) -> torch.Tensor:
    return getattr(kf, op)(x, dim)


def assert_close(actual, expected, dtype, *, scaled=False, msg=""):
    """|a - e| <= rtol |e| + atol; atol = rtol * max|e| (scaled: log_softmax, gradients) or the floor."""
    rtol = TOL[dtype].out
    a, e = actual.detach().double().cpu(), expected.detach().double().cpu()
    assert a.shape == e.shape, f"{msg}: shape {tuple(a.shape)} != {tuple(e.shape)}"
    finite = e[torch.isfinite(e)]
    atol = rtol * max(1.0, finite.abs().max().item()) if scaled and finite.numel() else TOL[dtype].floor
    torch.testing.assert_close(a, e, rtol=rtol, atol=atol, equal_nan=True, msg=lambda m: f"{msg}\n{m}")


def logits(shape, dtype, device, scale=4.0) -> torch.Tensor:
    """Normal logits times `scale` with a per-row offset: rows do not share a max."""
    x = torch.randn(shape, dtype=torch.float32, device=device) * scale
    if len(shape) >= 1 and shape[-1] > 0:
        x = x + torch.randn((*shape[:-1], 1), device=device) * 10.0
    return x.to(dtype)
