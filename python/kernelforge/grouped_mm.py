"""The grouped_mm family: the grouped GEMMs of a mixture-of-experts layer, with autograd.

The ops (CUDA kernels, the float64 CPU reference) live in C++ (`torch/kf_grouped_mm.cpp`, which holds
the schemas); this module registers their fake implementations and the autograd of ``grouped_mm`` and
defines the functional API. Arguments are validated in C++ only.

Semantics (include/kernelforge/grouped_mm.h): x ``[T, K]`` holds the tokens sorted by expert, w
``[E, N, K]`` one weight per expert (nn.Linear layout; a transposed view of a ``[E, K, N]`` stack passes
without a copy), offsets int32 ``[E]`` the groups' row ends (``torch._grouped_mm``'s ``offs``). Rows of
group e: ``out[r] = x[r] @ w[e].T``. Group e owns rows ``[end(e-1), end(e))`` with ``end(e) =
clamp(max(offsets[:e+1]), 0, T)``: any offsets are safe; rows past the last end are written as 0.
float32 accumulation, each output rounded once. No group size reaches the host: no synchronization,
CUDA graphs capture the call.
"""

from __future__ import annotations

import torch

from ._ops import _ops

# ---- fake implementations (shape/dtype propagation for torch.compile, FakeTensor, meta) ----------


@torch.library.register_fake("kernelforge::grouped_mm")
def _grouped_mm_fake(x, w, offsets):
    return x.new_empty((x.shape[0], w.shape[1]))


@torch.library.register_fake("kernelforge::grouped_mm_wgrad")
def _grouped_mm_wgrad_fake(dy, x, offsets):
    return x.new_empty((offsets.shape[0], dy.shape[1], x.shape[1]))


_fwd = _ops.grouped_mm.default
_wgrad = _ops.grouped_mm_wgrad.default

# ---- autograd --------------------------------------------------------------------------------------
# out_e = x_e w[e]^T:  dx_e = dy_e w[e]  (grouped_mm with w's transposed view: [E, K, N], stride 1 along
# its middle dimension, which the kernels read as is),  dw[e] = dy_e^T x_e  (grouped_mm_wgrad: the
# reduction runs over the group's rows; an empty group's gradient is 0).


def _setup(ctx, inputs, output):
    x, w, offsets = inputs
    ctx.save_for_backward(x, w, offsets)


def _backward(ctx, dy):
    x, w, offsets = ctx.saved_tensors
    need_x, need_w = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
    dx = _fwd(dy, w.transpose(1, 2), offsets) if need_x else None
    dw = _wgrad(dy, x, offsets) if need_w else None
    return dx, dw, None


torch.library.register_autograd("kernelforge::grouped_mm", _backward, setup_context=_setup)


# ---- functional API ------------------------------------------------------------------------------


def grouped_mm(x: torch.Tensor, w: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
    """Per-expert products of tokens sorted by expert: ``out[r] = x[r] @ w[e].T`` for the rows r of group e.

    x ``[T, K]`` (row-major, any row stride), w ``[E, N, K]`` (each matrix with stride 1 along K or N:
    nn.Linear weights stacked, or ``w_kn.transpose(1, 2)`` of a ``[E, K, N]`` stack), offsets int32
    ``[E]``: the groups' cumulative row ends, as ``torch._grouped_mm``'s ``offs``
    (``torch.cumsum(tokens_per_expert, 0, dtype=torch.int32)``). bfloat16 / float16 on CUDA (any
    floating dtype on CPU, through the float64 reference). Differentiable in x and w; the weight
    gradient is a grouped GEMM of its own (``grouped_mm_wgrad``).

    On sm_90 with 16-byte aligned operands (N, K and strides multiples of 8) it runs CUTLASS's TMA +
    wgmma grouped GEMM; other calls run a portable tensor-core kernel.
    """
    return _fwd(x, w, offsets)


def grouped_mm_wgrad(dy: torch.Tensor, x: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
    """The weight gradient of :func:`grouped_mm`: ``dw[e] = dy_e.T @ x_e`` ``[E, N, K]`` (0 for an empty group)."""
    return _wgrad(dy, x, offsets)
