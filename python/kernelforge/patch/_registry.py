"""The patch table: what a family module registers and what ``patch()`` reads.

``REPLACEMENTS`` is an ordered list of ``Replacement(matcher -> forward)`` entries; the first entry
whose matcher claims a module decides (patch it, or skip it with a reason). ``UNSUPPORTED`` lists,
per family, functions that name modules no entry claimed but that look like the family's (reported
as skipped). A patched module keeps its patch state in ``module.__dict__[STATE_ATTR]``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import torch

STATE_ATTR = "_kf_patch"

FAMILIES = ("norm", "activation", "rope", "loss", "graph", "moe")


@dataclass(frozen=True)
class Replacement:
    """One entry of the patch table.

    ``match(module)`` returns None when the entry does not apply to the module, True to patch it,
    or a string: the reason the module is recognised but skipped. ``forward`` is the function
    installed as the module's forward (bound to the instance); ``op`` names the kernelforge op it
    calls, for the report. ``family`` is "norm", "activation", "rope", "loss", "graph" or "moe" (switched
    by ``patch``'s flags norms / activations / rope / loss / graph / moe); entries of any other family are always
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


REPLACEMENTS: list[Replacement] = []


def register_replacement(entry: Replacement, *, before: str | None = None) -> None:
    """Add an entry to the table (at the end, or before the entry named ``before``)."""
    if before is None:
        REPLACEMENTS.append(entry)
        return
    idx = next(i for i, e in enumerate(REPLACEMENTS) if e.name == before)
    REPLACEMENTS.insert(idx, entry)


UNSUPPORTED: list[tuple[str, Callable[[torch.nn.Module], "str | None"]]] = []  # (family, reason(module))


def register_unsupported(family: str, reason: Callable[[torch.nn.Module], "str | None"]) -> None:
    """``reason(module)``: why a module of ``family`` that no entry claimed is not patched, or None."""
    UNSUPPORTED.append((family, reason))


@dataclass
class PatchState:
    entry: Replacement
    original: Callable  # the class forward, bound to the module (used by the runtime fallback)
    installed: Callable  # the bound forward we installed (unpatch checks nobody replaced it since)
    extra: object = None  # what entry.setup returned
    options: dict = field(default_factory=dict)  # patch()'s per-family options, e.g. logits_with_loss
