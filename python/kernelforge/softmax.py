"""The softmax family: fake (meta) implementations of its ops and the functional API.

The ops (CUDA kernels, the float64 CPU reference, autograd) live in C++ (`torch/kf_softmax.cpp`,
which holds the schemas); `_ops` loads the library. The kernels work over the last dimension;
``dim`` other than the last is handled here (moved last, made contiguous, moved back), which costs
one copy in and one out.

Semantics: float32 math, one rounding per output to the input dtype; NaN, +inf and all -inf rows
give NaN as ``torch.softmax`` does.
"""

from __future__ import annotations

import torch

from ._ops import _ops

# ---- fake implementations (shape/dtype propagation for torch.compile, FakeTensor, meta) ----------
# Outputs are contiguous, with the input's shape, dtype and device.


def _like(t: torch.Tensor) -> torch.Tensor:
    return t.new_empty(t.shape)  # contiguous even when t is a row-strided view


@torch.library.register_fake("kernelforge::softmax")
def _softmax_fake(x):
    return _like(x)


@torch.library.register_fake("kernelforge::log_softmax")
def _log_softmax_fake(x):
    return _like(x)


@torch.library.register_fake("kernelforge::softmax_backward")
def _softmax_backward_fake(dy, y):
    return _like(y)


@torch.library.register_fake("kernelforge::log_softmax_backward")
def _log_softmax_backward_fake(dy, y):
    return _like(y)


# ---- functional API ------------------------------------------------------------------------------
# OpOverloads resolved once: calling `.default` directly skips the overload-packet lookup.
_softmax = _ops.softmax.default
_log_softmax = _ops.log_softmax.default


def _over_dim(op, x: torch.Tensor, dim: int) -> torch.Tensor:
    nd = x.dim()
    if nd == 0:  # a scalar is a row of one element (torch.softmax accepts dim 0 or -1 there)
        if dim not in (0, -1):
            raise IndexError(f"Dimension out of range (expected to be in range of [-1, 0], but got {dim})")
        return op(x.reshape(1)).reshape(())
    if not -nd <= dim < nd:
        raise IndexError(f"Dimension out of range (expected to be in range of [{-nd}, {nd - 1}], but got {dim})")
    d = dim % nd
    if d == nd - 1:
        if x.shape[-1] > 1 and x.stride(-1) != 1:  # the kernels need a contiguous last dimension
            x = x.contiguous()
        return op(x)
    return op(x.movedim(d, -1).contiguous()).movedim(-1, d)


def softmax(x: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """Softmax along ``dim`` (default: the last dimension), like ``torch.softmax(x, dim)``.

    Per row: ``m = max_j x_j``, ``s = sum_j exp(x_j - m)``, ``y_j = exp(x_j - m) / s``, in float32,
    rounded once to x's dtype (float32, float16, bfloat16; float64 on CPU, or on CUDA through the
    CPU reference with a warning). ``dim`` other than the last: x is moved so that ``dim`` is last,
    made contiguous, and the result moved back (one extra copy each way). Differentiable in x:
    ``dx = y * (g - sum(g * y))``.
    """
    return _over_dim(_softmax, x, dim)


def log_softmax(x: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """Log-softmax along ``dim`` (default: the last dimension), like ``torch.log_softmax(x, dim)``.

    Per row: ``y_j = x_j - m - log(s)`` with ``m`` and ``s`` as in :func:`softmax`; float32 math,
    one rounding to x's dtype; ``dim`` handled as in :func:`softmax`. Differentiable in x:
    ``dx = g - exp(y) * sum(g)``.
    """
    return _over_dim(_log_softmax, x, dim)
