"""The decode family: the fake (meta) implementations of its ops (kernelforge::decode_attention,
kernelforge::kv_append, kernelforge::rope_kv_append, kernelforge::mla_decode,
kernelforge::merge_attention_states, kernelforge::prefetch_l2) and the functional API, with ``cascade_decode_attention`` (a
shared prefix read once for every sequence) composed of them. Inference only: no autograd.

The ops live in C++ (`torch/kf_decode.cpp`; the contract and formula in include/kernelforge/decode.h);
arguments are validated there. Per sequence b (n = seq_lens[b], the Lq new tokens included), new
token t (position i = n - Lq + t) and query head h:

    key j visible when j <= i and (window_left < 0 or j >= i - window_left)
    s_j  = scale * q . k_j                       (scale None: 1 / sqrt(D))
    s_j  = softcap * tanh(s_j / softcap)         (softcap > 0, Gemma 2)
    out  = softmax over the visible j (and the sink logit sinks[h], gpt-oss) of s_j, times v_j
    lse  = log of the softmax denominator (natural log, float32)

A token that sees no key (an empty sequence) gets out = 0 (never NaN), lse = -inf (or sinks[h]).
GQA / MQA: Hq a multiple of Hkv, query head h reads kv head h // (Hq // Hkv). D in {64, 128, 256};
CUDA: float16 / bfloat16 (float32 softmax math); CPU tensors run the float64 C++ reference.

The cache: k_cache / v_cache [P, page_size, Hkv, D] (any strides, the last one 1; v's may differ from
k's). Paged (a ``block_table`` int32 [B, max_pages]): key j of sequence b is row j % page_size of page
block_table[b, j // page_size]; page_size a power of two. Contiguous (no block_table): sequence b is
page b, page_size the cache length; transformers' static cache (B, Hkv, max_len, D) is
``static_cache_view(cache)``. ``seq_lens`` (int32 [B]) is read by the kernels only, never by the host:
a CUDA graph captured once replays for any new lengths, and torch.compile traces nothing new.
Out-of-range lengths are clamped to [0, capacity] and out-of-range pages read zeros (kv_append skips
them): no out-of-bounds access, but a wrong answer; ``check=True`` reports such inputs (a host read of
seq_lens and block_table: a synchronization, eager only).
"""

from __future__ import annotations

import torch

from ._ops import _ops
from .attention import attention


# ---- fake implementations -------------------------------------------------------------------------


@torch.library.register_fake("kernelforge::decode_attention")
def _decode_attention_fake(q, k_cache, v_cache, seq_lens, block_table, *, scale, window_left, softcap, sinks,
                           max_seq_len, return_lse, key_starts=None, workspace=None):
    # The C++ impl's shapes (kf_decode.cpp): out contiguous with q's shape and dtype; lse float32
    # [B, Lq, Hq] or [0]. max_seq_len and the lengths are not read: new values trace nothing new.
    if q.dim() != 4:
        raise ValueError(f"decode_attention: q must have 4 dimensions [B, Lq, Hq, D], got {q.dim()}")
    lse_shape = tuple(q.shape[:3]) if return_lse else (0,)
    return q.new_empty(q.shape), q.new_empty(lse_shape, dtype=torch.float32)


@torch.library.register_fake("kernelforge::kv_append")
def _kv_append_fake(k_cache, v_cache, k, v, seq_lens, block_table):
    return None


@torch.library.register_fake("kernelforge::prefetch_l2")
def _prefetch_l2_fake(t, offset, nbytes):
    return None


@torch.library.register_fake("kernelforge::rope_kv_append")
def _rope_kv_append_fake(q, k, v, cos, sin, k_cache, v_cache, seq_lens, block_table):
    # The C++ impl's q_out: contiguous, q's shape and dtype. The caches are mutated in place.
    return q.new_empty(q.shape)


