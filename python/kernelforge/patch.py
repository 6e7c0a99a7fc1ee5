"""patch(model): route the norm and activation modules, the rotary embeddings and the causal-LM loss of a
transformers / diffusers / plain torch model to kernelforge.

Only the *forward* of matching module instances is replaced (``module.forward = MethodType(...)``);
parameters, buffers, state_dict keys and the class are untouched, and ``unpatch(model)`` puts the
original forward back. Matching is table-driven: ``REPLACEMENTS`` is an ordered list of
``Replacement(matcher -> forward)`` entries; the first entry whose matcher claims a module decides
(patch it, or skip it with a reason). New op families add entries with ``register_replacement``.
Each entry belongs to a family ("norm", "activation", "rope", "loss"; ``patch(model, norms=...,
activations=..., rope=..., loss=...)`` chooses the families); the activation entries live in
``_patch_activation.py``, the rope entries (attention modules whose rotary function is replaced for
that instance) in ``_patch_rope.py``, the loss entries (transformers causal LMs whose loss, when labels
are passed, is computed by ``fused_linear_cross_entropy`` from the hidden states, without the logits)
in ``_patch_loss.py``.

At run time a patched forward sends an input to the kernel only when the result is the one the
original forward would give; otherwise (e.g. weight dtype != input dtype, where transformers would
return the promoted dtype) it calls the original forward and warns once, or raises when the
environment has ``KF_STRICT=1``. It never falls back silently.
"""

from __future__ import annotations

import os
import sys
import types
import warnings
from dataclasses import dataclass, field
from typing import Callable

import torch

from . import _ops

__all__ = ["patch", "unpatch", "PatchReport", "Replacement", "REPLACEMENTS", "register_replacement"]

_STATE_ATTR = "_kf_patch"


# ---- the replacement table -----------------------------------------------------------------------


@dataclass(frozen=True)
class Replacement:
    """One entry of the patch table.

    ``match(module)`` returns None when the entry does not apply to the module, True to patch it,
    or a string: the reason the module is recognised but skipped. ``forward`` is the function
    installed as the module's forward (bound to the instance); ``op`` names the kernelforge op it
    calls, for the report. ``family`` is "norm", "activation", "rope" or "loss" (switched by
    ``patch``'s flags norms / activations / rope / loss); entries of any other family are always
    applied. ``setup(module)``, when given, runs when the module is patched; what it returns is kept
    as the patch state's ``extra`` (e.g. the activation submodule the patched forward verified).
    ``patch``'s options (``logits_with_loss``) are kept as the patch state's ``options``.
    """

    name: str
    op: str
    match: Callable[[torch.nn.Module], "bool | str | None"]
    forward: Callable
    family: str = "other"
    setup: "Callable[[torch.nn.Module], object] | None" = None


FAMILIES = ("norm", "activation", "rope", "loss")


REPLACEMENTS: list[Replacement] = []


def register_replacement(entry: Replacement, *, before: str | None = None) -> None:
    """Add an entry to the table (at the end, or before the entry named ``before``)."""
    if before is None:
        REPLACEMENTS.append(entry)
        return
    idx = next(i for i, e in enumerate(REPLACEMENTS) if e.name == before)
    REPLACEMENTS.insert(idx, entry)


_UNSUPPORTED: list[tuple[str, Callable[[torch.nn.Module], "str | None"]]] = []  # (family, reason(module))


def _unsupported_norm(m: torch.nn.Module) -> str | None:
    """Norm-looking classes no entry claimed are reported as skipped."""
    name = type(m).__name__
    if name.endswith("RMSNorm") or name.endswith("LayerNorm"):
        return "no kernelforge replacement for this class"
    return None


_UNSUPPORTED.append(("norm", _unsupported_norm))


def _unsupported_reason(m: torch.nn.Module, families: "set[str] | None" = None) -> str | None:
    """Consulted after the table: modules of a selected family that no entry claimed."""
    for family, reason in _UNSUPPORTED:
        if families is None or family in families:
            why = reason(m)
            if why is not None:
                return why
    return None


# ---- the report ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class PatchedModule:
    path: str  # as in model.named_modules(); "" is the model itself
    cls: str  # class name, e.g. "Qwen2RMSNorm"
    op: str  # the kernelforge op the new forward calls
    qualname: str = ""  # library-qualified class name, e.g. "transformers.Qwen2RMSNorm"


