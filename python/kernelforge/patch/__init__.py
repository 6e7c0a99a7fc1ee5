"""patch(model): route the norm and activation modules, the rotary embeddings and the causal-LM loss of a
transformers / diffusers / plain torch model to kernelforge, with their attention and mixture-of-experts
layers.

Only the *forward* of matching module instances is replaced (``module.forward = MethodType(...)``);
parameters, buffers, state_dict keys and the class are untouched, and ``unpatch(model)`` puts the
original forward back. Matching is table-driven (``_registry.py``): ``REPLACEMENTS`` is an ordered
list of ``Replacement(matcher -> forward)`` entries; the first entry whose matcher claims a module
decides (patch it, or skip it with a reason). Each family registers its entries from its own module:
``norm.py``, ``activation.py``, ``rope.py`` (attention modules whose rotary function is replaced for
that instance), ``moe.py`` (transformers experts modules) and ``loss.py`` (transformers causal LMs whose
loss, when labels are passed, is computed by ``fused_linear_cross_entropy`` from the hidden states,
without the logits); they share
the matching helpers of ``_match.py`` and the run-time helpers of ``_runtime.py``. New op families
add entries with ``register_replacement``.

Matchers recognise a module by what it computes, not by its name: the normalized syntax tree of its
code against reference sources, and, where that is not conclusive, the module's own forward run on
a small CPU probe next to the kernelforge computation.

At run time a patched forward sends an input to the kernel only when the result is the one the
original forward would give; otherwise (e.g. weight dtype != input dtype, where transformers would
return the promoted dtype) it calls the original forward and warns once, or raises when the
environment has ``KF_STRICT=1``. It never falls back silently.
"""

from __future__ import annotations

import types
import warnings
from dataclasses import dataclass, field

import torch

# each family module registers its entries, in this order (the table is ordered)
from . import norm as _norm_entries  # noqa: F401  (isort: skip)
from . import activation as _activation_entries  # noqa: F401  (isort: skip)
from . import rope as _rope_entries  # noqa: F401  (isort: skip)
from . import loss as _loss_entries  # noqa: F401  (isort: skip)
from . import graph as _graph_entries  # noqa: F401  (isort: skip)
from . import moe as _moe_entries  # noqa: F401  (isort: skip)
from . import attention as _attention
from ._match import qualname as _qualname
from ._registry import FAMILIES, REPLACEMENTS, STATE_ATTR, UNSUPPORTED, PatchState, Replacement, register_replacement

__all__ = ["patch", "unpatch", "PatchReport", "Replacement", "REPLACEMENTS", "register_replacement"]


def _unsupported_reason(m: torch.nn.Module, families: "set[str] | None" = None) -> str | None:
    """Consulted after the table: modules of a selected family that no entry claimed."""
    for family, reason in UNSUPPORTED:
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


