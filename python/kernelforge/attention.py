"""The attention family: the fake (meta) implementations of its ops (kernelforge::attention and
kernelforge::attention_backward) and the functional API, differentiable for q, k, v and sinks.

The ops live in C++ (`torch/kf_attention.cpp`, whose autograd Function computes lse in the forward
and calls attention_backward; the contract and formula in include/kernelforge/attention.h);
arguments are validated there. Per batch b, query head h, row i
(Sq_b, Sk_b: the sequence's lengths, d = Sk_b - Sq_b, bottom-right alignment):

    s_ij  = scale * q_i . k_j                    (scale None: 1 / sqrt(Dqk))
    s_ij  = softcap * tanh(s_ij / softcap)       (softcap > 0, Gemma 2)
    key j visible when j >= i + d - window[0] (window[0] >= 0) and j <= i + d + window[1]
          (window[1] >= 0); causal=True is window[1] = 0
    out_i = softmax over the visible j (and the sink logit sinks[h], gpt-oss) of s_ij, times v_j
    lse_i = log of the softmax denominator (natural log, float32)

A row that sees no key gets out = 0 (never NaN), lse = -inf (or sinks[h]). Backward (p_ij the
softmax weights, D_i = dout_i . out_i): dv_j = sum_i p_ij dout_i, ds_ij = p_ij (dout_i . v_j - D_i)
(times the softcap derivative), dq / dk = scale * ds k / ds^T q, dsinks_h = -sum_i p_sink_i D_i;
lse carries no gradient. GQA / MQA: Hq a
multiple of Hkv, query head h reads key/value head h // (Hq // Hkv). Head dims Dqk = Dv in
{64, 96, 128, 256}, or Dqk 192 with Dv 128. CUDA: float16 / bfloat16, float32 softmax math;
CPU tensors run the float64 C++ reference.

``scaled_dot_product_attention`` takes torch's SDPA arguments ([B, H, S, D]); what the kernel cannot
compute (an ``attn_mask``, dropout, a float32 CUDA input, a top-left causal mask the kernel's
bottom-right alignment cannot express) runs torch's SDPA instead, with a warning once (KF_STRICT=1:
an error).
"""

from __future__ import annotations

import torch

from ._ops import _ops

_LAYOUTS = ("bshd", "bhsd", "varlen")
_RANK = {"bshd": 4, "bhsd": 4, "varlen": 3}
_FORM = {"bshd": "[B, Sq, Hq, D]", "bhsd": "[B, Hq, Sq, D]", "varlen": "[Tq, Hq, D]"}


# ---- fake implementation --------------------------------------------------------------------------


@torch.library.register_fake("kernelforge::attention")
def _attention_fake(q, k, v, *, causal, scale, window_left, window_right, softcap, sinks, cu_seqlens_q,
                    cu_seqlens_k, max_seqlen_q, max_seqlen_k, layout, return_lse, deterministic=False):
    # The C++ impl's shapes (kf_attention.cpp): out contiguous in q's layout with v's head dim; lse
    # float32 [B, Hq, Sq] / [Hq, Tq]. max_seqlen_q / _k are not read: new lengths trace nothing new.
    if layout not in _LAYOUTS:
        raise ValueError(f"attention: layout must be 'bshd', 'bhsd' or 'varlen', got '{layout}'")
    if q.dim() != _RANK[layout] or v.dim() != _RANK[layout]:
        raise ValueError(f"attention: q and v must have {_RANK[layout]} dimensions {_FORM[layout]} for layout "
                         f"'{layout}', got {q.dim()} and {v.dim()}")
    out = q.new_empty((*q.shape[:-1], v.shape[-1]))
    if not return_lse:
        lse_shape = (0,)
    elif layout == "varlen":
        lse_shape = (q.shape[1], q.shape[0])
    elif layout == "bshd":
        lse_shape = (q.shape[0], q.shape[2], q.shape[1])
    else:
        lse_shape = tuple(q.shape[:3])
    return out, q.new_empty(lse_shape, dtype=torch.float32)


@torch.library.register_fake("kernelforge::attention_backward")
def _attention_backward_fake(dout, q, k, v, out, lse, *, causal, scale, window_left, window_right, softcap, sinks,
                             cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, layout, deterministic):
    # The C++ impl's: dq, dk, dv like q, k, v (empty_like: the input's strides when dense), dsinks
    # float32 with sinks' shape [Hq], or [0] without sinks.
    if layout not in _LAYOUTS:
        raise ValueError(f"attention: layout must be 'bshd', 'bhsd' or 'varlen', got '{layout}'")
    if q.dim() != _RANK[layout] or v.dim() != _RANK[layout]:
        raise ValueError(f"attention: q and v must have {_RANK[layout]} dimensions {_FORM[layout]} for layout "
                         f"'{layout}', got {q.dim()} and {v.dim()}")
    dsinks = q.new_empty(sinks.shape if sinks is not None else (0,), dtype=torch.float32)
    return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v), dsinks