@dataclass(frozen=True)
class SkippedModule:
    path: str
    cls: str
    reason: str
    qualname: str = ""


def _qualname(cls: type) -> str:
    """torch.nn.RMSNorm, diffusers.RMSNorm, transformers.Qwen2RMSNorm: tells same-named classes apart."""
    mod = cls.__module__ or ""
    if mod.startswith("torch.nn."):
        return f"torch.nn.{cls.__name__}"
    return f"{mod.split('.')[0]}.{cls.__name__}" if mod else cls.__name__


@dataclass
class PatchReport:
    patched: list[PatchedModule] = field(default_factory=list)
    skipped: list[SkippedModule] = field(default_factory=list)

    @property
    def patched_paths(self) -> list[str]:
        return [m.path for m in self.patched]

    @property
    def skipped_paths(self) -> list[str]:
        return [m.path for m in self.skipped]

    def __str__(self) -> str:
        return self.format()

    def format(self, max_paths: int = 3) -> str:
        """Grouped summary: one line per (class, op) patched and per (class, reason) skipped."""
        lines = [f"kernelforge.patch: {len(self.patched)} module(s) patched, {len(self.skipped)} skipped"]

        def paths(ps: list[str]) -> str:
            shown = ", ".join(ps[:max_paths])
            return shown + (f", ... (+{len(ps) - max_paths} more)" if len(ps) > max_paths else "")

        groups: dict[tuple[str, str], list[str]] = {}
        for m in self.patched:
            groups.setdefault((m.qualname or m.cls, m.op), []).append(m.path or "<root>")
        if groups:
            lines.append("  patched:")
            for (cls, op), ps in groups.items():
                lines.append(f"    {len(ps):4d} x {cls} -> {op}")
                lines.append(f"           {paths(ps)}")
        groups = {}
        for m in self.skipped:
            groups.setdefault((m.qualname or m.cls, m.reason), []).append(m.path or "<root>")
        if groups:
            lines.append("  skipped:")
            for (cls, reason), ps in groups.items():
                lines.append(f"    {len(ps):4d} x {cls}: {reason}")
                lines.append(f"           {paths(ps)}")
        return "\n".join(lines)


# ---- patch / unpatch -----------------------------------------------------------------------------


@dataclass
class _PatchState:
    entry: Replacement
    original: Callable  # the class forward, bound to the module (used by the runtime fallback)
    installed: Callable  # the bound forward we installed (unpatch checks nobody replaced it since)
    extra: object = None  # what entry.setup returned
    options: dict = field(default_factory=dict)  # patch()'s per-family options, e.g. logits_with_loss


def patch(model: torch.nn.Module, *, norms: bool = True, activations: bool = True, rope: bool = True,
          loss: bool = True, logits_with_loss: bool = False) -> PatchReport:
    """Replace the forward of every supported norm, activation and attention module and causal LM in
    ``model``; returns what was done.

    ``norms`` / ``activations`` / ``rope`` / ``loss`` choose the families (all by default). Norms:
    torch.nn.RMSNorm / LayerNorm, diffusers RMSNorm, transformers Llama-style RMSNorm. Activations:
    transformers gated MLPs (``down_proj(act_fn(gate_proj(x)) * up_proj(x))`` with SiLU or
    F.gelu-based GELU) and the diffusers GELU / GEGLU / SwiGLU / LinearActivation(GELU) projections.
    RoPE: attention modules whose forward calls transformers' Llama-style ``apply_rotary_pos_emb``
    (Llama, Mistral, Qwen2/3, ...) or diffusers' LTX-Video ``apply_rotary_emb``; the module-level
    functions themselves are left alone (only that instance's forward calls kernelforge instead).
    Loss: transformers causal LMs with the Llama-style forward (``self.model`` -> ``self.lm_head`` ->
    ``self.loss_function``, ForCausalLMLoss; Llama, Mistral, Qwen2/3, Gemma, Phi, ...) or Gemma-2's
    softcapped one: called with ``labels``, they compute the loss with ``fused_linear_cross_entropy``
    from the hidden states (ForCausalLMLoss semantics: shifted labels or ``shift_labels``, -100 ignored,
    mean or sum / ``num_items_in_batch``) and return ``logits=None``, unless ``logits_with_loss=True``,
    which also computes and returns the logits; without labels the original forward runs.
    Modules already patched are skipped (patching twice is patching once; the options of the first
    patch stay).
    """
    families = {f for f, on in (("norm", norms), ("activation", activations), ("rope", rope), ("loss", loss))
                if on}
    options = {"logits_with_loss": bool(logits_with_loss)}
    table = [e for e in REPLACEMENTS if e.family in families or e.family not in FAMILIES]
    report = PatchReport()
    for path, module in model.named_modules():
        cls, qual = type(module).__name__, _qualname(type(module))
        if _STATE_ATTR in module.__dict__:
            report.skipped.append(SkippedModule(path, cls, "already patched by kernelforge", qual))
            continue
        entry, verdict = next(((e, v) for e in table if (v := e.match(module)) is not None), (None, None))
        if entry is None:
            reason = _unsupported_reason(module, families)
            if reason is not None:
                report.skipped.append(SkippedModule(path, cls, reason, qual))
            continue
        if verdict is True and "forward" in module.__dict__:
            verdict = "forward is already overridden on this instance (e.g. by an accelerate hook)"
        if verdict is not True:
            report.skipped.append(SkippedModule(path, cls, str(verdict), qual))
            continue
        installed = types.MethodType(entry.forward, module)
        extra = entry.setup(module) if entry.setup is not None else None
        module.__dict__[_STATE_ATTR] = _PatchState(entry, module.forward, installed, extra, dict(options))
        module.forward = installed
        report.patched.append(PatchedModule(path, cls, entry.op, qual))
    return report


