"""The attention family of patch(): transformers models through the attention interface, diffusers
transformers through their attention processors, in inference and in training (kernelforge.attention
is differentiable for q, k, v and sinks). Dropout in training, or a mask the kernel cannot express,
runs the library's own attention, with a warning once (KF_STRICT=1: an error).

transformers (5.x): ``"kernelforge"`` is registered in ``AttentionInterface`` (the attention function)
and ``AttentionMaskInterface`` (the mask function), and ``"paged|kernelforge"`` for continuous batching
(``generate_batch`` switches a "kernelforge" model to it; see ``hf_paged_attention``); ``patch`` sets ``model.set_attn_implementation(
"kernelforge")`` on the outermost ``PreTrainedModel`` and ``unpatch`` restores the implementation it
had. The mask function follows flash-attention's: for the plain patterns (causal, bidirectional and
their sliding-window forms, with padding) it returns None or the 2-D padding mask [B, Lk] (the window
comes from the layer's ``sliding_window`` argument); any other pattern (packed sequences detected
from position_ids, or_mask / and_mask functions, blockwise overlays) gets SDPA's 4-D boolean mask,
and the attention function runs torch's attention with it (announced).

The attention function receives query [B, Hq, Sq, D], key / value [B, Hkv, Sk, D] (not repeated for
GQA) and returns ([B, Sq, Hq, Dv], None). It calls ``kernelforge.attention`` with layout "bshd" on
``transpose(1, 2)`` views (no copy; the output is HF's layout as it is):

- causal: ``is_causal`` kwarg, else ``module.is_causal``; bottom-right aligned, as flash-attention
  (with a KV cache the Sq new rows are the last Sq of the Sk keys).
- ``sliding_window=W``: causal layers see the last W keys including their own, ``window=(W - 1, 0)``:
  transformers' eager mask ``kv > q - W`` and its flash integration's ``window_size=(W - 1, W - 1)``
  with causal. Bidirectional layers: ``window=(W, W)``, eager's ``|q - kv| <= W``.
- ``softcap`` (Gemma 2), ``s_aux`` (gpt-oss sinks, float32 or q's dtype), ``scaling``.
- a padding mask [B, Lk] (True = token): each row's tokens are gathered first (a stable sort of the
  mask, no host synchronization) into packed varlen sequences, two per row (its tokens, then its
  padding, a sequence of its own whose output is discarded); max_seqlen are the padded lengths (upper
  bounds: no .item()); the output is scattered back and zero at padded query positions (as
  flash-attention's pad_input). Query rows are the last Sq positions of the mask.
- ``cu_seq_lens_q`` / ``cu_seq_lens_k`` kwargs (padding-free batches): varlen over the flattened
  tokens; ``max_length_q`` / ``_k`` when they are ints, else the token count (no .item()).
- decode steps (generation with a KV cache, no padding mask, no gradient: causal, Sq <= 16 new rows
  against Sk > Sq keys) run ``kernelforge.decode_attention`` on the key / value states in place (one
  contiguous cache page per sequence), with the same window, softcap, sinks and scale.
- transformers' static cache without a padding mask: the keys are all max_cache_len rows, of which
  each sequence holds the first n (n = the cache's length + Sq, the same for every sequence). The mask
  function passes n as an int32 [B] device tensor (``_static_cache_lengths``); decode steps take it as
  decode_attention's seq_lens, longer steps (prefill) run varlen over keys [0, n) (``_prefix``).
  Padded batches on a static cache keep their 2-D mask and the padded path.

Training: the gradients of query, key, value and s_aux flow through the kernel's backward (the
padded path's gather / scatter and the dtype casts are ordinary differentiable torch ops).

Fallbacks (torch's attention on the same inputs, announced): dropout > 0 in training mode, a 4-D
mask, a dtype the kernel does not take (CUDA float32; the CPU runs the float64 reference for every
floating dtype), ``output_attentions``. The fallback is SDPA with an explicit boolean mask, or, with softcap or sinks,
the eager formula (softmax in float32), as the modeling files compute it.

diffusers: the processors of ``LTXVideoAttnProcessor``, ``FluxAttnProcessor`` and ``WanAttnProcessor``
call the module-level ``dispatch_attention_fn(query, key, value, attn_mask=..., ...)`` with
[B, S, H, D] tensors. ``patch`` replaces each such processor by a ``KernelforgeProcessor`` holding
it: its ``__call__`` runs the original processor's own code with that one global bound to
``kf_dispatch_attention_fn`` (the rope family's technique: the modeling module is untouched), which
calls ``kernelforge.attention(layout="bshd")`` and otherwise (a mask, dropout, a backend or parallel
config, an unsupported dtype) the original ``dispatch_attention_fn``, announced; gradients flow
through the kernel's backward.
``unpatch`` puts the original processor back.
"""