@torch.library.register_fake("kernelforge::merge_attention_states")
def _merge_attention_states_fake(o_a, lse_a, o_b, lse_b):
    # The C++ impl's shapes (kf_decode.cpp): out contiguous with o_a's shape and dtype; lse float32, o_a's
    # shape without the head dim.
    if o_a.dim() < 2:
        raise ValueError(f"merge_attention_states: o_a must have at least 2 dimensions [..., H, D], got {o_a.dim()}")
    return o_a.new_empty(o_a.shape), o_a.new_empty(o_a.shape[:-1], dtype=torch.float32)


@torch.library.register_fake("kernelforge::mla_decode")
def _mla_decode_fake(q, kv_cache, seq_lens, block_table, *, scale, max_seq_len, return_lse):
    # The C++ impl's shapes (kf_mla.cpp): out [B, Lq, H, 512] contiguous in q's dtype; lse float32
    # [B, Lq, H] or [0]. max_seq_len and the lengths are not read.
    if q.dim() != 4:
        raise ValueError(f"mla_decode: q must have 4 dimensions [B, Lq, H, 576], got {q.dim()}")
    lse_shape = tuple(q.shape[:3]) if return_lse else (0,)
    return q.new_empty((*q.shape[:3], MLA_DV)), q.new_empty(lse_shape, dtype=torch.float32)


# ---- functional API -------------------------------------------------------------------------------


def decode_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    seq_lens: torch.Tensor,
    block_table: torch.Tensor | None = None,
    *,
    scale: float | None = None,
    window_left: int = -1,
    softcap: float = 0.0,
    sinks: torch.Tensor | None = None,
    max_seq_len: int | None = None,
    return_lse: bool = False,
    key_starts: torch.Tensor | None = None,
    check: bool = False,
    workspace: torch.Tensor | None = None,
):
    """Attention of the Lq newest tokens of each sequence against its KV cache: returns out
    [B, Lq, Hq, D] (q's dtype, contiguous), or (out, lse) with ``return_lse=True`` (lse float32
    [B, Lq, Hq], natural log). No autograd: inputs that require grad give outputs that do not.

    q [B, Lq, Hq, D]: Lq = 1 for plain decoding, 2..8 (up to 64) to verify speculated tokens, causal
    among themselves (bottom-right: token t sees keys j <= seq_lens[b] - Lq + t). k_cache / v_cache
    [P, page_size, Hkv, D] with ``block_table`` int32 [B, max_pages] (paged), or without it contiguous
    (sequence b in page b; ``static_cache_view`` turns transformers' static cache into one).
    ``seq_lens`` int32 [B]: keys in the cache per sequence, the Lq new ones included (append them
    first with ``kv_append``).

    ``window_left`` >= 0: keys at most that far before the token's position (a sliding window of W
    keys including the token itself: W - 1); -1 (or None) unbounded. ``softcap`` > 0: logits pass
    through ``softcap * tanh(s / softcap)``. ``sinks``: a per-query-head logit [Hq] (float32 or q's
    dtype) added to every softmax denominator. ``max_seq_len``: a host upper bound of every seq_len
    (sizes the split of the keys); None: the cache capacity (always correct, more idle blocks). A bound
    below a real length is the caller's broken promise: keys past it may be ignored. ``key_starts``
    int32 [B] or None: keys before key_starts[b] are invisible to sequence b (a left-padded batch on a
    static cache: the pad rows at the head of each row's cache), read on the device like seq_lens and
    clamped to [0, seq_len]; a sequence that sees no key gets zeros (lse -inf, or its sink).

    ``check=True`` reads seq_lens and block_table on the host (a synchronization; eager debugging) and
    raises ValueError for a length above the capacity (max_pages * page_size, or page_size when
    contiguous) or below Lq (0, an empty slot, is allowed), and for a block_table entry outside [0, P)
    among the pages a sequence uses.

    ``workspace``: None (each call takes its split workspace from the caching allocator and zeroes its
    merge counters, a memset before the kernel) or a block from ``decode_workspace`` with the same
    arguments, zeroed once: every completed call leaves its counters zero, so calls that reuse it skip the
    memset (in a CUDA graph, no memset node between the previous kernel and this one). Calls that may run
    at the same time (other streams) need their own. Too small a block: ValueError with the size needed.
    """
    if check:
        _check_cache_args("decode_attention", q, k_cache, seq_lens, block_table, append=False)
        if key_starts is not None and key_starts.dim() == 1 and not key_starts.is_floating_point():
            starts = key_starts.detach().to("cpu", torch.int64)
            lens = seq_lens.detach().to("cpu", torch.int64)
            bad = (starts < 0) | (starts > lens) if starts.shape == lens.shape else starts < 0
            if bad.any():
                b = int(bad.nonzero()[0, 0])
                raise ValueError(f"decode_attention: key_starts[{b}] = {int(starts[b])} is outside [0, seq_lens[{b}]]")
    out, lse = _ops.decode_attention(
        q, k_cache, v_cache, seq_lens, block_table, workspace=workspace,
        **_op_options(scale, window_left, softcap, sinks, max_seq_len, return_lse, key_starts))
    return (out, lse) if return_lse else out


