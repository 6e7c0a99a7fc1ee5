"""The fused_linear_rowsum family: fake (meta) implementations of its ops and the functional API.

``fused_linear_rowsum(x, weight, bias)`` is ``F.linear(x, weight, bias).sum(-1)`` without the
``[..., out_features]`` product: ``y = x @ weight.sum(0) + bias.sum()``, with the column sums of the
weight in float32 and fixed-order (deterministic) reductions. The ops (CUDA kernels, the float64 CPU
reference, autograd) live in C++ (`torch/kf_fused_linear_rowsum.cpp`, which holds the schemas); `_ops`
loads the library. The forward keeps the float32 column sums ``w_sum`` [K] for the backward instead of
the weight.

Shapes: x ``[..., K]``, weight ``[O, K]``, bias ``[O]`` or None, y ``x.shape[:-1]`` (for x
``[batch, K]``: ``[batch]``, as Flash-Kernels-v2's FusedLinearRowSum; ``y.unsqueeze(-1)`` gives the
keepdim form). x, weight and bias share one dtype (float32, float16, bfloat16).
"""

from __future__ import annotations

import torch

from ._ops import _ops

# ---- fake implementations (shape/dtype propagation for torch.compile, FakeTensor, meta) ----------


def _rows_out(x: torch.Tensor) -> torch.Tensor:
    return x.new_empty(x.shape[:-1])


@torch.library.register_fake("kernelforge::fused_linear_rowsum")
def _fused_linear_rowsum_fake(x, weight, bias=None):
    return _rows_out(x)


@torch.library.register_fake("kernelforge::fused_linear_rowsum_forward")
def _fused_linear_rowsum_forward_fake(x, weight, bias):
    w_sum_dtype = torch.float64 if x.dtype == torch.float64 else torch.float32
    return _rows_out(x), x.new_empty((x.shape[-1],), dtype=w_sum_dtype)


@torch.library.register_fake("kernelforge::fused_linear_rowsum_backward")
def _fused_linear_rowsum_backward_fake(dy, x, w_sum, weight, grad_x, grad_weight, grad_bias):
    dx = x.new_empty(x.shape) if grad_x else x.new_empty((0,))
    dw = x.new_empty(weight.shape) if grad_weight else x.new_empty((0,))
    db = x.new_empty((weight.shape[0],)) if grad_bias else x.new_empty((0,))
    return dx, dw, db


# ---- functional API ------------------------------------------------------------------------------
_fused_linear_rowsum = _ops.fused_linear_rowsum.default


def fused_linear_rowsum(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``F.linear(x, weight, bias).sum(-1)`` without materializing the linear output.

    x ``[..., in_features]``, weight ``[out_features, in_features]``, bias ``[out_features]`` or None;
    returns ``x.shape[:-1]``. Differentiable in x, weight and bias (the weight and bias gradients are
    the same row / value broadcast over out_features).
    """
    return _fused_linear_rowsum(x, weight, bias)