from __future__ import annotations

import importlib
import sys
import types

import torch

from ._runtime import announce_fallback

# the modules kernelforge.attention and kernelforge.decode (the package binds the names to the functions)
_attn = importlib.import_module("..attention", __package__)
_dec = importlib.import_module("..decode", __package__)

DECODE_MAX_ROWS = 16  # new rows per sequence up to which a causal step runs the decode kernel

NAME = "kernelforge"
STATE_ATTR = "_kf_attn_patch"  # on a patched transformers model: the attention implementation it had
_HINT = "Run without dropout or custom masks, with float16 / bfloat16 CUDA tensors, to use the kernel."


def _fallback(subject: str, why: str, original: str) -> None:
    announce_fallback(subject, why, original, _HINT, 5)


# ---- transformers: the mask function -----------------------------------------------------------------


def _closure(fn, name):
    code = getattr(fn, "__code__", None)
    if code is None or name not in code.co_freevars or fn.__closure__ is None:
        return None
    return fn.__closure__[code.co_freevars.index(name)].cell_contents


def plain_mask_function(mask_function) -> bool:
    """Whether a transformers mask function is causal, bidirectional, or one of them with a sliding
    window (``sliding_window_causal_mask_function`` / ``sliding_window_bidirectional_mask_function``):
    the patterns the kernel computes from is_causal and sliding_window."""
    from transformers import masking_utils as mu  # noqa: PLC0415

    if mask_function in (mu.causal_mask_function, mu.bidirectional_mask_function):
        return True
    if getattr(mask_function, "__qualname__", "") != "and_masks.<locals>.and_mask":
        return False
    parts = _closure(mask_function, "mask_functions")
    if not isinstance(parts, tuple) or len(parts) != 2:
        return False
    overlay = getattr(parts[0], "__qualname__", "")
    return ((overlay == "sliding_window_overlay.<locals>.inner_mask" and parts[1] is mu.causal_mask_function)
            or (overlay == "sliding_window_bidirectional_overlay.<locals>.inner_mask"
                and parts[1] is mu.bidirectional_mask_function))


def _causal_pattern(mask_function) -> bool:
    """Whether a plain mask function (``plain_mask_function``) is causal, with or without a window."""
    from transformers import masking_utils as mu  # noqa: PLC0415

    parts = _closure(mask_function, "mask_functions")
    return mask_function is mu.causal_mask_function or (isinstance(parts, tuple) and parts[-1] is mu.causal_mask_function)


def _static_cache_lengths(batch_size: int, q_length: int, q_offset, device) -> torch.Tensor:
    """The "mask" of a causal step on transformers' static cache without a padding mask: int32 [B], the
    keys each sequence holds after this step (every sequence the same, q_offset + q_length).

    A static cache hands the attention all max_cache_len rows, the unfilled tail included, and
    flash-attention's mask function would say "no mask" (None). Its length is q_offset, a device tensor
    (``StaticLayer.cumulative_length``) once the cache is allocated, so the count is computed on the
    device: no host synchronization, and a CUDA graph of the step replays for every new length.
    ``hf_attention`` reads a 1-D mask as these key counts (keys [0, n) of each sequence)."""
    if isinstance(q_offset, torch.Tensor):
        n = (q_offset.reshape(1) + q_length).to(torch.int32)
        return n.expand(batch_size).contiguous()
    return torch.full((batch_size,), q_offset + q_length, dtype=torch.int32, device=device)


def mask_function(batch_size, q_length, kv_length, q_offset=0, kv_offset=0, mask_function=None,
                  attention_mask=None, **kwargs):
    """transformers' mask interface for "kernelforge": flash-attention's 2-D padding mask (or None) for
    the plain patterns, SDPA's 4-D boolean mask for the others (the attention function then falls back).
    A causal pattern on a static cache without a padding mask (the cache longer than the keys it holds,
    or its length a device tensor) gets the 1-D key counts of ``_static_cache_lengths`` instead."""
    from transformers import masking_utils as mu  # noqa: PLC0415

    fn = mu.causal_mask_function if mask_function is None else mask_function
    if plain_mask_function(fn):
        if attention_mask is None and kv_offset == 0 and _causal_pattern(fn) and (
                isinstance(q_offset, torch.Tensor) or kv_length > q_offset + q_length):
            return _static_cache_lengths(batch_size, q_length, q_offset, kwargs.get("device"))
        return mu.flash_attention_mask(batch_size, q_length, kv_length, q_offset, kv_offset, fn, attention_mask,
                                       **kwargs)
    return mu.sdpa_mask(batch_size, q_length, kv_length, q_offset, kv_offset, fn, attention_mask, **kwargs)