def _op_options(scale, window_left, softcap, sinks, max_seq_len, return_lse, key_starts) -> dict:
    """decode_attention's keyword options as the op's schema takes them (None: the defaults)."""
    return dict(scale=None if scale is None else float(scale),
                window_left=-1 if window_left is None else int(window_left), softcap=float(softcap or 0.0),
                sinks=sinks, max_seq_len=0 if max_seq_len is None else max_seq_len, return_lse=bool(return_lse),
                key_starts=key_starts)


def decode_workspace(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    seq_lens: torch.Tensor,
    block_table: torch.Tensor | None = None,
    *,
    scale: float | None = None,
    window_left: int = -1,
    softcap: float = 0.0,
    sinks: torch.Tensor | None = None,
    max_seq_len: int | None = None,
    return_lse: bool = False,
    key_starts: torch.Tensor | None = None,
) -> torch.Tensor:
    """A zeroed uint8 block of the bytes ``decode_attention`` with the same arguments needs as its split
    workspace (the plan reads shapes, strides, options and max_seq_len only: any tensors of the call's
    shapes do), for ``decode_attention(..., workspace=...)``. Empty when the plan does not split the keys or
    the tensors are on the CPU. The zeroing is a memset on the current stream: allocate it outside a CUDA
    graph capture (inside one it becomes a node of the graph)."""
    opts = _op_options(scale, window_left, softcap, sinks, max_seq_len, return_lse, key_starts)
    n = _ops.decode_attention_workspace_bytes(q, k_cache, v_cache, seq_lens, block_table,
                                              **dict(opts, max_seq_len=int(opts["max_seq_len"])))
    return torch.zeros(n, dtype=torch.uint8, device=q.device)


def kv_append(
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    seq_lens: torch.Tensor,
    block_table: torch.Tensor | None = None,
    *,
    check: bool = False,
) -> None:
    """Write the keys and values of the Lq newest tokens into the cache, in place: k, v [B, Lq, Hkv, D]
    (the caches' dtype) go to positions seq_lens[b] - Lq + t of sequence b. ``seq_lens`` are the
    lengths after the append, the ones decode_attention then takes. Rows whose position falls outside
    [0, capacity) or whose page is out of range are skipped (an empty slot, seq_lens 0, writes nothing).
    No autograd. ``check=True``: as decode_attention's, over the pages the new rows go to.
    """
    if check:
        _check_cache_args("kv_append", k, k_cache, seq_lens, block_table, append=True)
    _ops.kv_append(k_cache, v_cache, k, v, seq_lens, block_table)


