"""The RoPE entries of the patch table (family "rope"); see __init__.py for the machinery.

Patched, each only when the rotary function has exactly the code kernelforge verified (syntax tree
of its source, see _match.py):

- transformers attention modules whose forward calls the module-level ``apply_rotary_pos_emb`` of
  Llama (``q * cos + rotate_half(q) * sin``, cos/sin ``[B, S, D]`` unsqueezed at ``unsqueeze_dim``;
  LlamaAttention, MistralAttention, Qwen2Attention, Qwen3Attention and the classes of the other
  modeling modules with the same function) -> ``apply_rope(q, k, cos, sin, layout="bhsd")``
  (``unsqueeze_dim=2``: layout "bshd")
- diffusers ``LTXAttention`` with a processor that calls LTX-Video's ``apply_rotary_emb`` (interleaved
  pairs over the channels of ``[B, S, C]`` query and key, before the split into heads)
  -> ``apply_rope_bsc(x, None, cos, sin)`` (one call per tensor, as the processor calls it)

How: the module-level function is NOT replaced (that would change every model of the process that
uses the modeling module, patched or not, and make unpatch a matter of reference counting). Instead
the patched module's forward runs the class's own forward code (transformers: the attention forward;
diffusers: the processor's ``__call__``, reached through a copy of ``LTXAttention.forward``) with a
globals dict in which that one name is kernelforge's function: ``types.FunctionType(code, globals
copy, ...)``. Every other model, and the module function itself, are untouched; unpatch deletes the
instance forward as for every other family. The globals copy is taken at patch time: if the modeling
module rebinds any global that forward reads after that (e.g. another library replaces
``modeling_llama.apply_rotary_pos_emb``), the patched forward runs the original one instead, with a
warning (KF_STRICT=1: an error).

At run time the replacement function sends its inputs to the kernel only when the kernel computes what
the library function would (same dtypes, shapes it takes, cos/sin without gradients, ...); otherwise it
calls the library function, with the one-time warning.

Numerics: transformers computes ``q * cos + rotate_half(q) * sin`` in q's dtype (three roundings),
the kernel in float32 with one rounding (within two roundings of transformers). diffusers' LTX
function computes in float32 and rounds once, as the kernel does.
"""

from __future__ import annotations

import inspect
import sys
import types
from dataclasses import dataclass
from typing import Callable

import torch
from torch import nn

from .. import rope as _rope
from . import attention as _attention_patch
from ._match import diffusers_class, global_names, loads_global, same_as
from ._registry import STATE_ATTR, Replacement, register_replacement
from ._runtime import announce_fallback, unit_last, warn_fallback

_DTYPES = (torch.float32, torch.bfloat16, torch.float16, torch.float64)
_DEVICES = ("cpu", "cuda")
_FALLBACK_HINT = "Pass q, k, cos and sin of one dtype and device, in the shapes the model's own code uses."
_REBOUND_HINT = "Call kernelforge.unpatch(model) and patch again after changing the modeling module."
_MISSING = object()


# ---- running a forward's own code with one global replaced -------------------------------------------


@dataclass(frozen=True)
class _Rebound:
    """``fn``: a function with the code of ``original`` whose global ``name`` is a kernelforge function.
    ``seen``: (name, value) of every global the code reads, as the defining module held them at patch
    time; ``changed()`` compares them with the module's namespace now."""

    original: Callable
    name: str
    fn: Callable
    seen: tuple

    def changed(self) -> str | None:
        module_globals = inspect.unwrap(self.original).__globals__
        for name, value in self.seen:
            if module_globals.get(name, _MISSING) is not value:
                return f"{module_globals.get('__name__', '?')}.{name} rebound after patching"
        return None

    def __deepcopy__(self, memo):  # shared by every copy of a patched model (it holds no per-model state)
        return self


_REBOUND: dict[tuple[Callable, str], _Rebound] = {}


class _NotRewrappable(Exception):
    pass