# ---- transformers: the attention function ------------------------------------------------------------


def _window(sliding_window, causal: bool) -> tuple[int, int]:
    if sliding_window is None or sliding_window <= 0:
        return (-1, -1)
    w = int(sliding_window)
    return (w - 1, 0) if causal else (w, w)


def torch_attention(query, key, value, mask, scaling, dropout, softcap, sinks, training):
    """The fallback: [B, Hq, Sq, D] in, [B, Sq, Hq, Dv] out, with autograd. mask: a boolean
    [B or 1, 1, Sq, Sk] (True = visible) or None. Without softcap and sinks: SDPA; else the eager
    formula of the modeling files (Gemma 2: softcap before the mask; gpt-oss: the sink logit joins the
    softmax and its column is dropped), softmax in float32."""
    group = query.shape[1] // key.shape[1]
    if group > 1:
        key = key.repeat_interleave(group, dim=1)
        value = value.repeat_interleave(group, dim=1)
    if not softcap and sinks is None:
        out = torch.nn.functional.scaled_dot_product_attention(query, key, value, attn_mask=mask,
                                                               dropout_p=dropout if training else 0.0, scale=scaling)
        return out.transpose(1, 2).contiguous()
    scale = query.shape[-1] ** -0.5 if scaling is None else scaling
    s = torch.matmul(query, key.transpose(2, 3)) * scale
    if softcap:
        s = torch.tanh(s / softcap) * softcap
    if mask is not None:
        s = s.masked_fill(~mask, torch.finfo(s.dtype).min)
    if sinks is not None:
        sink = sinks.reshape(1, -1, 1, 1).expand(s.shape[0], -1, s.shape[2], 1).to(s.dtype)
        s = torch.cat([s, sink], dim=-1)
        s = s - s.max(dim=-1, keepdim=True).values
        p = torch.softmax(s, dim=-1, dtype=s.dtype)[..., :-1]
    else:
        p = torch.softmax(s, dim=-1, dtype=torch.float32).to(query.dtype)
    p = torch.nn.functional.dropout(p, p=dropout, training=training)
    return torch.matmul(p.to(value.dtype), value).transpose(1, 2).contiguous()


def _pack(x: torch.Tensor, order: torch.Tensor) -> torch.Tensor:
    """x [B, L, H, D] (any strides) -> [B * L, H, D], row b's tokens in ``order[b]``'s order."""
    b = torch.arange(x.shape[0], device=x.device).view(-1, 1)
    return x[b, order].reshape(-1, x.shape[2], x.shape[3])