def rope_kv_append(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    seq_lens: torch.Tensor,
    block_table: torch.Tensor | None = None,
    *,
    check: bool = False,
) -> torch.Tensor:
    """RoPE of the Lq newest tokens fused into ``kv_append``, one launch: returns q_out, the rotated q (a
    new contiguous tensor of q's shape and dtype; q itself is not written), and writes the rotated k and
    the unrotated v into the cache exactly as ``kv_append(k_cache, v_cache, rot(k), v, seq_lens,
    block_table)`` would (same layouts, same skipped rows). No autograd.

    q [B, Lq, Hq, D], k and v [B, Lq, Hkv, D] (the caches' dtype). Token t of sequence b sits at
    position pos = seq_lens[b] - Lq + t (``seq_lens``: the lengths after the append, read on the device:
    CUDA-graph safe) and is rotated with row pos of ``cos`` and ``sin`` [max_pos, rotary_dim], HF's
    rotate-half convention (``q * cos + rotate_half(q) * sin`` of ``apply_rotary_pos_emb``) on the first
    rotary_dim columns (even, <= D), the rest passed through. The tables are float32 or q's dtype in
    exactly the layout HF's rotary embedding produces (``emb = cat(freqs, freqs)``: both halves of a row
    equal); only the first rotary_dim / 2 columns are read. A table for every position:
    ``cos, sin = rotary_emb(x, torch.arange(max_pos)[None])`` then ``cos[0]``, ``sin[0]``. Math in
    float32, one rounding: on CUDA bit-identical to ``apply_rope(q, k, cos, sin, position_ids=pos)``
    followed by ``kv_append``.

    Positions outside the table are clamped to [0, max_pos - 1] (no out-of-bounds read, a wrong
    rotation); an empty slot (seq_lens 0) writes no cache row and rotates its q by position 0.
    ``check=True`` (a host synchronization, eager debugging): kv_append's checks, plus a ValueError for
    a position past the table's rows and for tables whose two halves differ (not HF's layout).
    """
    if check:
        _check_cache_args("rope_kv_append", k, k_cache, seq_lens, block_table, append=True)
        _check_rope_tables("rope_kv_append", k, cos, sin, seq_lens)
    return _ops.rope_kv_append(q, k, v, cos, sin, k_cache, v_cache, seq_lens, block_table)


MLA_DK = 576  # MLA's key / query width: 512 latent + 64 rope
MLA_DV = 512  # MLA's value / output width: the latent columns


def mla_decode(
    q: torch.Tensor,
    kv_cache: torch.Tensor,
    seq_lens: torch.Tensor,
    block_table: torch.Tensor | None = None,
    *,
    scale: float | None = None,
    max_seq_len: int | None = None,
    return_lse: bool = False,
    check: bool = False,
):
    """MLA decode (DeepSeek-V2 / V3, absorbed form): the Lq newest tokens of H query heads against one
    latent cache. Returns out [B, Lq, H, 512] (q's dtype, contiguous), or (out, lse) with
    ``return_lse=True`` (lse float32 [B, Lq, H], natural log). No autograd.

    q [B, Lq, H, 576] (512 latent columns, W_UK absorbed, then 64 rope columns), Lq 1..8 causal among
    themselves, H 1..128. kv_cache [P, page_size, 576] or [P, page_size, 1, 576]: key j is the whole
    row, its value the row's first 512 columns. Paging, ``seq_lens`` (int32 [B], the new tokens
    included, read on the device only), ``max_seq_len`` and ``check`` as in decode_attention:

        s_j = scale * q . kv[j]  (j <= seq_lens[b] - Lq + t),  out = softmax(s) @ kv[:, :512]

    ``scale`` None: 1 / sqrt(576); DeepSeek passes its own softmax scale (qk_head_dim ** -0.5 with the
    YaRN factor), which is not 1 / sqrt(576).
    """
    if kv_cache.dim() == 4 and kv_cache.shape[2] == 1:
        kv_cache = kv_cache.squeeze(2)
    if check:
        _check_cache_args("mla_decode", q, kv_cache.unsqueeze(2) if kv_cache.dim() == 3 else kv_cache, seq_lens,
                          block_table, append=False)
    out, lse = _ops.mla_decode(q, kv_cache, seq_lens, block_table, scale=None if scale is None else float(scale),
                               max_seq_len=0 if max_seq_len is None else max_seq_len, return_lse=bool(return_lse))
    return (out, lse) if return_lse else out


