"""The linear family: the fake (meta) implementation of kernelforge::linear and the functional API.

The op lives in C++ (`torch/kf_linear.cpp`; the contract in include/kernelforge/linear.h), arguments
are validated there: nn.Linear's y = x W^T (+ bias) with x [..., K], w [N, K], bias [N], y [..., N]
(x's dtype, contiguous). CUDA: a skinny GEMM for the few rows of a decode step (M <= 16 rows, the
leading dims of x flattened; float16 / bfloat16, float32 accumulation, y rounded once), bound by
reading W once; CPU tensors run the float64 C++ reference. The backward is torch's GEMMs. More rows,
or an activation: kernelforge.gemm (gemm.py), cuBLASLt with the epilogue fused.
"""

from __future__ import annotations

import math

import torch

from ._ops import _ops
from .gemm import linear_act

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


def linear(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None = None,
           activation: str | None = None) -> torch.Tensor:
    """``torch.nn.functional.linear(x, w, bias)``, then ``activation``: y = act(x w^T + bias), x [..., K],
    w [N, K] (nn.Linear's weight, any row stride), bias [N] or None, activation None, 'relu' or
    'gelu_tanh' (F.gelu(approximate='tanh')); y [..., N] contiguous in x's dtype. Differentiable in x, w
    and bias.

    On CUDA (float16 / bfloat16) two kernels serve it:
      - without an activation, M = x.numel() // K <= 16 rows (a decode step): the skinny kernel, bound
        by reading W once (the backward: torch's GEMMs);
      - otherwise the GEMM family (kernelforge.gemm: cuBLASLt with the bias and the activation fused
        into the GEMM's epilogue; the backward two GEMMs with the bias gradient fused, see gemm.py).
    float32 CUDA tensors without an activation go to ``torch.nn.functional.linear`` when M > 16 (the
    kernels take 16-bit types), float64 ones run the float64 reference once warned (KF_STRICT=1: an
    error). CPU tensors (any M) run the float64 C++ reference.
    """
    if activation is None:
        if x.is_cuda and x.dim() > 0 and math.prod(x.shape[:-1]) > MAX_ROWS:
            if x.dtype in (torch.float16, torch.bfloat16):
                return linear_act(x, w, bias, "none")
            return torch.nn.functional.linear(x, w, bias)
        return _ops.linear(x, w, bias)
    return linear_act(x, w, bias, activation)


__all__ = ["linear"]