def _rewrap(fn: Callable, inner: Callable, new_inner: Callable) -> Callable:
    """``fn`` (a chain of functools.wraps wrappers around ``inner``, each holding the next function in
    one closure cell, as transformers' decorators do) rebuilt around ``new_inner``: the decorators
    keep doing what they do (e.g. renaming a deprecated keyword), the innermost code is ours."""
    if fn is inner:
        return new_inner
    nxt = getattr(fn, "__wrapped__", None)
    cells = fn.__closure__ or () if inspect.isfunction(fn) else ()
    holds = [i for i, c in enumerate(cells) if c.cell_contents is nxt]
    if nxt is None or len(holds) != 1:
        raise _NotRewrappable(f"{getattr(fn, '__qualname__', fn)!r} does not hold the function it wraps in a closure")
    new_nxt = _rewrap(nxt, inner, new_inner)
    new_cells = tuple(types.CellType(new_nxt) if i == holds[0] else c for i, c in enumerate(cells))
    out = types.FunctionType(fn.__code__, fn.__globals__, fn.__name__, fn.__defaults__, new_cells)
    out.__kwdefaults__, out.__qualname__, out.__doc__ = fn.__kwdefaults__, fn.__qualname__, fn.__doc__
    out.__dict__.update(fn.__dict__)
    out.__wrapped__ = new_nxt
    return out


def _rewrappable(fn: Callable) -> str | None:
    """Why the decorators around ``fn``'s code cannot be rebuilt around other code, or None."""
    try:
        _rewrap(fn, inspect.unwrap(fn), inspect.unwrap(fn))
    except _NotRewrappable as e:
        return str(e)
    return None


def _rebind(original: Callable, name: str, make: Callable[[Callable], Callable]) -> _Rebound:
    """``original``'s code with the global ``name`` bound to ``make(module's function)``, inside the
    same decorators as ``original``. One function per (original, name), shared by every patched
    instance (one code object and globals dict for torch.compile), rebuilt when the module's globals
    changed since."""
    hit = _REBOUND.get((original, name))
    if hit is not None and hit.changed() is None:
        return hit
    raw = inspect.unwrap(original)
    module_globals = raw.__globals__
    seen = tuple((n, module_globals.get(n, _MISSING)) for n in sorted(global_names(raw.__code__)))
    new_globals = dict(module_globals)  # a copy: the module's own namespace is never written
    new_globals[name] = make(module_globals[name])
    fn = types.FunctionType(raw.__code__, new_globals, raw.__name__, raw.__defaults__, raw.__closure__)
    fn.__kwdefaults__ = raw.__kwdefaults__
    fn.__qualname__ = raw.__qualname__
    fn.__doc__ = raw.__doc__
    fn.__dict__.update(raw.__dict__)
    rebound = _Rebound(original, name, _rewrap(original, raw, fn), seen)
    _REBOUND[original, name] = rebound
    return rebound


def _devices_dtypes(ts, names) -> str | None:
    """Why the op cannot take these tensors together (dtype or device), or None."""
    t0 = ts[0]
    for t, n in zip(ts, names):
        if t.dtype not in _DTYPES:
            return f"{n} dtype {t.dtype}"
        if t.device.type not in _DEVICES:
            return f"{n} on {t.device}"
        if t.device != t0.device:
            return f"{names[0]} on {t0.device} and {n} on {t.device}"
    return None


# ---- transformers: Llama-style apply_rotary_pos_emb ------------------------------------------------


_REF_HF_ROTATE_HALF = r'''
def rotate_half(x):
    x1 = x[..., : x.shape[-1] // 2]
    x2 = x[..., x.shape[-1] // 2 :]
    return torch.cat((-x2, x1), dim=-1)
'''


_REF_HF_APPLY_ROTARY_POS_EMB = r'''
def apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=1):
    cos = cos.unsqueeze(unsqueeze_dim)
    sin = sin.unsqueeze(unsqueeze_dim)
    q_embed = (q * cos) + (rotate_half(q) * sin)
    k_embed = (k * cos) + (rotate_half(k) * sin)
    return q_embed, k_embed
'''

_HF_PARAMS = ("q", "k", "cos", "sin", "unsqueeze_dim")  # the syntax-tree key ignores names; callers may not