def static_cache_view(cache: torch.Tensor) -> torch.Tensor:
    """transformers' static KV cache tensor (B, Hkv, max_len, D), e.g. a ``StaticCache`` layer's
    ``keys`` / ``values``, as the [P, page_size, Hkv, D] cache that decode_attention and kv_append take
    without a block_table (P = B pages of page_size = max_len rows): ``cache.transpose(1, 2)``, a view
    (no copy; kv_append writes into the static cache itself)."""
    if cache.dim() != 4:
        raise ValueError(f"static_cache_view: cache must have 4 dimensions (B, Hkv, max_len, D), got {cache.dim()}")
    return cache.transpose(1, 2)


# ---- check=True -----------------------------------------------------------------------------------


def _check_cache_args(op: str, new: torch.Tensor, k_cache: torch.Tensor, seq_lens: torch.Tensor,
                      block_table: torch.Tensor | None, *, append: bool) -> None:
    """The host check of check=True: seq_lens within [Lq, capacity] (or 0) and the used block_table
    entries within [0, P). Arguments of the wrong rank or dtype are left to the op, which reports
    them."""
    if new.dim() != 4 or k_cache.dim() != 4 or seq_lens.dim() != 1 or seq_lens.is_floating_point():
        return
    paged = block_table is not None
    if paged and (block_table.dim() != 2 or block_table.is_floating_point()):
        return
    q_len, pages, page_size = new.shape[1], k_cache.shape[0], k_cache.shape[1]
    capacity = block_table.shape[1] * page_size if paged else page_size
    where = (f"max_pages {block_table.shape[1]} x page_size {page_size}" if paged
             else f"page_size {page_size}, the contiguous cache's length")
    lens = seq_lens.detach().to("cpu", torch.int64)
    for bad, why in (((lens < 0) | (lens > capacity), f"outside [0, {capacity}] (the capacity: {where})"),
                     ((lens > 0) & (lens < q_len), f"below the {q_len} new tokens of dimension 1 of "
                                                   f"{'k' if append else 'q'} (0: an empty slot)")):
        if bad.any():
            b = int(bad.nonzero()[0, 0])
            raise ValueError(f"{op}: seq_lens[{b}] = {int(lens[b])} is {why}")
    if not paged:
        return
    table = block_table.detach().to("cpu", torch.int64)
    col = torch.arange(table.shape[1]).view(1, -1)
    end = (lens.clamp(0, capacity) + page_size - 1) // page_size  # pages holding keys 0 .. n - 1
    first = (lens - q_len).clamp(0, capacity) // page_size if append else torch.zeros_like(lens)
    used = (col >= first.view(-1, 1)) & (col < end.view(-1, 1))
    bad = used & ((table < 0) | (table >= pages))
    if bad.any():
        b, j = (int(x) for x in bad.nonzero()[0])
        raise ValueError(f"{op}: block_table[{b}, {j}] = {int(table[b, j])} is not a page of the cache [0, {pages}) "
                         f"(sequence {b} {'writes to' if append else 'reads'} it: seq_lens[{b}] = {int(lens[b])})")


def _check_rope_tables(op: str, new: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                       seq_lens: torch.Tensor) -> None:
    """check=True of rope_kv_append: every new token's position (seq_lens[b] - Lq + t, for seq_lens > 0)
    below the tables' max_pos rows, and the tables in HF's layout (the two halves of each row equal).
    Arguments of the wrong rank are left to the op."""
    if new.dim() != 4 or cos.dim() != 2 or sin.dim() != 2 or seq_lens.dim() != 1 or cos.shape[1] % 2:
        return
    max_pos, half = cos.shape[0], cos.shape[1] // 2
    lens = seq_lens.detach().to("cpu", torch.int64)
    bad = lens > max_pos  # the last new token sits at seq_lens[b] - 1
    if bad.any():
        b = int(bad.nonzero()[0, 0])
        raise ValueError(f"{op}: seq_lens[{b}] = {int(lens[b])} puts new tokens at positions up to {int(lens[b]) - 1}, "
                         f"past the {max_pos} rows of cos / sin")
    for name, t in (("cos", cos), ("sin", sin)):
        if not torch.equal(t[:, :half], t[:, half:2 * half]):
            raise ValueError(f"{op}: {name} must hold HF's layout, both halves of each row equal (cat(freqs, "
                             f"freqs)): columns [0, {half}) and [{half}, {2 * half}) differ")