def unpatch(model: torch.nn.Module) -> int:
    """Restore the original forward of every module ``patch`` changed; returns how many."""
    restored = 0
    for path, module in model.named_modules():
        state = module.__dict__.get(_STATE_ATTR)
        if state is None:
            continue
        if module.__dict__.get("forward") is not state.installed:
            warnings.warn(
                f"kernelforge.unpatch: the forward of {path or '<root>'} ({type(module).__name__}) was "
                "replaced after kernelforge patched it; leaving it as it is",
                stacklevel=2,
            )
            continue
        # patch() only takes modules whose forward comes from the class, so removing the instance
        # attribute restores exactly what was there.
        del module.__dict__["forward"]
        del module.__dict__[_STATE_ATTR]
        restored += 1
    return restored


# ---- runtime helpers -----------------------------------------------------------------------------

_warned: set[str] = set()


_DTYPE_HINT = "Cast the model and its inputs to one dtype to use the kernel."


def _warn_fallback(module: torch.nn.Module, why: str, hint: str = _DTYPE_HINT, stacklevel: int = 4) -> None:
    """Announce that the original computation runs instead of the kernel: warn once, or raise if strict."""
    _announce_fallback(type(module).__name__, why, "forward", hint, stacklevel + 1)


def _announce_fallback(subject: str, why: str, original: str, hint: str, stacklevel: int) -> None:
    """The message of _warn_fallback for any subject (a module class, or a function a patched forward
    calls): "<subject> called with <why>; ... the original <original> runs instead"."""
    msg = (
        f"kernelforge: {subject} called with {why}; the kernel cannot reproduce the "
        f"original result, so the original {original} runs instead"
    )
    if os.environ.get("KF_STRICT") == "1":
        raise RuntimeError(msg + " (KF_STRICT=1 makes this an error)")
    if msg not in _warned:
        _warned.add(msg)
        warnings.warn(f"{msg}. {hint}", stacklevel=stacklevel)


def _fallback(module: torch.nn.Module, why: str, *args, **kwargs):
    """Run the original forward for an input the kernel cannot take: warn once, or raise if strict."""
    _warn_fallback(module, why)
    return module.__dict__[_STATE_ATTR].original(*args, **kwargs)


def _rows(x: torch.Tensor) -> torch.Tensor:
    """x itself when the op can read it as rows (contiguous last dim, leading dims collapse into one
    stride); otherwise a contiguous copy. Same values either way, so this is not a fallback."""
    if x.is_contiguous():
        return x
    shape, strides = x.shape, x.stride()
    if x.dim() == 0 or (shape[-1] > 1 and strides[-1] != 1):
        return x.contiguous()
    expect = -1
    for size, stride in zip(reversed(shape[:-1]), reversed(strides[:-1])):
        if size == 1:
            continue
        if expect >= 0 and stride != expect:
            return x.contiguous()
        expect = stride * size
    return x


def _dtype_mismatch(x: torch.Tensor, p: torch.Tensor | None, name: str) -> str | None:
    if p is not None and p.dtype != x.dtype:
        return f"input dtype {x.dtype} and {name} dtype {p.dtype}"
    return None