def _hf_rope_fit(q, k, cos, sin, unsqueeze_dim) -> "tuple[str | None, str]":
    """(None, layout) when apply_rope(q, k, cos, sin, layout) computes what transformers' function does
    with these arguments; otherwise (the reason, "")."""
    if not all(isinstance(t, torch.Tensor) for t in (q, k, cos, sin)):
        return "arguments that are not all tensors", ""
    if q.dim() != 4 or k.dim() != 4 or cos.dim() != 3 or sin.shape != cos.shape:
        return (f"q {list(q.shape)}, k {list(k.shape)}, cos {list(cos.shape)}, sin {list(sin.shape)} "
                "(the kernel takes 4-D q and k with cos/sin [B, S, D])"), ""
    # cos [B, S, D].unsqueeze(1) -> [B, 1, S, D] broadcasts over q [B, H, S, D]; unsqueeze(2) over [B, S, H, D]
    ud = unsqueeze_dim + 4 if isinstance(unsqueeze_dim, int) and unsqueeze_dim < 0 else unsqueeze_dim
    if ud not in (1, 2):
        return f"unsqueeze_dim={unsqueeze_dim!r} (the kernel takes 1: [B, H, S, D] or 2: [B, S, H, D])", ""
    layout = "bhsd" if ud == 1 else "bshd"
    why = _devices_dtypes((q, k, cos, sin), ("q", "k", "cos", "sin"))
    if why is not None:
        return why, ""
    if len({q.dtype, k.dtype, cos.dtype, sin.dtype}) != 1:  # transformers would promote to a wider dtype
        return f"dtypes q {q.dtype}, k {k.dtype}, cos {cos.dtype}, sin {sin.dtype}", ""
    s_dim = 2 if layout == "bhsd" else 1
    B, S, D = q.shape[0], q.shape[s_dim], q.shape[3]
    if D % 2 != 0:
        return f"odd head_dim {D} (rotate_half then splits unequal halves)", ""
    if k.shape[0] != B or k.shape[s_dim] != S or k.shape[3] != D:
        return f"q {list(q.shape)} and k {list(k.shape)} of different batch, sequence or head_dim", ""
    if cos.shape[0] not in (1, B) or cos.shape[1] != S or cos.shape[2] != D:
        return f"cos/sin {list(cos.shape)} that do not match q {list(q.shape)} as [B, S, head_dim]", ""
    if cos.requires_grad or sin.requires_grad:
        return "cos/sin that require grad (the kernel gives cos and sin no gradient)", ""
    return None, layout


def _hf_rope_function(original: Callable, subject: str) -> Callable:
    """What the patched forward calls instead of ``original`` (transformers' apply_rotary_pos_emb)."""

    def apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=1):
        why, layout = _hf_rope_fit(q, k, cos, sin, unsqueeze_dim)
        if why is not None:
            announce_fallback(subject, why, "apply_rotary_pos_emb", _FALLBACK_HINT, 3)
            return original(q, k, cos, sin, unsqueeze_dim)
        # q * cos + rotate_half(q) * sin: pairs (i, i + D/2), cos/sin at full width, as transformers passes them
        return _rope.apply_rope(unit_last(q), unit_last(k), unit_last(cos), unit_last(sin), layout=layout)

    return apply_rotary_pos_emb


def _hub_function(fn):
    """The function behind a hub-kernel placeholder: with the kernels package installed, transformers'
    ``@use_kernel_forward_from_hub("rotary_pos_emb")`` turns apply_rotary_pos_emb into an nn.Module
    instance whose forward calls the function (kernels' _create_func_module); anything else as is."""
    if isinstance(fn, nn.Module):
        for cell in getattr(type(fn).forward, "__closure__", None) or ():
            if inspect.isfunction(cell.cell_contents):
                return cell.cell_contents
    return fn


def _match_hf_attention(m: nn.Module):
    fwd = type(m).forward
    raw = inspect.unwrap(fwd) if inspect.isfunction(fwd) else fwd
    if not loads_global(raw, "apply_rotary_pos_emb"):
        return None
    why = _rewrappable(fwd)
    if why is not None:
        return f"forward is wrapped by a decorator kernelforge cannot rebuild: {why}"
    fn = _hub_function(raw.__globals__.get("apply_rotary_pos_emb"))
    where = raw.__globals__.get("__name__", "?")
    if fn is None:
        return None
    if not same_as(fn, _REF_HF_APPLY_ROTARY_POS_EMB):
        return f"{where}.apply_rotary_pos_emb differs from Llama's q * cos + rotate_half(q) * sin"
    if fn.__code__.co_varnames[: len(_HF_PARAMS)] != _HF_PARAMS:
        return f"{where}.apply_rotary_pos_emb names its parameters {fn.__code__.co_varnames[:5]}, not {_HF_PARAMS}"
    if not same_as(fn.__globals__.get("rotate_half"), _REF_HF_ROTATE_HALF):
        return f"the rotate_half {where}.apply_rotary_pos_emb calls differs from Llama's cat(-x2, x1)"
    return True