# ---- merge_attention_states and cascade decoding --------------------------------------------------


def merge_attention_states(o_a: torch.Tensor, lse_a: torch.Tensor, o_b: torch.Tensor, lse_b: torch.Tensor):
    """Two attention results of the same queries over disjoint key sets, combined into the attention
    over their union: returns (out, lse). Per row and head, with m = max(lse_a, lse_b):

        out = (e^(lse_a - m) o_a + e^(lse_b - m) o_b) / (e^(lse_a - m) + e^(lse_b - m))
        lse = m + log(e^(lse_a - m) + e^(lse_b - m))

    o_a, o_b [..., H, D] (one dtype: float16 / bfloat16 / float32 on CUDA, any float dtype on CPU);
    lse_a, lse_b float32 [..., H] (o_a's shape without the head dim; natural log, as ``decode_attention``
    and ``attention`` return it), any strides: ``attention``'s lse [Hq, Tq] is passed as ``lse.t()``.
    A side whose lse is -inf (it saw no key) contributes nothing, whatever its o holds; both -inf give
    out = 0 and lse = -inf. out: a new contiguous tensor of o_a's shape and dtype (float32 math,
    rounded once); lse float32. Memory-bound: reads 2 N H D elements and 2 N H lse values, writes N H D
    and N H. No autograd.
    """
    return _ops.merge_attention_states(o_a, lse_a, o_b, lse_b)