_RMS_EPS_F32 = torch.finfo(torch.float32).eps
_RMS_EPS_F64 = torch.finfo(torch.float64).eps


# ---- entries: transformers Llama-style RMSNorm ---------------------------------------------------

_llama_key: tuple | None = None


def _code_key(fn) -> tuple | None:
    """What a function computes, independent of its name, file, line numbers and docstring."""
    code = getattr(fn, "__code__", None)
    if code is None:
        return None
    consts = code.co_consts
    if fn.__doc__ is not None and consts and consts[0] == fn.__doc__:
        consts = consts[1:]
    return (code.co_code, code.co_names, consts, code.co_argcount, code.co_kwonlyargcount)


def _llama_forward_key() -> tuple | None:
    global _llama_key
    if _llama_key is None:
        try:
            from transformers.models.llama.modeling_llama import LlamaRMSNorm
        except Exception:  # transformers missing or broken: nothing to compare against
            return None
        _llama_key = _code_key(LlamaRMSNorm.forward)
    return _llama_key


def _match_hf_rms_norm(m: torch.nn.Module):
    cls = type(m)
    if not cls.__name__.endswith("RMSNorm") or isinstance(m, torch.nn.RMSNorm):
        return None
    w = getattr(m, "weight", None)
    if not isinstance(w, torch.nn.Parameter):
        return "has no `weight` parameter"
    key, ref = _code_key(cls.forward), _llama_forward_key()
    if ref is None:
        return "cannot import transformers' LlamaRMSNorm to verify that the forward is the same"
    if key != ref:
        consts = key[2] if key else ()
        if any(c == 1 for c in consts if isinstance(c, (int, float)) and not isinstance(c, bool)):
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
        return _fallback(self, _dtype_mismatch(hidden_states, w, "weight"), hidden_states)
    return _ops._rms_norm(_rows(hidden_states), w, self.variance_epsilon)


# ---- entries: diffusers RMSNorm ------------------------------------------------------------------


def _diffusers_class(module_name: str, cls_name: str):
    mod = sys.modules.get(module_name)  # never import diffusers: if it is not loaded, no model uses it
    return getattr(mod, cls_name, None) if mod is not None else None


def _match_diffusers_rms_norm(m: torch.nn.Module):
    cls = _diffusers_class("diffusers.models.normalization", "RMSNorm")
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
            return _fallback(self, _dtype_mismatch(hidden_states, w, "weight"), hidden_states)
        if self.bias is not None:
            return _fallback(self, "a bias (set after patching)", hidden_states)
    return _ops._rms_norm(_rows(hidden_states), w, self.eps)


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
    return _rows(x) if k == 1 else x.reshape(*x.shape[: x.dim() - k], -1)


def _flat_param(p: torch.Tensor | None, k: int) -> torch.Tensor | None:
    return p if p is None or k == 1 else p.reshape(-1)


def _torch_rms_norm_forward(self, input):
    w = self.weight
    if w is not None and input.dtype != w.dtype:
        return _fallback(self, _dtype_mismatch(input, w, "weight"), input)
    shape = self.normalized_shape
    k = len(shape)
    if input.dim() < k or input.shape[input.dim() - k :] != shape:
        return self.__dict__[_STATE_ATTR].original(input)  # torch raises its own shape error
    eps = self.eps
    if eps is None:  # aten: epsilon of the computation dtype
        eps = _RMS_EPS_F64 if input.dtype == torch.float64 else _RMS_EPS_F32
    y = _ops._rms_norm(_flat(input, k), _flat_param(w, k), eps)
    return y if k == 1 else y.view(input.shape)


def _torch_layer_norm_forward(self, input):
    w, b = self.weight, self.bias
    why = _dtype_mismatch(input, w, "weight") or _dtype_mismatch(input, b, "bias")
    if why is not None:
        return _fallback(self, why, input)
    shape = self.normalized_shape
    k = len(shape)
    if input.dim() < k or input.shape[input.dim() - k :] != shape:
        return self.__dict__[_STATE_ATTR].original(input)  # torch raises its own shape error
    y = _ops._layer_norm(_flat(input, k), _flat_param(w, k), _flat_param(b, k), self.eps)
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

from . import _patch_activation  # noqa: E402,F401  (registers the activation entries)
from . import _patch_rope  # noqa: E402,F401  (registers the rope entries)
from . import _patch_loss  # noqa: E402,F401  (registers the loss entries)