def _hf_attention_setup(m: nn.Module) -> _Rebound:
    fwd = type(m).forward
    subject = f"apply_rotary_pos_emb in {fwd.__qualname__}"
    return _rebind(fwd, "apply_rotary_pos_emb", lambda original: _hf_rope_function(original, subject))


def _hf_attention_forward(self, *args, **kwargs):
    state = self.__dict__[STATE_ATTR]
    rebound: _Rebound = state.extra
    changed = rebound.changed()
    if changed is not None:
        warn_fallback(self, changed, _REBOUND_HINT, 3)
        return state.original(*args, **kwargs)
    return rebound.fn(self, *args, **kwargs)  # the class's forward code, apply_rotary_pos_emb -> kernelforge


# ---- diffusers: LTX-Video (diffusers.models.transformers.transformer_ltx, 0.42) ----------------------


_LTX = "diffusers.models.transformers.transformer_ltx"


_REF_LTX_APPLY_ROTARY_EMB = r'''
def apply_rotary_emb(x, freqs):
    cos, sin = freqs
    x_real, x_imag = x.unflatten(2, (-1, 2)).unbind(-1)  # [B, S, C // 2]
    x_rotated = torch.stack([-x_imag, x_real], dim=-1).flatten(2)
    out = (x.float() * cos + x_rotated.float() * sin).to(x.dtype)
    return out
'''


_REF_LTX_ATTENTION_FORWARD = r'''
def forward(
    self,
    hidden_states: torch.Tensor,
    encoder_hidden_states: torch.Tensor | None = None,
    attention_mask: torch.Tensor | None = None,
    image_rotary_emb: torch.Tensor | None = None,
    **kwargs,
) -> torch.Tensor:
    attn_parameters = set(inspect.signature(self.processor.__call__).parameters.keys())
    unused_kwargs = [k for k, _ in kwargs.items() if k not in attn_parameters]
    if len(unused_kwargs) > 0:
        logger.warning(
            f"attention_kwargs {unused_kwargs} are not expected by {self.processor.__class__.__name__} and will be ignored."
        )
    kwargs = {k: w for k, w in kwargs.items() if k in attn_parameters}
    return self.processor(self, hidden_states, encoder_hidden_states, attention_mask, image_rotary_emb, **kwargs)
'''


def _ltx_rope_fit(x, freqs) -> str | None:
    """None when apply_rope_bsc(x, None, cos, sin) computes what diffusers' LTX apply_rotary_emb does."""
    if not (isinstance(freqs, (tuple, list)) and len(freqs) == 2):
        return f"freqs of type {type(freqs).__name__} (expected (cos, sin))"
    cos, sin = freqs
    if not all(isinstance(t, torch.Tensor) for t in (x, cos, sin)):
        return "arguments that are not all tensors"
    why = _devices_dtypes((x, cos, sin), ("x", "cos", "sin"))
    if why is not None:
        return why
    if x.dtype == torch.float64:
        return "a float64 input (diffusers rounds it to float32 first)"
    if cos.dtype != sin.dtype or cos.dtype not in (torch.float32, x.dtype):
        # diffusers computes x.float() * cos: float32 unless cos is wider; the kernel takes cos in float32 or x's dtype
        return f"x dtype {x.dtype} with cos {cos.dtype} and sin {sin.dtype}"
    if x.dim() != 3 or cos.dim() != 3 or sin.shape != cos.shape:
        return (f"x {list(x.shape)}, cos {list(cos.shape)}, sin {list(sin.shape)} "
                "(the kernel takes x [B, S, C] with cos/sin [B, S, C])")
    B, S, C = x.shape
    if C % 2 != 0:
        return f"an odd channel count {C}"
    if cos.shape[0] not in (1, B) or cos.shape[1] != S or cos.shape[2] != C:
        return f"cos/sin {list(cos.shape)} that do not match x {list(x.shape)}"
    if cos.requires_grad or sin.requires_grad:
        return "cos/sin that require grad (the kernel gives cos and sin no gradient)"
    return None