def _segments(keep: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """keep [B, L] bool -> (order [B, L]: each row's kept positions first, in order, then the others;
    cu_seqlens int32 [2B + 1]: per row a sequence of its kept tokens and one of the rest)."""
    order = torch.argsort((~keep).to(torch.int8), dim=1, stable=True)
    n = keep.sum(dim=1, dtype=torch.int32)
    lens = torch.stack([n, keep.shape[1] - n], dim=1).flatten()
    cu = torch.nn.functional.pad(torch.cumsum(lens, 0, dtype=torch.int32), (1, 0))
    return order, cu


def _padded(q, k, v, mask, **opts):
    """kernelforge.attention on [B, S, H, D] views with a padding mask [B, Lk]: packed varlen
    sequences, the output scattered back, zero at padded query positions."""
    B, Sq = q.shape[:2]
    if k.shape[1] > mask.shape[1]:  # a static cache longer than the tokens seen: its tail is unused
        k, v = k[:, :mask.shape[1]], v[:, :mask.shape[1]]
    Sk = k.shape[1]
    keep_k, keep_q = mask[:, -Sk:], mask[:, -Sq:]
    order_k, cu_k = _segments(keep_k)
    order_q, cu_q = _segments(keep_q)
    out_packed = _attn.attention(_pack(q, order_q), _pack(k, order_k), _pack(v, order_k), cu_seqlens_q=cu_q,
                                 cu_seqlens_k=cu_k, max_seqlen_q=Sq, max_seqlen_k=Sk, layout="varlen", **opts)
    out = torch.empty((B, Sq) + out_packed.shape[1:], dtype=out_packed.dtype, device=out_packed.device)
    out[torch.arange(B, device=q.device).view(-1, 1), order_q] = out_packed.view(B, Sq, *out_packed.shape[1:])
    return out.masked_fill_(~keep_q[:, :, None, None], 0)


def _decode(q, k, v, causal: bool, window, softcap: float, scale, sinks, seq_lens=None):
    """The decode kernel for a decode step (kernelforge.decode_attention), or None when it does not apply.

    A decode step is causal with a few new rows (Sq <= DECODE_MAX_ROWS) against more cached keys, no
    padding mask, no gradient to carry, equal head dims of 64, 128 or 256. The cache is read in
    place: the [B, Sk, Hkv, D] views of transformers' key / value states are the kernel's contiguous
    cache (sequence b in page b, every length Sk), so no copy is made; the kernel's 16-byte row loads
    need every stride a multiple of 8 elements and an aligned start (storage offsets are checked: the
    storage itself is allocator-aligned, and storage_offset is known under torch.compile too).
    ``seq_lens``: the keys each sequence holds (int32 [B], a static cache's counts); None: all Sk."""
    B, sq, _, d = q.shape
    sk = k.shape[1]
    if not causal or window[1] > 0 or not 1 <= sq <= DECODE_MAX_ROWS or sq >= sk or d not in (64, 128, 256):
        return None
    if v.shape[-1] != d or (torch.is_grad_enabled() and any(
            t is not None and t.requires_grad for t in (q, k, v, sinks))):
        return None
    if q.device.type == "cuda" and any(
            t.storage_offset() % 8 or t.stride(0) % 8 or t.stride(1) % 8 or t.stride(2) % 8 for t in (k, v)):
        return None
    if seq_lens is None:
        seq_lens = torch.full((B,), sk, dtype=torch.int32, device=q.device)
    return _dec.decode_attention(q, k, v, seq_lens, scale=scale, window_left=window[0], softcap=softcap,
                                 sinks=sinks, max_seq_len=sk)


def _prefix(q, k, v, lengths, **opts):
    """kernelforge.attention on [B, S, H, D] views when sequence b holds keys [0, lengths[b]) of the Sk
    rows (a static cache) and its Sq queries are the last of them: varlen with two key sequences per
    row (its keys, then the unused tail, a sequence without queries), no host synchronization. The
    varlen layout packs the cache's rows: a copy of k and v (what the prefill of a static cache pays)."""
    B, Sq = q.shape[:2]
    Sk = k.shape[1]
    n = lengths.to(torch.int32)
    lens_k = torch.stack([n, Sk - n], dim=1).flatten()
    lens_q = torch.stack([torch.full_like(n, Sq), torch.zeros_like(n)], dim=1).flatten()
    cu_k, cu_q = (torch.nn.functional.pad(torch.cumsum(x, 0, dtype=torch.int32), (1, 0)) for x in (lens_k, lens_q))
    out = _attn.attention(q.reshape(B * Sq, *q.shape[2:]), k.reshape(B * Sk, *k.shape[2:]),
                          v.reshape(B * Sk, *v.shape[2:]), cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, max_seqlen_q=Sq,
                          max_seqlen_k=Sk, layout="varlen", **opts)
    return out.view(B, Sq, *out.shape[1:])


def _prefix_visible(lengths, sq: int, sk: int, causal: bool, window) -> torch.Tensor:
    """The boolean [B, 1, Sq, Sk] mask of ``_prefix``'s pattern (the fallback's): query t of sequence b
    sits at i = lengths[b] - Sq + t and sees keys j < lengths[b], causal j <= i, window i - left <= j <= i + right."""
    j = torch.arange(sk, device=lengths.device)
    i = (lengths.view(-1, 1) - sq + torch.arange(sq, device=lengths.device)).unsqueeze(-1)  # [B, Sq, 1]
    vis = j < lengths.view(-1, 1, 1)
    if causal:
        vis = vis & (j <= i)
    if window[0] >= 0:
        vis = vis & (j >= i - window[0])
    if window[1] >= 0:
        vis = vis & (j <= i + window[1])
    return vis.unsqueeze(1)


def _max_length(m, total: int) -> int:
    return m if isinstance(m, int) and not isinstance(m, bool) else total


def hf_attention(module, query, key, value, attention_mask, dropout: float = 0.0, scaling=None,
                 sliding_window=None, softcap=None, is_causal=None, s_aux=None, **kwargs):
    """transformers' attention interface for "kernelforge" (see the module docstring)."""
    causal = is_causal if is_causal is not None else getattr(module, "is_causal", True)
    window = _window(sliding_window, bool(causal))
    training = module.training
    sinks = s_aux
    lengths = None
    if attention_mask is not None and attention_mask.dim() == 1:  # mask_function's static-cache key counts
        lengths, attention_mask = attention_mask, None
    why = None
    dtype = _attn.reference_dtype(query)
    if dropout and training:
        why = f"dropout={dropout} in training mode"
    elif attention_mask is not None and attention_mask.dim() != 2:
        why = "a mask pattern the kernel cannot express (packed sequences, custom mask functions)"
    elif dtype is None:
        why = f"{query.dtype} {query.device.type} tensors"
    elif not _attn.head_dims_supported(query, value):
        why = f"head dims {query.shape[-1]}/{value.shape[-1]} (the kernels take 64, 96, 128, 192, 256 and 192/128)"
    elif kwargs.get("output_attentions", False):
        why = "output_attentions=True"
    if why is not None:
        _fallback(f"{type(module).__name__} attention", why, "attention (torch SDPA / eager formula)")
        mask = attention_mask
        if lengths is not None:
            mask = _prefix_visible(lengths, query.shape[2], key.shape[2], bool(causal), window)
        elif mask is None or mask.dim() == 2:
            sq, sk = query.shape[2], key.shape[2]
            if mask is not None and sk > mask.shape[1]:
                key, value, sk = key[:, :, :mask.shape[1]], value[:, :, :mask.shape[1]], mask.shape[1]
            vis = _attn.visible_keys(sq, sk, bool(causal), window, query.device)
            mask = vis[None, None] if mask is None else vis[None, None] & mask[:, None, None, -sk:]
        elif mask.dtype != torch.bool:  # an additive float mask (eager's): visible where it is not the minimum
            mask = mask > torch.finfo(mask.dtype).min / 2
        return torch_attention(query, key, value, mask, scaling, dropout, softcap, sinks, training), None

    q, k, v = (t.transpose(1, 2) for t in (query, key, value))  # [B, S, H, D] views
    if dtype != q.dtype:  # CPU float32: the float64 reference, rounded once to float32
        q, k, v = q.to(dtype), k.to(dtype), v.to(dtype)
    if sinks is not None and sinks.dtype not in (torch.float32, q.dtype):
        sinks = sinks.float()
    opts = {"causal": bool(causal), "window": window, "softcap": float(softcap or 0.0), "scale": scaling,
            "sinks": sinks}
    cu_q, cu_k = kwargs.get("cu_seq_lens_q"), kwargs.get("cu_seq_lens_k")
    dec = None
    if attention_mask is None and cu_q is None:
        dec = _decode(q, k, v, opts["causal"], window, opts["softcap"], scaling, sinks, lengths)
    if dec is not None:
        out = dec
    elif lengths is not None:
        out = _prefix(q, k, v, lengths, **opts)
    elif attention_mask is not None:
        out = _padded(q, k, v, attention_mask, **opts)
    elif cu_q is not None and cu_k is not None:
        tq, tk = q.shape[0] * q.shape[1], k.shape[0] * k.shape[1]
        out = _attn.attention(q.reshape(tq, *q.shape[2:]), k.reshape(tk, *k.shape[2:]), v.reshape(tk, *v.shape[2:]),
                              cu_seqlens_q=cu_q.to(torch.int32), cu_seqlens_k=cu_k.to(torch.int32),
                              max_seqlen_q=_max_length(kwargs.get("max_length_q"), tq),
                              max_seqlen_k=_max_length(kwargs.get("max_length_k"), tk), layout="varlen", **opts)
        out = out.view(q.shape[0], q.shape[1], *out.shape[1:])
    else:
        out = _attn.attention(q, k, v, layout="bshd", **opts)
    return out.to(query.dtype), None


PAGED_NAME = "paged|" + NAME


def hf_paged_attention(module, query, key, value, attention_mask, dropout: float = 0.0, scaling=None,
                       sliding_window=None, softcap=None, s_aux=None, **kwargs):
    """transformers' continuous batching (``generate_batch``) attention for "paged|kernelforge".

    Continuous batching packs every scheduled request's new tokens into one row: query [1, Hq, T, D],
    key / value [1, Hkv, T, D]. The paged cache writes the new keys and values into its pages and reads
    back each request's whole context as packed rows [Tk, Hkv, D] (its read / write indices); the
    requests are then varlen sequences (``cu_seq_lens_q`` / ``cu_seq_lens_k``, per layer type when the
    model mixes sliding and full layers) and run kernelforge.attention(layout="varlen"), causal and
    bottom-right aligned (each request's new tokens are the last of its keys), with the layer's sliding
    window, softcap, sinks (``s_aux``) and scale. A decode-only batch of a full-attention layer runs
    kernelforge.decode_attention on the pages instead (``_paged_decode``). Returns [1, T, Hq, Dv]. What
    the kernels do not take (dropout in training, CUDA float32, other head dims) runs transformers'
    "paged|sdpa", announced."""
    cache = kwargs.pop("cache", None)
    if cache is None:
        raise ValueError(f"'{PAGED_NAME}' was called without continuous batching's paged cache: it expects the "
                         "packed inputs generate_batch prepares; use 'kernelforge' for a standard forward")
    window_size = getattr(module, "sliding_window", None) or sliding_window
    layer_type = "sliding_attention" if window_size else "full_attention"
    dtype = _attn.reference_dtype(query)
    why = None
    if dropout and module.training:
        why = f"dropout={dropout} in training mode"
    elif dtype is None:
        why = f"{query.dtype} {query.device.type} tensors"
    elif not _attn.head_dims_supported(query, value):
        why = f"head dims {query.shape[-1]}/{value.shape[-1]}"
    if why is not None:
        from transformers.integrations.sdpa_paged import sdpa_attention_paged_forward  # noqa: PLC0415

        _fallback(f"{type(module).__name__} paged attention", why, "transformers' paged|sdpa")
        return sdpa_attention_paged_forward(module, query, key, value, attention_mask, dropout=dropout,
                                            scaling=scaling, cache=cache, **kwargs)
    sinks = s_aux
    if sinks is not None and sinks.dtype not in (torch.float32, query.dtype):
        sinks = sinks.float()
    out = _paged_decode(module, query, key, value, cache, kwargs, float(softcap or 0.0), scaling, sinks)
    if out is not None:
        return out, None
    k, v = cache.update(key_states=key, value_states=value, layer_idx=module.layer_idx,
                        read_index=kwargs["read_index"], write_index=kwargs["write_index"])  # [Tk, Hkv, D]
    cu_q, cu_k = kwargs["cu_seq_lens_q"], kwargs["cu_seq_lens_k"]
    max_q, max_k = kwargs.get("max_seqlen_q"), kwargs.get("max_seqlen_k")
    if isinstance(cu_k, dict):
        cu_k, max_k = cu_k[layer_type], max_k[layer_type] if isinstance(max_k, dict) else max_k
    q = query[0].transpose(0, 1)  # [T, Hq, D]
    if dtype != q.dtype:  # CPU float32: the float64 reference
        q, k, v = q.to(dtype), k.to(dtype), v.to(dtype)
    out = _attn.attention(q, k, v, causal=True, window=_window(window_size, True), softcap=float(softcap or 0.0),
                          scale=scaling, sinks=sinks, cu_seqlens_q=cu_q.to(torch.int32),
                          cu_seqlens_k=cu_k.to(torch.int32), max_seqlen_q=_max_length(max_q, q.shape[0]),
                          max_seqlen_k=_max_length(max_k, k.shape[0]), layout="varlen")
    return out.to(query.dtype).unsqueeze(0), None


def _paged_decode(module, query, key, value, cache, kwargs, softcap: float, scale, sinks):
    """A decode-only batch (one new token per request: ``max_seqlen_q`` == 1) of a full-attention layer on
    the paged cache: the new rows go into their pages (``index_copy_`` at the write index, as the cache's
    update writes them) and ``decode_attention`` reads each request's context through a block table
    built on the device from the layer's read index, whose rows are whole blocks in logical order
    (row p of a request is block_table[p // block_size] * block_size + p % block_size): no gathered copy
    of the context (the varlen path reads it, writes a copy and reads the copy). Returns [1, T, Hq, Dv],
    or None when the batch or the layer does not qualify (prefill or mixed batches, sliding-window
    layers, whose reads go through sentinel rows, a transformers without these cache fields)."""
    windows = getattr(cache, "sliding_windows", None)
    groups = getattr(cache, "layer_index_to_group_indices", None)
    block = getattr(cache, "block_size", None)
    T = query.shape[2]
    if kwargs.get("max_seqlen_q") != 1 or windows is None or groups is None or not isinstance(block, int):
        return None
    if windows[module.layer_idx] != 1 or kwargs["cu_seq_lens_q"].numel() != T + 1:
        return None
    group, in_group = groups[module.layer_idx]
    read, write = kwargs["read_index"][group], kwargs["write_index"][group]
    cu_k, max_k = kwargs["cu_seq_lens_k"], kwargs.get("max_seqlen_k")
    if isinstance(cu_k, dict):
        cu_k, max_k = cu_k.get("full_attention"), max_k.get("full_attention") if isinstance(max_k, dict) else max_k
    if cu_k is None or not isinstance(max_k, int) or read.numel() == 0 or cu_k.numel() != T + 1:
        return None
    k_cache, v_cache = cache.key_cache[in_group], cache.value_cache[in_group]  # [blocks * block, Hkv, D]
    if k_cache.dtype != query.dtype:
        return None
    k_cache.index_copy_(0, write, key[0].transpose(0, 1))
    v_cache.index_copy_(0, write, value[0].transpose(0, 1))
    lens, table = _paged_table(cache, read, cu_k, max_k, block)
    Hkv, D = k_cache.shape[1], k_cache.shape[2]
    out = _dec.decode_attention(query[0].transpose(0, 1).unsqueeze(1), k_cache.view(-1, block, Hkv, D),
                                v_cache.view(-1, block, Hkv, v_cache.shape[2]), lens, table, scale=scale,
                                softcap=softcap, sinks=sinks, max_seq_len=max_k)
    return out.view(1, T, out.shape[2], out.shape[3])


def _paged_table(cache, read, cu_k, max_k: int, block: int):
    """(seq_lens int32 [T], block_table int32 [T, pages]) of a decode-only batch from the full-attention
    read index, built once per forward: every full-attention layer of the step receives the same read
    index and key offsets (the same tensor objects, unchanged), so the first layer's tables are kept on
    the cache and the others reuse them."""
    memo = getattr(cache, "_kf_paged_table", None)
    if (memo is not None and memo[0] is read and memo[1] is cu_k and memo[2] == (read._version, cu_k._version)
            and memo[3] == (max_k, block)):
        return memo[4]
    lens = (cu_k[1:] - cu_k[:-1]).to(torch.int32)  # keys per request, its new one included
    first = torch.arange(-(-max_k // block), device=read.device) * block  # each page's first key
    at = cu_k[:-1].long().unsqueeze(1) + first
    used = first < lens.unsqueeze(1)
    table = torch.where(used, read[at.clamp_max(read.numel() - 1)] // block, 0).to(torch.int32)
    cache._kf_paged_table = (read, cu_k, (read._version, cu_k._version), (max_k, block), (lens, table))
    return lens, table


_REGISTERED = [False]


def register_transformers() -> bool:
    """Registers "kernelforge" in transformers' AttentionInterface and AttentionMaskInterface, and
    "paged|kernelforge" (continuous batching) in AttentionInterface (once); False when transformers is
    not importable."""
    if _REGISTERED[0]:
        return True
    try:
        from transformers import AttentionInterface  # noqa: PLC0415
        from transformers.masking_utils import AttentionMaskInterface  # noqa: PLC0415
    except Exception:  # noqa: BLE001
        return False
    AttentionInterface.register(NAME, hf_attention)
    AttentionMaskInterface.register(NAME, mask_function)
    AttentionInterface.register(PAGED_NAME, hf_paged_attention)
    _REGISTERED[0] = True
    return True


def _is_hf_model(m) -> bool:
    mod = sys.modules.get("transformers")
    return mod is not None and isinstance(m, mod.PreTrainedModel) and hasattr(m, "set_attn_implementation")


def _current_impl(model):
    return model.config._attn_implementation


def patch_transformers(model: torch.nn.Module) -> list[tuple[str, torch.nn.Module]]:
    """Sets "kernelforge" on the outermost transformers models of ``model`` (their sub-models follow);
    returns the (path, model) patched."""
    done: list[tuple[str, torch.nn.Module]] = []
    for path, m in model.named_modules():
        if any(path.startswith(p + ".") or p == "" for p, _ in done) or not _is_hf_model(m):
            continue
        if STATE_ATTR in m.__dict__ or not register_transformers():
            continue
        previous = _current_impl(m)
        m.set_attn_implementation(NAME)
        m.__dict__[STATE_ATTR] = previous
        done.append((path, m))
    return done


def unpatch_transformers(model: torch.nn.Module) -> int:
    restored = 0
    for _, m in model.named_modules():
        previous = m.__dict__.pop(STATE_ATTR, None)
        if previous is None:
            continue
        m.set_attn_implementation(previous)
        restored += 1
    return restored


# ---- diffusers: attention processors ---------------------------------------------------------------------

_PROCESSORS = ("LTXVideoAttnProcessor", "FluxAttnProcessor", "WanAttnProcessor")


def kf_dispatch_attention_fn(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
                             enable_gqa=False, attention_kwargs=None, *, backend=None, parallel_config=None):
    """diffusers' ``dispatch_attention_fn`` ([B, S, H, D] tensors) through kernelforge.attention;
    what the kernel cannot compute goes to diffusers' own function, announced."""
    from diffusers.models.attention_dispatch import dispatch_attention_fn  # noqa: PLC0415

    why = None
    dtype = _attn.reference_dtype(query)
    if attn_mask is not None:
        why = "an attention mask"
    elif dropout_p:
        why = f"dropout_p={dropout_p}"
    elif backend is not None or parallel_config is not None or attention_kwargs:
        why = "an attention backend, parallel config or attention kwargs"
    elif dtype is None:
        why = f"{query.dtype} {query.device.type} tensors"
    elif not _attn.head_dims_supported(query, value):
        why = f"head dims {query.shape[-1]}/{value.shape[-1]} (the kernels take 64, 96, 128, 192, 256 and 192/128)"
    elif is_causal and query.shape[1] < key.shape[1]:
        why = "is_causal with fewer queries than keys (top-left alignment)"
    elif query.shape[2] != key.shape[2] and not enable_gqa:
        why = "different head counts without enable_gqa"
    if why is not None:
        _fallback("diffusers attention processor", why, "dispatch_attention_fn")
        return dispatch_attention_fn(query, key, value, attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal,
                                     scale=scale, enable_gqa=enable_gqa, attention_kwargs=attention_kwargs,
                                     backend=backend, parallel_config=parallel_config)
    window = (-1, query.shape[1] - key.shape[1]) if is_causal else (-1, -1)  # SDPA's top-left causal
    out = _attn.attention(query.to(dtype), key.to(dtype), value.to(dtype), scale=scale, window=window, layout="bshd")
    return out.to(query.dtype)


_REBOUND_CALLS: dict = {}


def with_kf_dispatch(fn):
    """``fn``'s code with the global dispatch_attention_fn bound to kf_dispatch_attention_fn (cached per
    function; the RoPE entry of LTX-Video composes it with its own rebinding of apply_rotary_emb)."""
    if fn not in _REBOUND_CALLS:
        g = dict(fn.__globals__)
        g["dispatch_attention_fn"] = kf_dispatch_attention_fn
        new = types.FunctionType(fn.__code__, g, fn.__name__, fn.__defaults__, fn.__closure__)
        new.__kwdefaults__ = fn.__kwdefaults__
        _REBOUND_CALLS[fn] = new
    return _REBOUND_CALLS[fn]


class KernelforgeProcessor:
    """Wraps a diffusers attention processor: its own ``__call__`` code, with ``dispatch_attention_fn``
    routed to kernelforge. ``original`` is the processor it replaced (unpatch puts it back)."""

    def __init__(self, original):
        self.original = original
        self._call = with_kf_dispatch(type(original).__call__)

    def __getattr__(self, name):  # _attention_backend, _parallel_config, ... of the original
        return getattr(self.__dict__["original"], name)

    def __call__(self, *args, **kwargs):
        return self._call(self.original, *args, **kwargs)


def diffusers_processor_reason(module) -> str | None:
    """None when ``module`` (a diffusers attention module) has a processor kernelforge can wrap; else
    the reason it is skipped; "" when the module has no processor at all."""
    proc = getattr(module, "processor", None)
    if proc is None or not hasattr(module, "set_processor"):
        return ""
    if isinstance(proc, KernelforgeProcessor):
        return "already patched by kernelforge"
    # (an LTX-Video module whose forward the RoPE entry replaced runs the processor's code itself: with
    # a KernelforgeProcessor there it binds both apply_rotary_emb and dispatch_attention_fn)
    cls = type(proc)
    if cls.__name__ not in _PROCESSORS or not cls.__module__.startswith("diffusers."):
        return f"processor {cls.__name__} is not one kernelforge routes ({', '.join(_PROCESSORS)})"
    if "dispatch_attention_fn" not in cls.__call__.__code__.co_names:
        return f"{cls.__name__}.__call__ does not call dispatch_attention_fn"
    return None


def patch_diffusers(model: torch.nn.Module) -> tuple[list, list]:
    """Wraps the supported processors of ``model``'s attention modules: ([(path, module)], [(path,
    module, reason)])."""
    patched, skipped = [], []
    for path, m in model.named_modules():
        if not hasattr(m, "set_processor") or not hasattr(m, "processor"):
            continue
        why = diffusers_processor_reason(m)
        if why == "":
            continue
        if why is not None:
            skipped.append((path, m, why))
            continue
        m.processor = KernelforgeProcessor(m.processor)
        patched.append((path, m))
    return patched, skipped


def unpatch_diffusers(model: torch.nn.Module) -> int:
    restored = 0
    for _, m in model.named_modules():
        proc = getattr(m, "processor", None)
        if isinstance(proc, KernelforgeProcessor):
            m.processor = proc.original
            restored += 1
    return restored
