"""The diagonal_matmul family: ``diag(a) @ b`` (row scaling), batched, with autograd.

The ops (CUDA kernels, the float64 CPU reference) live in C++ (`torch/kf_diagonal_matmul.cpp`, which
holds the schemas); this module registers their fake implementations and their autograd
(``torch.library.register_autograd``, for both ops: the backward is differentiable too, so double
backward works) and defines the functional API. Arguments are validated in C++ only.

Semantics: ``y = a.unsqueeze(-1) * b`` for b ``[..., M, N]`` and a either ``b.shape[:-1]`` (one scale
per row) or ``[M]`` (broadcast over b's batch dimensions). float32 math, each output rounded once to
the dtype (the same as eager PyTorch here: one product per element). The gradient of a is a float32
row sum (summed over the batch for a broadcast a, in a fixed order: bit-identical run to run).
"""

from __future__ import annotations

import torch

from ._ops import _ops

# ---- fake implementations (shape/dtype propagation for torch.compile, FakeTensor, meta) ----------


@torch.library.register_fake("kernelforge::diagonal_matmul")
def _diagonal_matmul_fake(a, b):
    return b.new_empty(b.shape)  # contiguous even when b is a row-strided view


@torch.library.register_fake("kernelforge::diagonal_matmul_backward")
def _diagonal_matmul_backward_fake(dy, a, b, need_a=True, need_b=True):
    return (a.new_empty(a.shape) if need_a else a.new_empty(0),
            b.new_empty(b.shape) if need_b else b.new_empty(0))


# OpOverloads resolved once: calling `.default` directly skips the overload-packet lookup.
_fwd = _ops.diagonal_matmul.default
_bwd = _ops.diagonal_matmul_backward.default

# ---- autograd --------------------------------------------------------------------------------------
# Forward y = a[r] * b[r, n]:  da[r] = Σ_n dy[r, n] b[r, n] (Σ over the batch too for a broadcast a),
# db = a[r] * dy[r, n]: one fused kernel (diagonal_matmul_backward), each gradient only when needed.


def _setup(ctx, inputs, output):
    a, b = inputs
    ctx.save_for_backward(a, b)


def _backward(ctx, dy):
    a, b = ctx.saved_tensors
    need_a, need_b = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
    if not (need_a or need_b):
        return None, None
    da, db = _bwd(dy, a, b, need_a, need_b)
    return (da if need_a else None), (db if need_b else None)


torch.library.register_autograd("kernelforge::diagonal_matmul", _backward, setup_context=_setup)

# The backward (da, db) = (Σ_n dy·b, a·dy) is bilinear; with incoming gradients (gda, gdb):
#   d(dy) = gda[r]·b + a·gdb,   d(a) = Σ_n gdb·dy,   d(b) = gda[r]·dy,
# each again a diagonal_matmul (d(a): the da of diagonal_matmul_backward(gdb, a, dy)).


def _bwd_setup(ctx, inputs, output):
    dy, a, b, need_a, need_b = inputs
    ctx.save_for_backward(dy, a, b)
    ctx.computed = (need_a, need_b)


def _bwd_backward(ctx, gda, gdb):
    dy, a, b = ctx.saved_tensors
    has_a, has_b = ctx.computed
    gda = gda if has_a else None  # an output that was not computed (an empty placeholder) has no gradient
    gdb = gdb if has_b else None
    want_dy, want_a, want_b = ctx.needs_input_grad[:3]
    d_dy = d_a = d_b = None
    if want_dy:
        terms = ([_fwd(gda, b)] if gda is not None else []) + ([_fwd(a, gdb)] if gdb is not None else [])
        d_dy = sum(terms[1:], terms[0]) if terms else None
    if want_a and gdb is not None:
        d_a = _bwd(gdb, a, dy, True, False)[0]
    if want_b and gda is not None:
        d_b = _fwd(gda, dy)
    return d_dy, d_a, d_b, None, None


torch.library.register_autograd("kernelforge::diagonal_matmul_backward", _bwd_backward, setup_context=_bwd_setup)


# ---- functional API ------------------------------------------------------------------------------


def diagonal_matmul(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``diag(a) @ b``: ``a.unsqueeze(-1) * b``, one fused kernel per direction.

    b ``[..., M, N]`` (last dimension contiguous; row-strided views such as ``big[:, :N]`` work
    without a copy); a ``b.shape[:-1]`` (one scale per row) or ``[M]`` (one scale per matrix row,
    broadcast over b's batch dimensions); a and b share the dtype (float32 / float16 / bfloat16 on
    CUDA; any floating dtype on CPU, through the float64 reference). Differentiable in a and b.
    """
    return _fwd(a, b)