def _ltx_rope_function(original: Callable, subject: str) -> Callable:
    """What the patched processor calls instead of ``original`` (LTX-Video's apply_rotary_emb)."""

    def apply_rotary_emb(x, freqs):
        why = _ltx_rope_fit(x, freqs)
        if why is not None:
            announce_fallback(subject, why, "apply_rotary_emb", _FALLBACK_HINT, 3)
            return original(x, freqs)
        cos, sin = freqs
        # x * cos + stack([-x_imag, x_real], -1).flatten(2) * sin: interleaved pairs over all C channels
        return _rope.apply_rope_bsc(unit_last(x), None, unit_last(cos), unit_last(sin), interleaved=True)[0]

    return apply_rotary_emb


def _match_ltx_attention(m: nn.Module):
    cls = diffusers_class(_LTX, "LTXAttention")
    if cls is None or not isinstance(m, cls):
        return None
    if not same_as(type(m).forward, _REF_LTX_ATTENTION_FORWARD):
        return "forward differs from the diffusers 0.42 LTXAttention.forward kernelforge verified (subclass or other version)"
    proc = getattr(m, "processor", None)
    call = getattr(type(proc), "__call__", None)
    if not loads_global(call, "apply_rotary_emb"):
        return f"processor {type(proc).__name__} does not call a module-level apply_rotary_emb"
    where = call.__globals__.get("__name__", "?")
    if not same_as(call.__globals__.get("apply_rotary_emb"), _REF_LTX_APPLY_ROTARY_EMB):
        return f"{where}.apply_rotary_emb differs from the diffusers 0.42 LTX-Video code kernelforge verified"
    return True


def _ltx_attention_setup(m: nn.Module) -> _Rebound:
    call = type(m.processor).__call__
    subject = f"apply_rotary_emb in {call.__qualname__}"
    return _rebind(call, "apply_rotary_emb", lambda original: _ltx_rope_function(original, subject))


def _ltx_attention_forward(self, hidden_states, encoder_hidden_states=None, attention_mask=None,
                           image_rotary_emb=None, **kwargs):
    state = self.__dict__[STATE_ATTR]
    rebound: _Rebound = state.extra
    proc, fn = self.processor, rebound.fn
    if isinstance(proc, _attention_patch.KernelforgeProcessor):
        # the attention family wrapped the processor: its code with both rebindings
        proc, fn = proc.original, _attention_patch.with_kf_dispatch(rebound.fn)
    changed = rebound.changed()
    if changed is None and type(proc).__call__ is not rebound.original:
        changed = f"a processor replaced after patching ({type(proc).__name__})"
    if changed is not None:
        warn_fallback(self, changed, _REBOUND_HINT, 3)
        return state.original(hidden_states, encoder_hidden_states, attention_mask, image_rotary_emb, **kwargs)
    # LTXAttention.forward (verified at patch time), calling the processor's code with apply_rotary_emb ->
    # kernelforge: keyword arguments the processor does not take are dropped with diffusers' warning.
    attn_parameters = set(inspect.signature(proc.__call__).parameters.keys())
    unused_kwargs = [k for k, _ in kwargs.items() if k not in attn_parameters]
    if len(unused_kwargs) > 0:
        sys.modules[_LTX].logger.warning(
            f"attention_kwargs {unused_kwargs} are not expected by {proc.__class__.__name__} and will be ignored."
        )
    kwargs = {k: w for k, w in kwargs.items() if k in attn_parameters}
    return fn(proc, self, hidden_states, encoder_hidden_states, attention_mask, image_rotary_emb, **kwargs)


for _entry in (
    Replacement("transformers apply_rotary_pos_emb", "kernelforge.apply_rope", _match_hf_attention,
                _hf_attention_forward, "rope", _hf_attention_setup),
    Replacement("diffusers LTX-Video apply_rotary_emb", "kernelforge.apply_rope_bsc", _match_ltx_attention,
                _ltx_attention_forward, "rope", _ltx_attention_setup),
):
    register_replacement(_entry)
del _entry
