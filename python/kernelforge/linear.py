"""The linear family: the fake (meta) implementation of kernelforge::linear and the functional API.

The op lives in C++ (`torch/kf_linear.cpp`; the contract in include/kernelforge/linear.h), arguments
are validated there: nn.Linear's y = x W^T (+ bias) with x [..., K], w [N, K], bias [N], y [..., N]
(x's dtype, contiguous). CUDA: a skinny GEMM for the few rows of a decode step (M <= 16 rows, the
leading dims of x flattened; float16 / bfloat16, float32 accumulation, y rounded once), bound by
reading W once; CPU tensors run the float64 C++ reference. The backward is torch's GEMMs.
"""

from __future__ import annotations

import math

import torch

from ._ops import _ops

MAX_ROWS = 16  # include/kernelforge/linear.h's kLinearMaxRows: the CUDA kernel's rows


# ---- fake implementation --------------------------------------------------------------------------


@torch.library.register_fake("kernelforge::linear")
def _linear_fake(x, w, bias):
    # The C++ impl's shape (kf_linear.cpp): y contiguous [..., N] in x's dtype.
    if x.dim() < 1:
        raise ValueError("linear: x must have at least 1 dimension [..., K], got a scalar")
    if w.dim() != 2:
        raise ValueError(f"linear: w must have 2 dimensions [N, K] (nn.Linear's weight), got {w.dim()}")
    return x.new_empty((*x.shape[:-1], w.shape[0]))


# ---- functional API -------------------------------------------------------------------------------


def linear(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``torch.nn.functional.linear(x, w, bias)``: y = x w^T + bias, x [..., K], w [N, K] (nn.Linear's
    weight, any row stride), bias [N] or None; y [..., N] contiguous in x's dtype. Differentiable in x,
    w and bias (the backward is torch's GEMMs: dx = dy w, dw = dy^T x, dbias = dy summed over rows).

    By design, not a fallback: on CUDA the kernelforge kernel serves the few rows of a decode step,
    M = x.numel() // K <= 16 (the leading dims of x flattened), where reading W once is the whole
    cost; larger M (prefill, training) is a compute-bound GEMM and goes to cuBLAS through
    ``torch.nn.functional.linear``, silently, until kernelforge has a GEMM family. CPU tensors (any M)
    run the float64 C++ reference; float64 CUDA tensors with M <= 16 run it too, once warned
    (KF_STRICT=1: an error); float32 CUDA tensors with M <= 16 are refused (the kernel takes float16
    and bfloat16).
    """
    if x.is_cuda and x.dim() > 0 and math.prod(x.shape[:-1]) > MAX_ROWS:
        return torch.nn.functional.linear(x, w, bias)
    return _ops.linear(x, w, bias)


__all__ = ["linear"]
