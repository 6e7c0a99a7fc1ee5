"""The activation family: fake (meta) implementations of its ops and the functional API.

The ops (CUDA kernels, the float64 CPU reference, autograd) live in C++ (`torch/kf_activation.cpp`,
which holds the schemas); `_ops` loads the library. Every public function is one call into
the dispatcher; arguments (including ``approximate``) are validated in C++ only.

Semantics: float32 math, each output rounded once to the input dtype. Eager PyTorch code such as
``F.silu(gate) * up`` rounds ``F.silu(gate)`` to the dtype before the multiply, so results differ
from it by at most that rounding (and are closer to exact).
"""

from __future__ import annotations

import torch

from ._ops import _ops

# ---- fake implementations (shape/dtype propagation for torch.compile, FakeTensor, meta) ----------
# Outputs are contiguous, with the shape of the forward output ([..., I] for the [..., 2I] ops) or
# of the input each gradient belongs to, the input's dtype and device.


def _like(t: torch.Tensor) -> torch.Tensor:
    return t.new_empty(t.shape)  # contiguous even when t is a row-strided view


def _half(name: str, x: torch.Tensor) -> torch.Tensor:
    torch._check(
        x.dim() >= 1 and x.shape[-1] % 2 == 0,
        lambda: f"{name}: x last dimension must be even (2*I), got {x.shape[-1] if x.dim() else 'a scalar'}",
    )
    return x.new_empty((*x.shape[:-1], x.shape[-1] // 2))


@torch.library.register_fake("kernelforge::silu_and_mul")
def _silu_and_mul_fake(x):
    return _half("silu_and_mul", x)


@torch.library.register_fake("kernelforge::silu_and_mul_backward")
def _silu_and_mul_backward_fake(dy, x):
    return _like(x)


@torch.library.register_fake("kernelforge::swiglu")
def _swiglu_fake(gate, up):
    return _like(gate)


@torch.library.register_fake("kernelforge::swiglu_backward")
def _swiglu_backward_fake(dy, gate, up):
    return _like(gate), _like(up)


@torch.library.register_fake("kernelforge::gelu_and_mul")
def _gelu_and_mul_fake(x, approximate="tanh", gate_first=True):
    return _half("gelu_and_mul", x)


@torch.library.register_fake("kernelforge::gelu_and_mul_backward")
def _gelu_and_mul_backward_fake(dy, x, approximate, gate_first):
    return _like(x)


@torch.library.register_fake("kernelforge::geglu")
def _geglu_fake(hidden, gate, approximate="none"):
    return _like(hidden)


@torch.library.register_fake("kernelforge::geglu_backward")
def _geglu_backward_fake(dy, hidden, gate, approximate):
    return _like(hidden), _like(gate)


@torch.library.register_fake("kernelforge::gelu")
def _gelu_fake(x, approximate="none"):
    return _like(x)


@torch.library.register_fake("kernelforge::gelu_backward")
def _gelu_backward_fake(dy, x, approximate):
    return _like(x)


@torch.library.register_fake("kernelforge::gelu_backward_bias_grad")
def _gelu_backward_bias_grad_fake(dy, x, approximate, bias_dtype=None):
    # (dx, dbias): gelu_backward's dx and its column sums [N] in bias_dtype (None: x's dtype); internal to
    # kernelforge.linear's backward (gemm.py)
    torch._check(x.dim() >= 1, lambda: "gelu_backward_bias_grad: x must have at least 1 dimension, got a scalar")
    return _like(x), x.new_empty((x.shape[-1],), dtype=bias_dtype if bias_dtype is not None else x.dtype)


# ---- functional API ------------------------------------------------------------------------------
# OpOverloads resolved once: calling `.default` directly skips the overload-packet lookup.
_silu_and_mul = _ops.silu_and_mul.default
_swiglu = _ops.swiglu.default
_gelu_and_mul = _ops.gelu_and_mul.default
_geglu = _ops.geglu.default
_gelu = _ops.gelu.default


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    """SwiGLU on a fused gate/up projection: ``silu(x[..., :I]) * x[..., I:]`` for x ``[..., 2I]``.

    The vLLM / HF kernels ``silu_and_mul`` convention (gate first). Differentiable in x.
    """
    return _silu_and_mul(x)


def swiglu(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """``silu(gate) * up`` (HF LlamaMLP: ``act_fn(gate_proj(x)) * up_proj(x)``), one fused kernel.

    gate and up have the same shape and dtype. Differentiable in both.
    """
    return _swiglu(gate, up)


def gelu_and_mul(x: torch.Tensor, approximate: str = "tanh", gate_first: bool = True) -> torch.Tensor:
    """GeGLU on a fused projection x ``[..., 2I]``.

    ``gate_first=True``: ``gelu(x[..., :I]) * x[..., I:]`` (vLLM / kernels ``gelu_and_mul``).
    ``gate_first=False``: ``x[..., :I] * gelu(x[..., I:])`` (diffusers GEGLU:
    ``hidden, gate = proj(x).chunk(2, -1); hidden * gelu(gate)``).
    ``approximate`` is F.gelu's: ``"tanh"`` (default here) or ``"none"`` (erf). Differentiable in x.
    """
    return _gelu_and_mul(x, approximate, gate_first)


def geglu(hidden: torch.Tensor, gate: torch.Tensor, approximate: str = "none") -> torch.Tensor:
    """``hidden * gelu(gate)`` (diffusers GEGLU convention, exact GELU by default). Differentiable in both."""
    return _geglu(hidden, gate, approximate)


def gelu(x: torch.Tensor, approximate: str = "none") -> torch.Tensor:
    """``F.gelu(x, approximate=approximate)`` (``"none"``: erf, the default; ``"tanh"``)."""
    return _gelu(x, approximate)
