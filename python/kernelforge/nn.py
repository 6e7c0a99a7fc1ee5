"""Drop-in modules for torch.nn.RMSNorm and torch.nn.LayerNorm backed by the kernelforge ops.

Same constructor arguments, attributes and state_dict keys as the torch modules, so a checkpoint
loads unchanged. The normalized dimensions must be the trailing ones of the input; several of them
(``normalized_shape=(H, D)``) are normalized together by viewing them as one row of ``H * D``.

Numerics: LayerNorm matches F.layer_norm (float32 math, one rounding). RMSNorm follows
kernelforge.rms_norm, i.e. HF LlamaRMSNorm: the normalized value is rounded to the input dtype
before the weight multiply, where torch rounds once after it. For float16/bfloat16 the two differ
by at most an ulp or two; for float32 they agree to float32 accuracy.

FusedLinearRowSum is nn.Linear followed by ``.sum(-1)`` as one op (kernelforge.fused_linear_rowsum).
"""

from __future__ import annotations

import math
import numbers

import torch

from . import fused_linear_rowsum as _flrs
from . import norm as _norm

__all__ = ["RMSNorm", "LayerNorm", "FusedLinearRowSum"]

# torch.nn.RMSNorm with eps=None uses the epsilon of its *computation* dtype (float32 for half
# types, float64 for float64), not of the input dtype (aten rms_norm: opmath_t epsilon).
_F32_EPS = torch.finfo(torch.float32).eps
_DEFAULT_RMS_EPS = {torch.float64: torch.finfo(torch.float64).eps}


def _as_shape(normalized_shape) -> tuple[int, ...]:
    if isinstance(normalized_shape, numbers.Integral):
        return (int(normalized_shape),)
    return tuple(int(d) for d in normalized_shape)


def _flat_rows(x: torch.Tensor, normalized_shape: tuple[int, ...], module: str) -> torch.Tensor:
    """x [..., *normalized_shape] -> [..., prod(normalized_shape)] (a view when x is contiguous)."""
    k = len(normalized_shape)
    if x.dim() < k or tuple(x.shape[x.dim() - k :]) != normalized_shape:
        raise RuntimeError(
            f"{module}: expected input with trailing shape {list(normalized_shape)}, got input of "
            f"shape {list(x.shape)}"
        )
    return x.reshape(*x.shape[: x.dim() - k], math.prod(normalized_shape))


class RMSNorm(torch.nn.Module):
    """kernelforge drop-in for :class:`torch.nn.RMSNorm`."""

    __constants__ = ["normalized_shape", "eps", "elementwise_affine"]

    def __init__(self, normalized_shape, eps: float | None = None, elementwise_affine: bool = True,
                 device=None, dtype=None) -> None:
        super().__init__()
        self.normalized_shape = _as_shape(normalized_shape)
        self.eps = eps
        self.elementwise_affine = elementwise_affine
        if elementwise_affine:
            self.weight = torch.nn.Parameter(torch.empty(self.normalized_shape, device=device, dtype=dtype))
        else:
            self.register_parameter("weight", None)
        self._multi = len(self.normalized_shape) > 1
        self.reset_parameters()

    def reset_parameters(self) -> None:
        if self.weight is not None:
            torch.nn.init.ones_(self.weight)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        eps = self.eps
        if eps is None:
            eps = _DEFAULT_RMS_EPS.get(x.dtype, _F32_EPS)
        if self._multi or self.weight is None:  # the op cannot check these shapes itself
            return _rms_norm_nd(x, self.weight, eps, self.normalized_shape)
        return _norm._rms_norm(x, self.weight, eps)

    def extra_repr(self) -> str:
        return f"{self.normalized_shape}, eps={self.eps}, elementwise_affine={self.elementwise_affine}"


class LayerNorm(torch.nn.Module):
    """kernelforge drop-in for :class:`torch.nn.LayerNorm`."""

    __constants__ = ["normalized_shape", "eps", "elementwise_affine"]

    def __init__(self, normalized_shape, eps: float = 1e-5, elementwise_affine: bool = True,
                 bias: bool = True, device=None, dtype=None) -> None:
        super().__init__()
        self.normalized_shape = _as_shape(normalized_shape)
        self.eps = eps
        self.elementwise_affine = elementwise_affine
        if elementwise_affine:
            self.weight = torch.nn.Parameter(torch.empty(self.normalized_shape, device=device, dtype=dtype))
            if bias:
                self.bias = torch.nn.Parameter(torch.empty(self.normalized_shape, device=device, dtype=dtype))
            else:
                self.register_parameter("bias", None)
        else:
            self.register_parameter("weight", None)
            self.register_parameter("bias", None)
        self._multi = len(self.normalized_shape) > 1
        self.reset_parameters()

    def reset_parameters(self) -> None:
        if self.weight is not None:
            torch.nn.init.ones_(self.weight)
        if self.bias is not None:
            torch.nn.init.zeros_(self.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self._multi or self.weight is None:
            return _layer_norm_nd(x, self.weight, self.bias, self.eps, self.normalized_shape)
        return _norm._layer_norm(x, self.weight, self.bias, self.eps)

    def extra_repr(self) -> str:
        return f"{self.normalized_shape}, eps={self.eps}, elementwise_affine={self.elementwise_affine}"


def _flat_param(p: torch.Tensor | None) -> torch.Tensor | None:
    return None if p is None else p.reshape(-1)


def _rms_norm_nd(x, weight, eps, normalized_shape, module="RMSNorm"):
    y = _norm._rms_norm(_flat_rows(x, normalized_shape, module), _flat_param(weight), eps)
    return y.view(x.shape)


def _layer_norm_nd(x, weight, bias, eps, normalized_shape, module="LayerNorm"):
    y = _norm._layer_norm(_flat_rows(x, normalized_shape, module), _flat_param(weight), _flat_param(bias), eps)
    return y.view(x.shape)


class FusedLinearRowSum(torch.nn.Module):
    """``nn.Linear(in_features, out_features, bias)`` followed by ``.sum(-1)``, in one op that never forms
    the ``[..., out_features]`` output (kernelforge.fused_linear_rowsum).

    Same parameters, initialization and state_dict keys (``weight`` [out, in], ``bias`` [out]) as
    :class:`torch.nn.Linear`, so a Linear checkpoint loads unchanged. Input ``[..., in_features]``,
    output ``[...]`` (Flash-Kernels-v2 FusedLinearRowSum returns ``[batch]`` for ``[batch, in]``).
    """

    __constants__ = ["in_features", "out_features"]

    def __init__(self, in_features: int, out_features: int, bias: bool = True, device=None, dtype=None) -> None:
        super().__init__()
        self.in_features = in_features
        self.out_features = out_features
        self.weight = torch.nn.Parameter(torch.empty((out_features, in_features), device=device, dtype=dtype))
        if bias:
            self.bias = torch.nn.Parameter(torch.empty(out_features, device=device, dtype=dtype))
        else:
            self.register_parameter("bias", None)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        torch.nn.Linear.reset_parameters(self)  # kaiming_uniform(a=sqrt(5)), bias U(-1/sqrt(in), 1/sqrt(in))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _flrs._fused_linear_rowsum(x, self.weight, self.bias)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}"
