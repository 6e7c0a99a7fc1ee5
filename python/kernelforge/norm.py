"""The norm family: fake (meta) implementations of its ops and the functional API.

The ops (CUDA kernels, the float64 CPU reference, autograd) live in C++ (`torch/kf_norm.cpp`,
formulas in include/kernelforge/norm.h). Every public function is one call into the dispatcher,
because the decode path calls them with one row at a time and Python overhead is then the whole
cost. Arguments (including ada_norm's ``kind``) are validated in C++ only.
"""

from __future__ import annotations

import torch

from ._ops import _ops

# ---- fake implementations (shape/dtype propagation for torch.compile, FakeTensor, meta) ----------
# Outputs are contiguous, with the input's shape, dtype and device. Gradients of absent optional
# parameters are empty [0] tensors, as the C++ ops return them.


def _like(t: torch.Tensor) -> torch.Tensor:
    return t.new_empty(t.shape)  # contiguous even when t is a row-strided view


def _grad_of(p: torch.Tensor | None, x: torch.Tensor) -> torch.Tensor:
    return x.new_empty((0,)) if p is None else _like(p)


@torch.library.register_fake("kernelforge::rms_norm")
def _rms_norm_fake(x, weight, eps):
    return _like(x)


@torch.library.register_fake("kernelforge::rms_norm_backward")
def _rms_norm_backward_fake(dy, x, weight, eps):
    return _like(x), _grad_of(weight, x)


@torch.library.register_fake("kernelforge::add_rms_norm")
def _add_rms_norm_fake(x, residual, weight, eps):
    return _like(x), _like(x)


@torch.library.register_fake("kernelforge::add_rms_norm_backward")
def _add_rms_norm_backward_fake(dy, dsum, sum, weight, eps):
    return _like(sum), _grad_of(weight, sum)


@torch.library.register_fake("kernelforge::layer_norm")
def _layer_norm_fake(x, weight, bias, eps):
    return _like(x)


@torch.library.register_fake("kernelforge::layer_norm_backward")
def _layer_norm_backward_fake(dy, x, weight, bias, eps):
    return _like(x), _grad_of(weight, x), _grad_of(bias, x)


@torch.library.register_fake("kernelforge::ada_norm")
def _ada_norm_fake(x, scale, shift, weight, bias, eps, kind):
    return _like(x)


@torch.library.register_fake("kernelforge::ada_norm_backward")
def _ada_norm_backward_fake(dy, x, scale, shift, weight, bias, eps, kind):
    return _like(x), _like(scale), _like(shift), _grad_of(weight, x), _grad_of(bias, x)


# ---- functional API ------------------------------------------------------------------------------
# OpOverloads resolved once: calling `.default` directly skips the overload-packet lookup.
_rms_norm = _ops.rms_norm.default
_add_rms_norm = _ops.add_rms_norm.default
_layer_norm = _ops.layer_norm.default
_ada_norm = _ops.ada_norm.default

def rms_norm(x: torch.Tensor, weight: torch.Tensor | None = None, eps: float = 1e-6) -> torch.Tensor:
    """RMSNorm over the last dimension with HF LlamaRMSNorm semantics.

    ``y = T(T(x * rsqrt(mean(x^2) + eps)) * weight)`` with float32 statistics, where ``T`` rounds to
    x's dtype (the cast to the input dtype happens before the weight multiply, as in transformers).
    ``weight`` (shape ``[N]``, x's dtype) is optional. Differentiable in x and weight.
    """
    return _rms_norm(x, weight, eps)


def add_rms_norm(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor | None = None, eps: float = 1e-6
) -> tuple[torch.Tensor, torch.Tensor]:
    """Fused residual add + RMSNorm: returns ``(rms_norm(s, weight, eps), s)`` with ``s = x + residual``.

    ``s`` is rounded to the dtype first, exactly like the eager ``x + residual``; it is the new
    residual stream of a pre-norm transformer block.
    """
    return _add_rms_norm(x, residual, weight, eps)


def layer_norm(
    x: torch.Tensor,
    weight: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
    eps: float = 1e-5,
) -> torch.Tensor:
    """LayerNorm over the last dimension, matching ``F.layer_norm(x, (N,), weight, bias, eps)``."""
    return _layer_norm(x, weight, bias, eps)


def ada_norm(
    x: torch.Tensor,
    scale: torch.Tensor,
    shift: torch.Tensor,
    weight: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
    eps: float = 1e-6,
    kind: str = "layer",
) -> torch.Tensor:
    """Adaptive norm (AdaLN / DiT modulation): ``norm(x) * (1 + scale) + shift``, one rounding.

    ``kind`` is ``"layer"`` (LayerNorm) or ``"rms"`` (RMSNorm, no intermediate rounding).
    ``scale``/``shift`` have shape ``[N]``, ``[B, 1, N]`` or ``[B, S, N]`` for x ``[B, S, N]``.
    """
    return _ada_norm(x, scale, shift, weight, bias, eps, kind)
