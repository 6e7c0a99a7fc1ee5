"""The dropout family: fake implementations, autograd and the functional API of dropout and
dropout_add (the pre-norm block's ``hidden = residual + dropout(attn_out)`` in one pass).

The ops (CUDA kernels, the float64 CPU reference, the generator) live in C++ (`torch/kf_dropout.cpp`,
which holds the schemas). Random bits come from a counter-based Philox4x32-10 of (seed, offset,
element index): the forward returns the (seed, offset) it used as a 2-element int64 tensor on the
device (``rng_state``) and the backward regenerates the mask from it, so no mask is stored (nor read
back on the host: CUDA-graph capture and replay work, each replay drawing a new mask). The CUDA
generator (given, or the device's default) advances by 4 per call, never overlapping PyTorch's own
random ops: ``torch.manual_seed`` reproduces the masks. CPU tensors run the reference; given a CUDA
generator they get the masks a CUDA call with it would give.

Semantics follow F.dropout: ``y = x * mask / (1 - p)`` (a dropped inf / NaN gives NaN, as x * 0);
``training=False`` or ``p = 0`` returns x itself; ``p = 1`` gives ``x * 0`` (zeros for finite x) and
zero gradients. Each element takes 16 random bits (one Philox call per 8 elements): the keep
probability is ``round((1 - p) 65536) / 65536`` (exact for p = 0 and 1, within 2^-17 of 1 - p).
"""

from __future__ import annotations

import torch

from ._ops import _ops

# ---- fake implementations (shape/dtype propagation for torch.compile, FakeTensor, meta) ----------


@torch.library.register_fake("kernelforge::dropout")
def _dropout_fake(x, p=0.5, generator=None, return_mask=False):
    mask = x.new_empty(x.shape if return_mask else (0,), dtype=torch.bool)
    return x.new_empty(x.shape), x.new_empty((2,), dtype=torch.int64), mask


@torch.library.register_fake("kernelforge::dropout_add")
def _dropout_add_fake(x, residual, p=0.5, generator=None):
    torch._check(residual.shape == x.shape,
                 lambda: f"dropout_add: residual must have the shape of x {list(x.shape)}, got {list(residual.shape)}")
    return x.new_empty(x.shape), x.new_empty((2,), dtype=torch.int64)


@torch.library.register_fake("kernelforge::dropout_backward")
def _dropout_backward_fake(dy, rng_state, p):
    return dy.new_empty(dy.shape)


# ---- autograd: the backward regenerates the mask from rng_state ----------------------------------
_dropout_backward = _ops.dropout_backward.default


def _dropout_setup(ctx, inputs, output):
    ctx.p = inputs[1]
    ctx.save_for_backward(output[1])


def _dropout_bwd(ctx, dy, _d_state, _d_mask):
    (state,) = ctx.saved_tensors
    return _dropout_backward(dy, state, ctx.p), None, None, None


def _dropout_add_setup(ctx, inputs, output):
    ctx.p = inputs[2]
    ctx.save_for_backward(output[1])


def _dropout_add_bwd(ctx, dy, _d_state):
    (state,) = ctx.saved_tensors
    dx = _dropout_backward(dy, state, ctx.p) if ctx.needs_input_grad[0] else None
    return dx, dy, None, None  # dresidual = dy, no copy


def _backward_setup(ctx, inputs, output):
    ctx.p = inputs[2]
    ctx.save_for_backward(inputs[1])


def _backward_bwd(ctx, ddx):
    (state,) = ctx.saved_tensors  # dx = dy * f is linear in dy: its gradient is the same op
    return _dropout_backward(ddx, state, ctx.p), None, None


torch.library.register_autograd("kernelforge::dropout", _dropout_bwd, setup_context=_dropout_setup)
torch.library.register_autograd("kernelforge::dropout_backward", _backward_bwd, setup_context=_backward_setup)
torch.library.register_autograd("kernelforge::dropout_add", _dropout_add_bwd, setup_context=_dropout_add_setup)


def _exclude_from_cse() -> None:
    """AOTAutograd's common-subexpression pass merges identical calls of a functional op; it spares
    the random ops of its own list (compile_utils.rand_ops: aten.native_dropout, ...) but reads no op
    tag, so two kf.dropout(x) calls in one compiled training graph would share a mask. The forward ops
    join that list (tests/python/test_dropout.py checks two calls differ under torch.compile)."""
    try:
        from torch._functorch import compile_utils  # noqa: PLC0415
    except ImportError:  # pragma: no cover (a torch without the pass)
        return
    for op in (_ops.dropout, _ops.dropout_add):
        if op not in compile_utils.rand_ops:
            compile_utils.rand_ops.append(op)


_exclude_from_cse()

# ---- functional API ------------------------------------------------------------------------------
_dropout = _ops.dropout.default
_dropout_add = _ops.dropout_add.default


def _check_p(name: str, p: float) -> None:
    # the C++ core checks p too; this covers the calls that return before reaching it
    if not 0.0 <= p <= 1.0:
        raise ValueError(f"{name}: p must lie in [0, 1], got {p}")


def dropout(x: torch.Tensor, p: float = 0.5, training: bool = True, generator: torch.Generator | None = None,
            return_mask: bool = False):
    """``F.dropout(x, p, training)``: ``y = x * mask / (1 - p)``, mask ~ Bernoulli(1 - p) per element.

    ``training=False`` or ``p = 0`` returns x itself (as F.dropout). ``generator``: a CUDA generator
    (default: the device's); for CPU tensors a CPU or CUDA generator. ``return_mask=True`` returns
    ``(y, mask)`` with mask a bool tensor of x's shape (True = kept), as torch.native_dropout.
    Differentiable in x: the backward regenerates the mask (nothing but 16 bytes is saved).
    """
    if not training or p == 0.0:
        _check_p("dropout", p)
        return (x, torch.ones_like(x, dtype=torch.bool)) if return_mask else x
    y, _, mask = _dropout(x, p, generator, return_mask)
    return (y, mask) if return_mask else y


def dropout_add(x: torch.Tensor, residual: torch.Tensor, p: float = 0.5, training: bool = True,
                generator: torch.Generator | None = None) -> torch.Tensor:
    """``residual + F.dropout(x, p, training)`` in one pass, rounded once (eager rounds the dropout
    first). x and residual have one shape and dtype. ``training=False`` gives ``residual + x``.
    Differentiable in both: ``dx = dy * mask / (1 - p)``, ``dresidual = dy``.
    """
    if not training:
        _check_p("dropout_add", p)
        p = 0.0
    y, _ = _dropout_add(x, residual, p, generator)
    return y