def patch(model: torch.nn.Module, *, norms: bool = True, activations: bool = True, rope: bool = True,
          loss: bool = True, logits_with_loss: bool = False, attention: bool = True,
          graph: bool = True, moe: bool = True) -> PatchReport:
    """Replace the forward of every supported norm, activation and attention module and causal LM in
    ``model``; returns what was done.

    ``norms`` / ``activations`` / ``rope`` / ``loss`` choose the families (all by default). Norms:
    torch.nn.RMSNorm / LayerNorm, diffusers RMSNorm, transformers Llama-style RMSNorm. Activations:
    transformers gated MLPs (``down_proj(act_fn(gate_proj(x)) * up_proj(x))`` with SiLU or
    F.gelu-based GELU), transformers fc1 / GELU / fc2 MLPs (ViT, Dinov2, CLIP, SigLIP, ...) and the
    diffusers GELU / GEGLU / SwiGLU / LinearActivation(GELU) projections.
    RoPE: attention modules whose forward calls transformers' Llama-style ``apply_rotary_pos_emb``
    (Llama, Mistral, Qwen2/3, ...) or diffusers' LTX-Video ``apply_rotary_emb``; the module-level
    functions themselves are left alone (only that instance's forward calls kernelforge instead).
    Loss: transformers causal LMs whose forward computes ``self.loss_function`` (ForCausalLMLoss) of
    ``self.lm_head`` of the hidden states of ``self.model``, optionally softcapped (Llama, Mistral,
    Qwen2/3, Gemma 1/2/3, Phi, ...; verified on a CPU probe when patching): called with ``labels``,
    they compute the loss with ``fused_linear_cross_entropy``
    from the hidden states (ForCausalLMLoss semantics: shifted labels or ``shift_labels``, -100 ignored,
    mean or sum / ``num_items_in_batch``) and return ``logits=None``, unless ``logits_with_loss=True``,
    which also computes and returns the logits; without labels the original forward runs.
    Attention (``attention``; inference and training, see ``patch/attention.py``): transformers models get
    ``set_attn_implementation("kernelforge")`` (registered in transformers' AttentionInterface and
    AttentionMaskInterface: causal, sliding window, softcap, sinks, GQA, padding masks as varlen);
    diffusers LTX-Video / Flux / Wan attention modules get a processor that routes their
    ``dispatch_attention_fn`` calls to ``kernelforge.attention`` (differentiable: gradients flow through
    its backward). Calls with dropout in training or a mask pattern the kernel cannot express run the
    library's attention instead, announced once.
    Graph (``graph``): PyTorch Geometric ``GCNConv`` / ``SAGEConv`` / ``GINConv`` with sum, mean or max
    aggregation: their ``propagate`` runs as one ``gather_scatter`` over the ``[2, E]`` edge_index, the rest
    of the layer as PyG wrote it (``patch/graph.py``; torch_geometric is never imported by kernelforge).
    MoE (``moe``): transformers experts modules (``@use_experts_implementation``: Mixtral, Qwen2/3-MoE,
    DeepSeek-V2/V3, gpt-oss, ...) run their expert MLPs as two ``kernelforge.grouped_mm`` calls over all
    experts, forward and backward (``patch/moe.py``).
    Modules already patched are skipped (patching twice is patching once; the options of the first
    patch stay).
    """
    families = {f for f, on in (("norm", norms), ("activation", activations), ("rope", rope), ("loss", loss),
                                ("graph", graph), ("moe", moe)) if on}
    options = {"logits_with_loss": bool(logits_with_loss)}
    table = [e for e in REPLACEMENTS if e.family in families or e.family not in FAMILIES]
    report = PatchReport()
    for path, module in model.named_modules():
        cls, qual = type(module).__name__, _qualname(type(module))
        if STATE_ATTR in module.__dict__:
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
        module.__dict__[STATE_ATTR] = PatchState(entry, module.forward, installed, extra, dict(options))
        module.forward = installed
        report.patched.append(PatchedModule(path, cls, entry.op, qual))
    if attention:
        for path, m in _attention.patch_transformers(model):
            report.patched.append(PatchedModule(path, type(m).__name__, "kernelforge.attention", _qualname(type(m))))
        patched, skipped = _attention.patch_diffusers(model)
        for path, m in patched:
            report.patched.append(PatchedModule(path, type(m).__name__, "kernelforge.attention", _qualname(type(m))))
        for path, m, why in skipped:
            report.skipped.append(SkippedModule(path, type(m).__name__, why, _qualname(type(m))))
    return report


def unpatch(model: torch.nn.Module) -> int:
    """Restore the original forward of every module ``patch`` changed, the attention implementation of
    transformers models and the processors of diffusers attention modules; returns how many."""
    restored = _attention.unpatch_transformers(model) + _attention.unpatch_diffusers(model)
    for path, module in model.named_modules():
        state = module.__dict__.get(STATE_ATTR)
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
        del module.__dict__[STATE_ATTR]
        restored += 1
    return restored