# ---- functional API -------------------------------------------------------------------------------


def _window(window) -> tuple[int, int]:
    try:
        left, right = window
    except (TypeError, ValueError):
        raise ValueError(f"attention: window must be a pair (left, right) of ints (-1: unbounded), got {window!r}") \
            from None
    return (-1 if left is None else int(left)), (-1 if right is None else int(right))


def attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    causal: bool = False,
    scale: float | None = None,
    window: tuple[int, int] = (-1, -1),
    softcap: float = 0.0,
    sinks: torch.Tensor | None = None,
    cu_seqlens_q: torch.Tensor | None = None,
    cu_seqlens_k: torch.Tensor | None = None,
    max_seqlen_q: int | None = None,
    max_seqlen_k: int | None = None,
    layout: str | None = None,
    return_lse: bool = False,
    deterministic: bool = False,
):
    """Scaled dot-product attention: returns out, or (out, lse) with ``return_lse=True``;
    differentiable for q, k, v and sinks.

    layout "bshd" (the default without cu_seqlens): q [B, Sq, Hq, Dqk], k [B, Sk, Hkv, Dqk],
    v [B, Sk, Hkv, Dv], out [B, Sq, Hq, Dv]. "bhsd": [B, H, S, D] (SDPA's). "varlen" (the default
    with ``cu_seqlens_q``): packed q [Tq, Hq, Dqk], k / v [Tk, Hkv, D], ``cu_seqlens_q`` /
    ``cu_seqlens_k`` int32 [B + 1] (sequence b holds tokens cu[b] .. cu[b+1] - 1), ``max_seqlen_q`` /
    ``max_seqlen_k`` upper bounds of the lengths (None: the token count; always correct, more idle
    blocks). Any strides with the last one 1 (e.g. slices of a fused qkv projection).

    ``causal``: bottom-right aligned when Sq != Sk (flash-attn's convention). ``window=(left,
    right)``: keys at most ``left`` before / ``right`` after the diagonal, -1 unbounded (causal sliding
    window of W keys including the current one: ``causal=True, window=(W - 1, 0)``). ``softcap`` > 0:
    logits pass through ``softcap * tanh(s / softcap)``. ``sinks``: a per-query-head logit [Hq]
    (float32 or q's dtype) added to every softmax denominator (gpt-oss). ``lse``: float32
    [B, Hq, Sq] ([Hq, Tq] for varlen), natural log; it carries no gradient (returned with
    requires_grad=False).

    Backward: gradients of q, k, v (their dtypes) and sinks (its dtype; summed in float32). When a
    gradient is needed the forward also computes lse and keeps q, k, v, out, lse for the backward.
    ``deterministic=True``: the backward sums dq and dsinks in a fixed order, so reruns give
    bit-identical gradients (the default adds dq with float atomics: fewer passes, order-dependent
    rounding); the forward ignores it. Double backward (create_graph=True) is an error.
    """
    if layout is None:
        layout = "varlen" if cu_seqlens_q is not None else "bshd"
    _check_ranks(q, v, layout)
    left, right = _window(window)
    out, lse = _ops.attention(
        q, k, v, causal=bool(causal), scale=None if scale is None else float(scale), window_left=left,
        window_right=right, softcap=float(softcap or 0.0), sinks=sinks, cu_seqlens_q=cu_seqlens_q,
        cu_seqlens_k=cu_seqlens_k, max_seqlen_q=0 if max_seqlen_q is None else max_seqlen_q,
        max_seqlen_k=0 if max_seqlen_k is None else max_seqlen_k, layout=layout, return_lse=bool(return_lse),
        deterministic=bool(deterministic))
    return (out, lse) if return_lse else out


_FORMS = {"varlen": "[Tq, Hq, D] for layout 'varlen'", "bshd": "[B, Sq, Hq, D] for layout 'bshd'",
          "bhsd": "[B, Hq, Sq, D] for layout 'bhsd'"}


def _check_ranks(q, v, layout) -> None:
    """The ranks the layout needs, checked before the op allocates its outputs (the op checks them too)."""
    if layout not in _FORMS:
        raise ValueError(f"attention: layout must be 'bshd', 'bhsd' or 'varlen', got '{layout}'")
    rank = 3 if layout == "varlen" else 4
    if q.dim() != rank:
        raise ValueError(f"attention: q must have {rank} dimensions {_FORMS[layout]}, got {q.dim()}")
    if v.dim() != rank:
        raise ValueError(f"attention: v must have {rank} dimensions (q's layout), got {v.dim()}")


