"""Stateless layers for the HuggingFace ``kernels`` hub: ``kernelize`` swaps the forward of a model's
layer (a transformers class decorated with ``use_kernel_forward_from_hub("RMSNorm")``, or one named in
a kernel mapping) for the ``forward`` of the class of the same name here, bound to the original
module, so it reads that module's own attributes (``weight``, ``variance_epsilon``, ...).

``kernels`` requires of every class: no constructor, no members besides ``forward``,
``can_torch_compile`` and ``has_backward``, and the forward signature of the layer it replaces. Every
forward here is differentiable and compiles with torch.compile (fullgraph).

  RMSNorm         transformers' LlamaRMSNorm (weight, variance_epsilon): weight * T(x * rsqrt(mean(x^2) + eps))
  LayerNorm       torch.nn.LayerNorm over the last dimension (weight, bias, eps, normalized_shape)
  SiluAndMul      silu(x[..., :I]) * x[..., I:]            (kernels-community/activation's layer)
  GeluAndMul      gelu(x[..., :I]) * x[..., I:], erf GELU
  GeluTanhAndMul  gelu_tanh(x[..., :I]) * x[..., I:]
  apply_rotary_transformers  transformers' apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=1) (the hub's
                  name for the "rotary_pos_emb" kernel; a function kernelized as a layer)

An input the kernels cannot take (a float32 weight under a bfloat16 activation in RMSNorm is one they
can: the weight multiply then runs in torch, as LlamaRMSNorm's promotion does) falls back to the
textbook formula with one warning; ``KF_STRICT=1`` makes that an error.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from . import activation as _act
from . import norm as _norm
from . import rope as _rope
from .patch._runtime import announce_fallback as _announce
from .patch._runtime import rows as _rows
from .patch._runtime import unit_last as _unit_last
from .patch.rope import _hf_rope_fit

_HINT = "(kernelforge.layers)"


def _llama_rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    if x.dtype == weight.dtype:
        return _norm.rms_norm(_rows(x), weight, eps)
    if x.dtype in (torch.float16, torch.bfloat16, torch.float32) and x.device == weight.device:
        # LlamaRMSNorm: weight * T(normalized), promoted to the wider dtype: the multiply in torch
        return weight * _norm.rms_norm(_rows(x), None, eps)
    _announce("kernelforge.layers.RMSNorm", f"x {x.dtype} on {x.device}, weight {weight.dtype} on {weight.device}",
              "RMSNorm", _HINT, 3)
    xf = x.float()
    return weight * (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)


class RMSNorm(nn.Module):
    """transformers' LlamaRMSNorm forward (the modules decorated ``use_kernel_forward_from_hub("RMSNorm")``
    whose math is Llama's; Gemma's ``x * (1 + weight)`` is another layer)."""

    can_torch_compile = True
    has_backward = True

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return _llama_rms_norm(hidden_states, self.weight, self.variance_epsilon)


def _layer_norm(m: nn.Module, x: torch.Tensor) -> torch.Tensor:
    shape = tuple(m.normalized_shape)
    if len(shape) == 1 and (m.weight is None or m.weight.dtype == x.dtype):
        return _norm.layer_norm(_rows(x), m.weight, m.bias, m.eps)
    _announce("kernelforge.layers.LayerNorm", f"normalized_shape {list(shape)} or a weight of another dtype",
              "LayerNorm", _HINT, 3)
    return F.layer_norm(x, shape, m.weight, m.bias, m.eps)


class LayerNorm(nn.Module):
    """torch.nn.LayerNorm's forward over one trailing dimension (affine or not)."""

    can_torch_compile = True
    has_backward = True

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        return _layer_norm(self, input)


class SiluAndMul(nn.Module):
    """x [..., 2I] -> silu(x[..., :I]) * x[..., I:] (gate first)."""

    can_torch_compile = True
    has_backward = True

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _act.silu_and_mul(x)


class GeluAndMul(nn.Module):
    """x [..., 2I] -> gelu(x[..., :I]) * x[..., I:] with the erf GELU."""

    can_torch_compile = True
    has_backward = True

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _act.gelu_and_mul(x, "none", True)


class GeluTanhAndMul(nn.Module):
    """x [..., 2I] -> gelu_tanh(x[..., :I]) * x[..., I:]."""

    can_torch_compile = True
    has_backward = True

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _act.gelu_and_mul(x, "tanh", True)


def _apply_rotary(q, k, cos, sin, unsqueeze_dim):
    why, layout = _hf_rope_fit(q, k, cos, sin, unsqueeze_dim)
    if why is None:
        return _rope.apply_rope(_unit_last(q), _unit_last(k), _unit_last(cos), _unit_last(sin), layout=layout)
    _announce("kernelforge.layers.apply_rotary_transformers", why, "apply_rotary_pos_emb", _HINT, 4)
    c, s = cos.unsqueeze(unsqueeze_dim), sin.unsqueeze(unsqueeze_dim)

    def rotate_half(x):
        return torch.cat((-x[..., x.shape[-1] // 2:], x[..., : x.shape[-1] // 2]), dim=-1)

    return q * c + rotate_half(q) * s, k * c + rotate_half(k) * s


class apply_rotary_transformers(nn.Module):  # noqa: N801 (the hub's name for transformers' rotary kernel)
    """transformers' apply_rotary_pos_emb (its functions decorated ``use_kernel_forward_from_hub("rotary_pos_emb")``
    are kernelized as layers of this signature): q * cos + rotate_half(q) * sin (and k), cos/sin [B, S, D]
    unsqueezed at ``unsqueeze_dim`` (1: q [B, H, S, D], 2: [B, S, H, D])."""

    can_torch_compile = True
    has_backward = True

    def forward(self, q, k, cos, sin, unsqueeze_dim=1):
        return _apply_rotary(q, k, cos, sin, unsqueeze_dim)


__all__ = ["RMSNorm", "LayerNorm", "SiluAndMul", "GeluAndMul", "GeluTanhAndMul", "apply_rotary_transformers"]