def cascade_decode_attention(
    q: torch.Tensor,
    prefix_k: torch.Tensor,
    prefix_v: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    seq_lens: torch.Tensor,
    block_table: torch.Tensor | None = None,
    *,
    scale: float | None = None,
    max_seq_len: int | None = None,
    return_lse: bool = False,
    window_left: int = -1,
    softcap: float = 0.0,
    sinks: torch.Tensor | None = None,
):
    """Decode attention of B sequences that share one prefix (a system prompt): every sequence's keys
    are the shared prefix followed by its own suffix. Returns out [B, Lq, Hq, D] (q's dtype,
    contiguous), or (out, lse) with ``return_lse=True`` (lse float32 [B, Lq, Hq], natural log).

    prefix_k / prefix_v [P, Hkv, D] (any strides, the last one 1): the prefix's keys and values at
    positions 0 .. P - 1, stored once. The suffix is a decode cache as ``decode_attention`` takes it
    (k_cache / v_cache [pages, page_size, Hkv, D] with an optional ``block_table``); ``seq_lens`` int32
    [B] counts the suffix keys only (sequence b's suffix key j sits at position P + j), the Lq new
    tokens included (append them to the suffix cache first, ``kv_append``). New token t of sequence b
    (position P + seq_lens[b] - Lq + t) sees every prefix key and the suffix keys j <= seq_lens[b] -
    Lq + t: the causal structure lives in the suffix, the prefix is visible to every new token. So for
    seq_lens[b] >= Lq the result is ``decode_attention`` over the concatenated cache [prefix; suffix]
    with seq_lens + P; an empty suffix (seq_lens[b] = 0) sees the whole prefix only.

    Computed as three calls: (1) the prefix pass, all B * Lq query rows as one non-causal sequence of
    ``attention`` (batch 1) against the prefix, so each prefix key and value is read once per query
    tile and head instead of once per sequence; (2) the suffix pass, ``decode_attention`` with
    return_lse; (3) ``merge_attention_states`` of the two by their logsumexp. ``scale`` (None:
    1 / sqrt(D)) applies to both passes; ``max_seq_len`` bounds seq_lens (the suffix pass's split).
    Head dims 64, 128, 256; float16 / bfloat16 on CUDA (CPU tensors run the float64 references). No
    host synchronization: CUDA-graph safe for new seq_lens. No autograd (inputs are detached).

    Not supported (ValueError): ``window_left`` (a window's start would fall inside the prefix for some
    tokens and not others), ``softcap`` and ``sinks`` (a sink belongs to exactly one of the two
    softmax denominators; both passes would add it).
    """
    op = "cascade_decode_attention"
    if window_left is not None and window_left >= 0:
        raise ValueError(f"{op}: window_left is not supported (got {window_left}); pass -1")
    if softcap:
        raise ValueError(f"{op}: softcap is not supported (got {softcap}); pass 0")
    if sinks is not None:
        raise ValueError(f"{op}: sinks are not supported: a sink logit belongs to one softmax denominator, and "
                         "both passes would add it")
    if q.dim() != 4:
        raise ValueError(f"{op}: q must have 4 dimensions [B, Lq, Hq, D], got {q.dim()}")
    for name, t in (("prefix_k", prefix_k), ("prefix_v", prefix_v)):
        if t.dim() != 3:
            raise ValueError(f"{op}: {name} must have 3 dimensions [P, Hkv, D], got {t.dim()}")
        if t.dtype != q.dtype:
            raise ValueError(f"{op}: {name} must have q's dtype ({q.dtype}), got {t.dtype}")
    if prefix_v.shape != prefix_k.shape:
        raise ValueError(f"{op}: prefix_v must have prefix_k's shape {tuple(prefix_k.shape)}, got "
                         f"{tuple(prefix_v.shape)}")
    if k_cache.dim() == 4 and tuple(prefix_k.shape[1:]) != tuple(k_cache.shape[2:]):
        raise ValueError(f"{op}: prefix_k's kv heads and head dim {tuple(prefix_k.shape[1:])} must match "
                         f"k_cache's {tuple(k_cache.shape[2:])}")
    q, prefix_k, prefix_v = q.detach(), prefix_k.detach(), prefix_v.detach()
    o2, lse2 = decode_attention(q, k_cache, v_cache, seq_lens, block_table, scale=scale, max_seq_len=max_seq_len,
                                return_lse=True)
    B, Lq, Hq, D = q.shape
    n = B * Lq
    if prefix_k.shape[0] == 0 or n == 0:  # no prefix key (or no query): the suffix pass is the answer
        return (o2, lse2) if return_lse else o2
    o1, lse1 = attention(q.reshape(1, n, Hq, D), prefix_k.unsqueeze(0), prefix_v.unsqueeze(0), causal=False,
                         scale=scale, return_lse=True)
    # o1 [1, n, Hq, D], lse1 [1, Hq, n] (its transpose is the [n, Hq] the merge reads, strides honored)
    out, lse = _ops.merge_attention_states(o1.view(n, Hq, D), lse1[0].t(), o2.view(n, Hq, D), lse2.view(n, Hq))
    out, lse = out.view(B, Lq, Hq, D), lse.view(B, Lq, Hq)
    return (out, lse) if return_lse else out


def prefetch_l2(t: torch.Tensor, nbytes: int | None = None, offset: int = 0) -> None:
    """Ask the GPU's L2 to load ``nbytes`` bytes of the memory ``t`` spans (from its first element to the end
    of its last: a transposed or padded view covers the memory between its elements too) from ``offset``
    bytes past its data pointer (default: the rest of the span), on the current stream. A hint: nothing is
    written or returned, and the call orders nothing (later traffic evicts the lines as any other). ``t``: a
    CUDA tensor with non-negative strides; the range must lie inside its span (ValueError otherwise). Made
    for the weights and the KV cache of a decode step's next kernels, prefetched on a parallel stream while
    latency-bound kernels leave the DRAM idle (``DecodeStep``'s ``l2_prefetch``). Under torch.compile a call
    with no use of its result may be dropped."""
    _ops.prefetch_l2(t, int(offset), None if nbytes is None else int(nbytes))


__all__ = ["decode_attention", "decode_workspace", "kv_append", "mla_decode", "rope_kv_append", "static_cache_view",
           "merge_attention_states", "cascade_decode_attention", "prefetch_l2"]