# dtypes the kernels take on CUDA; on the CPU the float64 reference takes every floating dtype (float32
# and float64 inputs are computed in float64 and rounded once to the input's dtype)
KERNEL_DTYPES = (torch.float16, torch.bfloat16)


# (Dqk, Dv) pairs the kernels compile (attention.h)
HEAD_DIMS = {(d, d) for d in (64, 96, 128, 256)} | {(192, 128)}


def visible_keys(sq: int, sk: int, causal: bool, window: tuple[int, int], device) -> torch.Tensor:
    """The contract's visibility as a boolean [Sq, Sk] (bottom-right aligned: row i's diagonal is key
    i + Sk - Sq; causal is window[1] = 0), for the plain-torch fallbacks."""
    i = torch.arange(sq, device=device).view(-1, 1)
    j = torch.arange(sk, device=device).view(1, -1)
    off = sk - sq
    left, right = window[0], (0 if causal else window[1])
    vis = torch.ones(sq, sk, dtype=torch.bool, device=device)
    if left >= 0:
        vis &= j >= i + off - left
    if right >= 0:
        vis &= j <= i + off + right
    return vis


def head_dims_supported(q: torch.Tensor, v: torch.Tensor) -> bool:
    return (q.shape[-1], v.shape[-1]) in HEAD_DIMS


def reference_dtype(t: torch.Tensor) -> torch.dtype | None:
    """The dtype the op is called with for a tensor of t's dtype and device (CPU float32: float64, the
    reference computes in float64 anyway), or None when no kernelforge path takes it."""
    if t.dtype in KERNEL_DTYPES:
        return t.dtype
    if t.device.type == "cpu" and t.dtype in (torch.float32, torch.float64):
        return torch.float64
    return None


def sdpa_fallback(why: str) -> None:
    """Warn once (KF_STRICT=1: raise) that torch's SDPA runs instead of the kernel, and why."""
    from .patch._runtime import announce_fallback  # noqa: PLC0415  (the patch package imports this module)

    announce_fallback("kernelforge.scaled_dot_product_attention", why,
                      "torch.nn.functional.scaled_dot_product_attention",
                      "Pass no attn_mask, dropout_p=0 and float16 / bfloat16 CUDA tensors to use the kernel.", 4)


def scaled_dot_product_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attn_mask: torch.Tensor | None = None,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    scale: float | None = None,
    enable_gqa: bool = False,
) -> torch.Tensor:
    """``torch.nn.functional.scaled_dot_product_attention`` semantics on [B, H, S, D] tensors.

    ``is_causal`` is SDPA's top-left aligned mask (key j visible from query i when j <= i); with
    Sq > Sk the kernel runs it as ``window=(-1, Sq - Sk)``. Runs torch's SDPA instead (a warning
    once, KF_STRICT=1: an error) for an ``attn_mask``, ``dropout_p > 0``, ``is_causal`` with
    Sq < Sk, float32 CUDA tensors, more than 4 dimensions, or Hq != Hkv without ``enable_gqa``
    (torch's error). Differentiable for query, key and value (kernelforge.attention's backward).
    """
    sdpa = torch.nn.functional.scaled_dot_product_attention

    def fallback(why):
        sdpa_fallback(why)
        return sdpa(query, key, value, attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal,
                    scale=scale, enable_gqa=enable_gqa)

    if query.dim() != 4 or key.dim() != 4 or value.dim() != 4:
        return fallback(f"{query.dim()}-dimensional tensors (the kernel takes [B, H, S, D])")
    if query.shape[1] != key.shape[1] and not enable_gqa:  # torch's own error
        return sdpa(query, key, value, attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal, scale=scale)
    if attn_mask is not None:
        return fallback("an attn_mask")
    if dropout_p > 0.0:
        return fallback(f"dropout_p={dropout_p}")
    dtype = reference_dtype(query)
    if dtype is None:
        return fallback(f"{query.dtype} {query.device.type} tensors")
    if not head_dims_supported(query, value):
        return fallback(f"head dims {query.shape[-1]}/{value.shape[-1]} (the kernels take 64, 96, 128, 256 "
                        "and 192/128)")
    sq, sk = query.shape[2], key.shape[2]
    window = (-1, -1)
    if is_causal:
        if sq < sk:
            return fallback(f"is_causal=True and Sq={sq} < Sk={sk} (SDPA's top-left causal mask; the kernel aligns "
                            "causal masks bottom-right)")
        window = (-1, sq - sk)  # top-left: j <= i = i + (Sk - Sq) + (Sq - Sk)
    q, k, v = (t.to(dtype) for t in (query, key, value))
    out = attention(q, k, v, scale=scale, window=window, layout="bhsd")
    return out.to(query.dtype)


__all__ = ["attention", "scaled_dot_product_attention"]
