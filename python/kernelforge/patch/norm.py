"""The norm entries of the patch table (family "norm"); see __init__.py for the machinery.

Patched:

- ``torch.nn.RMSNorm`` / ``torch.nn.LayerNorm`` (not subclasses that override forward)
  -> ``rms_norm`` / ``layer_norm`` (several trailing normalized dims viewed as one row)
- diffusers ``RMSNorm`` without a bias -> ``rms_norm``
- transformers RMSNorms (any class named ``*RMSNorm`` with a ``weight``) whose forward is, up to
  names, annotations, docstring and layout, LlamaRMSNorm's
  ``weight * (x.float() * rsqrt(mean(x.float()^2) + variance_epsilon)).to(x.dtype)`` -> ``rms_norm``
  (which rounds to the input dtype before the weight multiply, as that forward does). Other forwards
  (Gemma's ``x * (1 + weight)``, Olmo2's multiply before the rounding, ...) are skipped.
"""

from __future__ import annotations

import ast
import inspect
import textwrap

import torch

from .. import norm as _norm
from ._match import diffusers_class, same_as
from ._registry import Replacement, register_replacement, register_unsupported
from ._runtime import dtype_mismatch, fallback, original, rows

_RMS_EPS_F32 = torch.finfo(torch.float32).eps
_RMS_EPS_F64 = torch.finfo(torch.float64).eps


# ---- transformers Llama-style RMSNorm --------------------------------------------------------------

_REF_HF_RMS_NORM = r'''
def forward(self, hidden_states):
    input_dtype = hidden_states.dtype
    hidden_states = hidden_states.to(torch.float32)
    variance = hidden_states.pow(2).mean(-1, keepdim=True)
    hidden_states = hidden_states * torch.rsqrt(variance + self.variance_epsilon)
    return self.weight * hidden_states.to(input_dtype)
'''


def _has_constant_one(fn) -> bool:
    """The forward's source holds the constant 1 (as in Gemma's x * (1 + weight))."""
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(fn)))
    except (OSError, TypeError, SyntaxError):
        return False
    return any(isinstance(n, ast.Constant) and not isinstance(n.value, bool) and n.value == 1 for n in ast.walk(tree))


def _match_hf_rms_norm(m: torch.nn.Module):
    cls = type(m)
    if not cls.__name__.endswith("RMSNorm") or isinstance(m, torch.nn.RMSNorm):
        return None
    w = getattr(m, "weight", None)
    if not isinstance(w, torch.nn.Parameter):
        return "has no `weight` parameter"
    if not same_as(cls.forward, _REF_HF_RMS_NORM):
        if _has_constant_one(cls.forward):
            return "forward differs from LlamaRMSNorm: Gemma-style x * (1 + weight)"
        return "forward differs from LlamaRMSNorm (different math or rounding order)"
    if not isinstance(getattr(m, "variance_epsilon", None), (int, float)):
        return "has no numeric `variance_epsilon` attribute"
    if w.dim() != 1:
        return f"weight has shape {list(w.shape)}, expected one dimension"
    return True


def _hf_rms_norm_forward(self, hidden_states):
    w = self.weight
    if hidden_states.dtype != w.dtype:
        return fallback(self, dtype_mismatch(hidden_states, w, "weight"), hidden_states)
    return _norm._rms_norm(rows(hidden_states), w, self.variance_epsilon)


# ---- entries: diffusers RMSNorm ------------------------------------------------------------------


def _match_diffusers_rms_norm(m: torch.nn.Module):
    cls = diffusers_class("diffusers.models.normalization", "RMSNorm")
    if cls is None or not isinstance(m, cls):
        return None
    if type(m).forward is not cls.forward:
        return "subclass overrides forward"
    if getattr(m, "bias", None) is not None:
        return "has a bias (norm(x) * weight + bias)"
    if m.weight is not None and m.weight.dim() != 1:
        return f"weight has shape {list(m.weight.shape)}, expected one dimension"
    return True


def _diffusers_rms_norm_forward(self, hidden_states):
    w = self.weight
    if w is not None:
        if hidden_states.dtype != w.dtype:
            return fallback(self, dtype_mismatch(hidden_states, w, "weight"), hidden_states)
        if self.bias is not None:
            return fallback(self, "a bias (set after patching)", hidden_states)
    return _norm._rms_norm(rows(hidden_states), w, self.eps)


# ---- entries: torch.nn.RMSNorm / torch.nn.LayerNorm ----------------------------------------------


def _match_torch(base: type):
    def match(m: torch.nn.Module):
        if not isinstance(m, base):
            return None
        if type(m).forward is not base.forward:
            return "subclass overrides forward"
        return True

    return match


def _flat(x: torch.Tensor, k: int) -> torch.Tensor:
    return rows(x) if k == 1 else x.reshape(*x.shape[: x.dim() - k], -1)


def _flat_param(p: torch.Tensor | None, k: int) -> torch.Tensor | None:
    return p if p is None or k == 1 else p.reshape(-1)


def _torch_rms_norm_forward(self, input):
    w = self.weight
    if w is not None and input.dtype != w.dtype:
        return fallback(self, dtype_mismatch(input, w, "weight"), input)
    shape = self.normalized_shape
    k = len(shape)
    if input.dim() < k or input.shape[input.dim() - k :] != shape:
        return original(self)(input)  # torch raises its own shape error
    eps = self.eps
    if eps is None:  # aten: epsilon of the computation dtype
        eps = _RMS_EPS_F64 if input.dtype == torch.float64 else _RMS_EPS_F32
    y = _norm._rms_norm(_flat(input, k), _flat_param(w, k), eps)
    return y if k == 1 else y.view(input.shape)


def _torch_layer_norm_forward(self, input):
    w, b = self.weight, self.bias
    why = dtype_mismatch(input, w, "weight") or dtype_mismatch(input, b, "bias")
    if why is not None:
        return fallback(self, why, input)
    shape = self.normalized_shape
    k = len(shape)
    if input.dim() < k or input.shape[input.dim() - k :] != shape:
        return original(self)(input)  # torch raises its own shape error
    y = _norm._layer_norm(_flat(input, k), _flat_param(w, k), _flat_param(b, k), self.eps)
    return y if k == 1 else y.view(input.shape)


for _entry in (
    Replacement("torch.nn.RMSNorm", "kernelforge.rms_norm", _match_torch(torch.nn.RMSNorm), _torch_rms_norm_forward,
                "norm"),
    Replacement("torch.nn.LayerNorm", "kernelforge.layer_norm", _match_torch(torch.nn.LayerNorm),
                _torch_layer_norm_forward, "norm"),
    Replacement("diffusers RMSNorm", "kernelforge.rms_norm", _match_diffusers_rms_norm, _diffusers_rms_norm_forward,
                "norm"),
    Replacement("transformers LlamaRMSNorm", "kernelforge.rms_norm", _match_hf_rms_norm, _hf_rms_norm_forward,
                "norm"),
):
    register_replacement(_entry)
del _entry


def _unsupported_norm(m: torch.nn.Module) -> str | None:
    """Norm-looking classes no entry claimed are reported as skipped."""
    name = type(m).__name__
    if name.endswith("RMSNorm") or name.endswith("LayerNorm"):
        return "no kernelforge replacement for this class"
    return None


register_unsupported("norm", _unsupported_norm)
