"""The RoPE family: fake (meta) implementations of its ops and the functional API.

The ops (CUDA kernel, the float64 CPU reference, autograd) live in C++ (`torch/kf_torch.cpp`,
formulas in include/kernelforge/rope.h, schemas in notes/interfaces.md). Arguments are validated in
C++ only; this file maps ``layout`` and ``rotary_dim`` to the op's integers.

Semantics: for every rotated column j < R, out[j] = x[j] * cos[j] + rot(x)[j] * sin[j], with rot the
rotate-half of HF Llama (``interleaved=False``: pairs (i, i + R/2)) or the interleaved rotation of
GPT-J / diffusers ``apply_rotary_emb(use_real=True, use_real_unbind_dim=-1)`` (pairs (2i, 2i+1));
cos/sin as those libraries pass them (full rotary width, one value per column). Columns R.. pass
through. float32 math, one rounding.
"""

from __future__ import annotations

import torch

from ._ops import _ops

_LAYOUTS = {"bshd": 0, "bhsd": 1}


def _like(t: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(t)  # the C++ impl's rule: t's strides when t is dense, else contiguous


@torch.library.register_fake("kernelforge::apply_rope")
def _apply_rope_fake(q, k, cos, sin, position_ids, interleaved, layout, rotary_dim):
    return _like(q), (_like(k) if k is not None else q.new_empty((0,)))


@torch.library.register_fake("kernelforge::apply_rope_backward")
def _apply_rope_backward_fake(dq_out, dk_out, cos, sin, position_ids, interleaved, layout, rotary_dim):
    return _like(dq_out), (_like(dk_out) if dk_out is not None else dq_out.new_empty((0,)))


@torch.library.register_fake("kernelforge::apply_rope_inplace")
def _apply_rope_inplace_fake(q, k, cos, sin, position_ids, interleaved, layout, rotary_dim):
    return None


def apply_rope(
    q: torch.Tensor,
    k: torch.Tensor | None,
    cos: torch.Tensor,
    sin: torch.Tensor,
    *,
    interleaved: bool = False,
    layout: str = "bshd",
    position_ids: torch.Tensor | None = None,
    rotary_dim: int | None = None,
    inplace: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Rotary position embedding of q and k in one call: returns (q_out, k_out).

    q: [B, S, Hq, D] (layout="bshd") or [B, Hq, S, D] ("bhsd"); k: the same layout with Hk heads
    (GQA), or None. cos, sin: [S, R] or [B, S, R] (HF's ``LlamaRotaryEmbedding`` output works as it
    is), or a cache [max_pos, R] indexed by ``position_ids`` [B, S] (int64). R = cos.shape[-1] <= D,
    even; ``rotary_dim``, when given, must equal it (a check). Columns R.. are passed through. cos/sin may be float32 with
    16-bit q/k. ``inplace=True`` rotates q and k in place and returns them (no autograd).
    Gradients flow to q and k (not to cos/sin).
    """
    lay = _LAYOUTS.get(layout)
    if lay is None:
        raise ValueError(f"apply_rope: layout must be 'bshd' or 'bhsd', got {layout!r}")
    rd = 0 if rotary_dim is None else int(rotary_dim)
    if inplace:
        if torch.is_grad_enabled() and (q.requires_grad or (k is not None and k.requires_grad)):
            raise RuntimeError(
                "apply_rope: inplace=True has no autograd support; use inplace=False for tensors that require grad"
            )
        _ops.apply_rope_inplace(q, k, cos, sin, position_ids, interleaved, lay, rd)
        return q, k
    q_out, k_out = _ops.apply_rope(q, k, cos, sin, position_ids, interleaved, lay, rd)
    return q_out, (k_out if k is not None else None)
