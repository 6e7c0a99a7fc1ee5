"""The decode family: decode_attention (the newest tokens of each sequence against a paged or
contiguous KV cache; forward only, inference), mla_decode (DeepSeek's latent cache; below) and
cascade_decode_attention (sequences sharing one prefix; at the end).

Bench shapes are DecodeShapes, written b{B}h{Hq}[/{Hkv}]kv{kv}d{D}p{page}[q{Lq}]: B sequences of kv
cached keys each (every sequence the same length), page size p (p0: a contiguous cache in
transformers' static-cache layout [B, Hkv, kv, D], passed as its transpose view), Lq new tokens per
sequence (default 1). The paged caches' pages are a random permutation (a serving engine's pool after
a while), so that consecutive pages of a sequence are not adjacent in memory.

decode_attention is memory-bound (``bound="memory"``): the minimum traffic is every cached key and
value row read once per kv head, 2 * B * kv * Hkv * D elements, plus q read and out written, 2 * B *
Lq * Hq * D (seq_lens and the block table, int32, are not counted; they are < 0.1% of it); GB/s against
copy@size, a copy of the same bytes. FLOPs (informational): 4 * Hq * D per visible (query, key) pair,
the QK^T and PV products.

Peers: ``eager`` a plain PyTorch decode (gather the pages through the block table, one matmul for the
scores, float32 softmax, one matmul with the values, HF's eager attention rounding) and ``compile``
(torch.compile of it); ``cudnn`` and ``flash2``: torch's SDPA pinned to SDPBackend.CUDNN_ATTENTION /
FLASH_ATTENTION on a contiguous [B, Hkv, kv, D] cache (the same keys and values; enable_gqa=True).
SDPA's ``is_causal`` is top-left aligned, so the Lq > 1 rows (bottom-right: token t sees keys j <=
kv - Lq + t) give cuDNN a boolean mask [Lq, kv] and skip flash2 (its SDPA backend takes no mask).

Check shapes are (B, Lq, Hq, Hkv, D, kv) with ragged lengths up to kv (`ragged_lens`); variants choose
the page size (0: contiguous, ``static``: transformers' static-cache view) and the options. The check
caches hold NaN in every row no sequence uses (the tail of each sequence's last page, spare pages,
unused block-table entries point at a NaN page): a kernel that reads them fails.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from ._spec import DecodeShape, OpSpec, check_out, f64, kf, poison, randn

# ---- float64 reference ----------------------------------------------------------------------------


def decode_ref(q, k_cache, v_cache, seq_lens, block_table=None, *, scale=None, window_left=-1, softcap=0.0,
               sinks=None, key_starts=None):
    """The contract's formula in float64 (include/kernelforge/decode.h), vectorized: every sequence's
    keys gathered through the block table (contiguous: page b), the visibility mask built explicitly.
    Returns (out [B, Lq, Hq, D], lse [B, Lq, Hq]) in float64 on the CPU. seq_lens are clamped to
    [0, capacity] and a page outside [0, P) reads zeros, as the kernels do; rows past a sequence's
    length are never used (they may hold NaN)."""
    q = q.detach().to("cpu", f64)
    k_cache, v_cache = (c.detach().to("cpu", f64) for c in (k_cache, v_cache))
    B, Lq, Hq, D = q.shape
    P, page, Hkv = k_cache.shape[0], k_cache.shape[1], k_cache.shape[2]
    group = Hq // Hkv
    if block_table is None:
        cap = page
        k, v = k_cache[:B], v_cache[:B]
        page_ok = torch.ones(B, cap, dtype=torch.bool)
    else:
        bt = block_table.detach().to("cpu", torch.int64)
        cap = bt.shape[1] * page
        idx = bt.clamp(0, max(P - 1, 0))
        k = k_cache[idx].reshape(B, cap, Hkv, D)
        v = v_cache[idx].reshape(B, cap, Hkv, v_cache.shape[-1])  # mla_decode_ref: values narrower than keys
        page_ok = ((bt >= 0) & (bt < P)).repeat_interleave(page, dim=1)
    n = seq_lens.detach().to("cpu", torch.int64).clamp(0, cap)
    j = torch.arange(cap)
    inside = j.view(1, -1) < n.view(-1, 1)  # [B, cap]
    keep = (inside & page_ok).view(B, cap, 1, 1)
    k = torch.where(keep, k, torch.zeros((), dtype=f64)).repeat_interleave(group, dim=2)
    v = torch.where(keep, v, torch.zeros((), dtype=f64)).repeat_interleave(group, dim=2)
    s = torch.einsum("bthd,bjhd->bthj", q, k) * (D ** -0.5 if scale is None else scale)
    if softcap:
        s = softcap * torch.tanh(s / softcap)
    i = n.view(-1, 1) - Lq + torch.arange(Lq).view(1, -1)  # [B, Lq]: the new tokens' positions
    visible = (j.view(1, 1, -1) <= i.unsqueeze(-1)) & inside.unsqueeze(1)
    if window_left is not None and window_left >= 0:
        visible &= j.view(1, 1, -1) >= i.unsqueeze(-1) - window_left
    if key_starts is not None:  # left padding: keys before the sequence's first are invisible
        visible &= j.view(1, 1, -1) >= key_starts.detach().to("cpu", torch.int64).view(-1, 1, 1)
    s = s.masked_fill(~visible.unsqueeze(2), float("-inf"))  # [B, Lq, Hq, cap]
    m = s.amax(dim=-1) if cap > 0 else torch.full((B, Lq, Hq), float("-inf"), dtype=f64)
    sink = sinks.detach().to("cpu", f64).view(1, 1, Hq) if sinks is not None else None
    if sink is not None:
        m = torch.maximum(m, sink)
    m_safe = torch.where(torch.isinf(m), torch.zeros_like(m), m)
    p = torch.exp(s - m_safe.unsqueeze(-1))
    den = p.sum(dim=-1)
    if sink is not None:
        den = den + torch.exp(sink - m_safe)
    out = torch.einsum("bthj,bjhd->bthd", p, v) / den.clamp_min(1e-300).unsqueeze(-1)
    lse = torch.where(den > 0, m_safe + torch.log(den), torch.full_like(den, float("-inf")))
    return out, lse


# ---- caches ---------------------------------------------------------------------------------------


def ragged_lens(kv: int, b: int, q_len: int = 1) -> list[int]:
    """b ragged lengths at most kv: kv first, then shorter ones (at least q_len), one empty sequence
    when b >= 3 and q_len == 1."""
    lens = [kv if i == 0 else max(q_len, kv - (i * kv) // b - i) for i in range(b)]
    if b >= 3 and q_len == 1:
        lens[2] = 0
    return lens


def make_cache(lens, hk: int, d: int, page: int, dtype, device, gen=None, *, static: bool = False,
               capacity: int | None = None, spare: int = 2) -> dict:
    """A KV cache holding random keys and values for sequences of the given lengths, NaN everywhere else.

    page > 0: paged, ``block_table`` int32 [B, max_pages] (max_pages = ceil(capacity / page), capacity
    default: the longest sequence plus one page); the used pages are a random permutation of the pool
    (``spare`` extra NaN pages), unused block-table entries point at a NaN page. page == 0: contiguous
    [B + spare, capacity, Hkv, D] (capacity default: the longest + 3), or with ``static=True`` the
    [B, Hkv, capacity, D] static cache (``k_static`` / ``v_static``) seen through its transpose view.
    Returns k_cache, v_cache, block_table (None when contiguous), seq_lens int32 [B], capacity."""
    B = len(lens)
    nan = float("nan")
    longest = max(lens, default=0)
    if page == 0:
        cap = capacity if capacity is not None else longest + 3
        res = {"block_table": None, "capacity": cap}
        for name in ("k", "v"):
            if static:
                c = torch.full((B, hk, cap, d), nan, dtype=dtype, device=device)
                res[f"{name}_static"] = c
                view = c.transpose(1, 2)
            else:
                view = torch.full((B + spare, cap, hk, d), nan, dtype=dtype, device=device)
            for b, n in enumerate(lens):
                view[b, :n] = randn(gen, device, dtype, n, hk, d)
            res[f"{name}_cache"] = view
    else:
        max_pages = capacity // page if capacity is not None else -(-longest // page) + 1
        used = [-(-n // page) for n in lens]
        pool = sum(used) + max(spare, 1)
        perm = torch.randperm(pool, generator=gen, device=gen.device if gen is not None else "cpu").tolist()
        table = torch.full((B, max_pages), perm[-1], dtype=torch.int32)  # unused entries: a NaN page
        ids, at = [], 0
        for b, u in enumerate(used):
            ids.append(perm[at:at + u])
            table[b, :u] = torch.tensor(ids[-1], dtype=torch.int32)
            at += u
        res = {"block_table": table.to(device), "capacity": max_pages * page}
        for name in ("k", "v"):
            c = torch.full((pool, page, hk, d), nan, dtype=dtype, device=device)
            for b, n in enumerate(lens):
                if n:
                    rows = torch.full((used[b] * page, hk, d), nan, dtype=dtype, device=device)
                    rows[:n] = randn(gen, device, dtype, n, hk, d)
                    c[torch.tensor(ids[b], device=device)] = rows.view(used[b], page, hk, d)
            res[f"{name}_cache"] = c
    res["seq_lens"] = torch.tensor(lens, dtype=torch.int32, device=device)
    return res


# ---- bytes and FLOPs ------------------------------------------------------------------------------


def _pairs(shape: DecodeShape) -> int:
    """Visible (query, key) pairs per query head: token t of Lq sees kv - Lq + t + 1 keys."""
    return shape.b * (shape.lq * shape.kv - shape.lq * (shape.lq - 1) // 2)


def _flops(shape: DecodeShape, mode: str) -> int:
    return 4 * shape.hq * shape.d * _pairs(shape)  # QK^T and PV: 2 * D each per pair


def _bytes(shape: DecodeShape, mode: str, elt: int) -> int:
    # every key and value row once per kv head, q read, out written
    return (2 * shape.b * shape.kv * shape.hk * shape.d + 2 * shape.b * shape.lq * shape.hq * shape.d) * elt


# ---- bench ----------------------------------------------------------------------------------------


def _inputs(shape: DecodeShape, dtype, device, gen):
    """q [B, Lq, Hq, D]; the contiguous cache k_static / v_static [B, Hkv, kv, D] (the SDPA peers'
    layout, and kernelforge's for p0 through its transpose view); for p > 0 the same keys and values
    in a paged pool whose pages are a random permutation, block_table int32 [B, ceil(kv / p)]."""
    B, Hq, Hkv, kv, D, page, Lq = shape.b, shape.hq, shape.hk, shape.kv, shape.d, shape.page, shape.lq
    t = {"q": randn(gen, device, dtype, B, Lq, Hq, D),
         "k_static": randn(gen, device, dtype, B, Hkv, kv, D), "v_static": randn(gen, device, dtype, B, Hkv, kv, D),
         "seq_lens": torch.full((B,), kv, dtype=torch.int32, device=device), "max_seq_len": kv}
    if page == 0:
        t["k_cache"], t["v_cache"] = t["k_static"].transpose(1, 2), t["v_static"].transpose(1, 2)
        t["block_table"] = None
    else:
        per = -(-kv // page)
        table = torch.randperm(B * per, generator=gen, device=device).view(B, per)
        t["block_table"] = table.to(torch.int32)
        for name in ("k", "v"):
            rows = t[f"{name}_static"].transpose(1, 2)  # [B, kv, Hkv, D]
            if per * page > kv:
                rows = torch.cat([rows, rows.new_zeros(B, per * page - kv, Hkv, D)], dim=1)
            c = torch.empty(B * per, page, Hkv, D, dtype=dtype, device=device)
            c[table.flatten()] = rows.reshape(B * per, page, Hkv, D)
            t[f"{name}_cache"] = c
    if Lq > 1:  # SDPA's boolean mask for the bottom-right causal rows: key j visible from token t when j <= kv - Lq + t
        j = torch.arange(kv, device=device).view(1, -1)
        t["sdpa_mask"] = j <= torch.arange(kv - Lq, kv, device=device).view(-1, 1)
    return t


def _kf_run(t):
    return (kf().decode_attention(t["q"], t["k_cache"], t["v_cache"], t["seq_lens"], t["block_table"],
                                  max_seq_len=t["max_seq_len"]),)


def _eager():
    """A plain PyTorch decode over the same cache: the pages gathered through the block table (a copy
    of the cache), the scores of each kv head's group of query rows in one matmul, the visibility mask
    from seq_lens (on the device: no host read), a float32 softmax rounded to the dtype, one matmul
    with the values (HF's eager attention rounding)."""

    def run(t):
        q, k_cache, v_cache, lens, table = t["q"], t["k_cache"], t["v_cache"], t["seq_lens"], t["block_table"]
        B, Lq, Hq, D = q.shape
        page, Hkv = k_cache.shape[1], k_cache.shape[2]
        L = t["max_seq_len"]
        if table is None:
            k, v = k_cache[:B, :L], v_cache[:B, :L]
        else:
            idx = table[:, :-(-L // page)].long()
            k = k_cache[idx].flatten(1, 2)[:, :L]
            v = v_cache[idx].flatten(1, 2)[:, :L]
        g = Hq // Hkv
        qh = q.view(B, Lq, Hkv, g, D).permute(0, 2, 3, 1, 4).reshape(B, Hkv, g * Lq, D)
        s = torch.matmul(qh, k.permute(0, 2, 3, 1)).float() * D ** -0.5  # [B, Hkv, g * Lq, L]
        pos = lens.view(B, 1).long() - Lq + torch.arange(Lq, device=q.device).view(1, Lq)
        visible = torch.arange(L, device=q.device).view(1, 1, L) <= pos.unsqueeze(-1)  # [B, Lq, L]
        s = s.masked_fill(~visible.view(B, 1, 1, Lq, L).expand(B, 1, g, Lq, L).reshape(B, 1, g * Lq, L),
                          float("-inf"))
        p = torch.softmax(s, dim=-1).to(q.dtype)
        o = torch.matmul(p, v.transpose(1, 2))  # [B, Hkv, g * Lq, D]
        return (o.view(B, Hkv, g, Lq, D).permute(0, 3, 1, 2, 4).reshape(B, Lq, Hq, D),)

    return run


def _sdpa_peer(backend_name: str):
    """torch's SDPA pinned to one backend on the contiguous [B, Hkv, kv, D] cache (enable_gqa); q as
    a [B, Hq, Lq, D] view, the output returned as a [B, Lq, Hq, D] view. Lq > 1: the boolean mask of
    the bottom-right causal rows (cuDNN; flash2 takes no mask and is not run there)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel  # noqa: PLC0415

    backend = getattr(SDPBackend, backend_name)

    def run(t):
        q = t["q"].transpose(1, 2)
        with sdpa_kernel(backend):
            o = torch.nn.functional.scaled_dot_product_attention(q, t["k_static"], t["v_static"],
                                                                 attn_mask=t.get("sdpa_mask"),
                                                                 enable_gqa=q.shape[1] != t["k_static"].shape[1])
        return (o.transpose(1, 2),)

    return run


def _peer_applies(provider: str, shape: DecodeShape) -> bool:
    """flash2 (SDPA's FLASH_ATTENTION) takes no mask: Lq = 1 only."""
    return not (provider == "flash2" and shape.lq > 1)


# GQA 32/8 d128 page 16 at b1 kv8k, b16 kv4k, b64 kv2k, b8 kv32k; page 1 and Lq = 4 at b16 kv4k
SHAPES = (DecodeShape(1, 32, 8, 8192, 128, 16), DecodeShape(16, 32, 8, 4096, 128, 16),
          DecodeShape(64, 32, 8, 2048, 128, 16), DecodeShape(8, 32, 8, 32768, 128, 16),
          DecodeShape(16, 32, 8, 4096, 128, 1), DecodeShape(16, 32, 8, 4096, 128, 16, 4),
          DecodeShape(1, 32, 8, 8192, 128, 0), DecodeShape(16, 32, 8, 4096, 128, 0))

# ---- kforge check ---------------------------------------------------------------------------------
# (B, Lq, Hq, Hkv, D, kv): every head dim, GQA groups 1 .. 16 (7: not a power of two), Lq 1 .. 8,
# ragged lengths with an empty sequence (Lq = 1), lengths past a 4096-key split, one long sequence.
CHECK_SHAPES = ((4, 1, 32, 8, 128, 4097), (3, 1, 16, 1, 64, 700), (2, 4, 14, 2, 256, 300), (2, 8, 8, 8, 128, 129),
                (1, 1, 32, 4, 128, 32768), (5, 2, 8, 4, 64, 1000))
VARIANTS = (
    {"page": 16},
    {"page": 16, "sinks": True, "lse": True},
    {"page": 1, "lse": True},
    {"page": 64, "window_left": 100, "lse": True},
    {"page": 256, "softcap": 30.0},
    {"page": 0},
    {"page": 0, "static": True, "window_left": 7, "sinks": True, "lse": True},
)


def check_label(shape) -> str:
    B, Lq, Hq, Hkv, D, kv = shape
    return f"b{B}h{Hq}/{Hkv}kv{kv}d{D}" + (f"q{Lq}" if Lq != 1 else "")


def _check_inputs(shape, v, dtype, device):
    B, Lq, Hq, Hkv, D, kv = shape
    t = make_cache(ragged_lens(kv, B, Lq), Hkv, D, v["page"], dtype, device, static=v.get("static", False))
    t["q"] = randn(None, device, dtype, B, Lq, Hq, D)
    t["sinks"] = randn(None, device, torch.float32, Hq, scale=2.0) if v.get("sinks") else None
    return t


def _options(v) -> dict:
    return {"window_left": v.get("window_left", -1), "softcap": v.get("softcap", 0.0)}


def _finite_lse(lse):
    # -inf rows (an empty sequence without sinks) compare as 0 on both sides: errors() refuses non-finite values
    return torch.where(torch.isinf(lse), torch.zeros_like(lse), lse)


def _check_run(kfm, t, v):
    q = t["q"]
    poison([q.shape], q.dtype, q.device)
    poison([q.shape[:3]], torch.float32, q.device)
    out, lse = kfm.decode_attention(q, t["k_cache"], t["v_cache"], t["seq_lens"], t["block_table"], **_options(v),
                                    sinks=t["sinks"], return_lse=True)
    check_out("out", out, q.shape, q.dtype)
    check_out("lse", lse, q.shape[:3], torch.float32)
    res = {"out": out}
    if v.get("lse"):
        res["lse"] = _finite_lse(lse)
    return res


def _cpp_reference(a, v):
    out, lse = torch.ops.kernelforge.decode_attention(a["q"], a["k_cache"], a["v_cache"], a["seq_lens"],
                                                      a["block_table"], scale=None, **_options(v), sinks=a["sinks"],
                                                      max_seq_len=0, return_lse=True)
    res = {"out": out}
    if v.get("lse"):
        res["lse"] = _finite_lse(lse)
    return res


def _reference(a, v):
    out, lse = decode_ref(a["q"], a["k_cache"], a["v_cache"], a["seq_lens"], a["block_table"], **_options(v),
                          sinks=a["sinks"])
    res = {"out": out}
    if v.get("lse"):
        res["lse"] = _finite_lse(lse)
    return res


DECODE_ATTENTION = OpSpec(
    name="decode_attention", family="decode", shape_kind="decode",
    inputs=_inputs, run=_kf_run, grad_inputs=(), grad_outputs=(), outputs=("out",),
    row_bytes=_bytes, flops=_flops, shapes=SHAPES, eager=_eager,
    providers=("kernelforge", "eager", "compile", "cudnn", "flash2"),
    extra_peers={"cudnn": lambda: _sdpa_peer("CUDNN_ATTENTION"), "flash2": lambda: _sdpa_peer("FLASH_ATTENTION")},
    peer_applies=_peer_applies, shape_applies=lambda sh: sh.d in (64, 128, 256), modes=("fwd",),
    dtypes=(torch.bfloat16, torch.float16), bound="memory",
    check_shapes=CHECK_SHAPES, variants=VARIANTS, check_inputs=_check_inputs, check_run=_check_run,
    cpp_reference=_cpp_reference, reference=_reference, check_label=check_label,
)


# ---- mla_decode -----------------------------------------------------------------------------------
# MLA decode (DeepSeek-V2 / V3, absorbed; include/kernelforge/mla.h): q [B, Lq, H, 576] against one
# latent cache [P, page_size, 576] whose rows are the keys and whose first 512 columns are the values.
# Bench shapes are DecodeShapes with Hkv = 1 and D = 576 (b64h128/1kv4096d576p64: DeepSeek-V3's 128
# heads). Memory-bound in bytes: every cache row once per sequence, B * kv * 576 elements, plus q read
# and out written, B * Lq * H * (576 + 512); but 2 * H * (576 + 512) FLOPs per (query row, key), ~240
# per cache byte at H = 128, so the tensor cores bound it as much as DRAM does.
# Peers: ``eager`` gathers each sequence's rows through the block table, one matmul of all H * Lq query
# rows against the keys, a float32 softmax rounded to the dtype, one matmul with the first 512
# columns; ``compile`` is torch.compile of it.


def mla_decode_ref(q, kv_cache, seq_lens, block_table=None, *, scale=None):
    """mla.h's formula in float64 on the CPU: decode_ref with one kv head whose keys are the cache rows
    and whose values are their first 512 columns. kv_cache [P, page, 576] or [P, page, 1, 576].
    Returns (out [B, Lq, H, 512], lse [B, Lq, H])."""
    kv = kv_cache.unsqueeze(2) if kv_cache.dim() == 3 else kv_cache
    return decode_ref(q, kv, kv[..., :512], seq_lens, block_table, scale=scale)


def _mla_flops(shape: DecodeShape, mode: str) -> int:
    return 2 * shape.hq * (shape.d + 512) * _pairs(shape)


def _mla_bytes(shape: DecodeShape, mode: str, elt: int) -> int:
    # every cache row once per sequence, q read, out written
    return (shape.b * shape.kv * shape.d + shape.b * shape.lq * shape.hq * (shape.d + 512)) * elt


def _mla_inputs(shape: DecodeShape, dtype, device, gen):
    """q [B, Lq, H, D]; the cache [P, page, D] (p0: [B, kv, D], sequence b in page b; otherwise pages
    a random permutation of the pool, block_table int32 [B, ceil(kv / p)])."""
    B, H, kv, D, page, Lq = shape.b, shape.hq, shape.kv, shape.d, shape.page, shape.lq
    rows = randn(gen, device, dtype, B, kv, D)
    t = {"q": randn(gen, device, dtype, B, Lq, H, D),
         "seq_lens": torch.full((B,), kv, dtype=torch.int32, device=device), "max_seq_len": kv}
    if page == 0:
        t["kv_cache"], t["block_table"] = rows, None
    else:
        per = -(-kv // page)
        table = torch.randperm(B * per, generator=gen, device=device).view(B, per)
        if per * page > kv:
            rows = torch.cat([rows, rows.new_zeros(B, per * page - kv, D)], dim=1)
        c = torch.empty(B * per, page, D, dtype=dtype, device=device)
        c[table.flatten()] = rows.reshape(B * per, page, D)
        t["kv_cache"], t["block_table"] = c, table.to(torch.int32)
    return t


def _mla_run(t):
    return (kf().mla_decode(t["q"], t["kv_cache"], t["seq_lens"], t["block_table"], max_seq_len=t["max_seq_len"]),)


def _mla_eager():
    """A plain PyTorch MLA decode over the same cache: the rows gathered through the block table (a
    copy), the scores of all H * Lq query rows of a sequence in one matmul, the visibility mask from
    seq_lens (on the device), a float32 softmax rounded to the dtype, one matmul with the rows' first
    512 columns."""

    def run(t):
        q, kv, lens, table = t["q"], t["kv_cache"], t["seq_lens"], t["block_table"]
        B, Lq, H, D = q.shape
        L = t["max_seq_len"]
        if table is None:
            k = kv[:B, :L]
        else:
            idx = table[:, :-(-L // kv.shape[1])].long()
            k = kv[idx].flatten(1, 2)[:, :L]  # [B, L, D]
        s = torch.matmul(q.reshape(B, Lq * H, D), k.transpose(1, 2)).float() * D ** -0.5  # [B, Lq * H, L]
        pos = lens.view(B, 1).long() - Lq + torch.arange(Lq, device=q.device).view(1, Lq)
        visible = torch.arange(L, device=q.device).view(1, 1, L) <= pos.unsqueeze(-1)  # [B, Lq, L]
        s = s.view(B, Lq, H, L).masked_fill(~visible.unsqueeze(2), float("-inf"))
        p = torch.softmax(s, dim=-1).to(q.dtype).view(B, Lq * H, L)
        return (torch.matmul(p, k[..., :512]).view(B, Lq, H, 512),)

    return run


# DeepSeek-V3's 128 heads: b64 x kv4k, page 64 (FlashMLA's page size), 1 and 2 new tokens (MTP); b16 x 16 heads
MLA_SHAPES = (DecodeShape(64, 128, 1, 4096, 576, 64), DecodeShape(64, 128, 1, 4096, 576, 64, 2),
              DecodeShape(16, 16, 1, 8192, 576, 64), DecodeShape(1, 128, 1, 16384, 576, 64))

# (B, Lq, H, kv): H 16 / 128 / 7, Lq 1 .. 8, ragged lengths with an empty sequence (Lq = 1) and 4097
MLA_CHECK_SHAPES = ((4, 1, 16, 4097), (3, 1, 128, 700), (2, 4, 7, 300), (2, 8, 128, 129), (3, 2, 64, 1000))
MLA_VARIANTS = ({"page": 64}, {"page": 16, "lse": True}, {"page": 1, "lse": True}, {"page": 0, "scale": 0.1})


def _mla_check_label(shape) -> str:
    B, Lq, H, kv = shape
    return f"b{B}h{H}kv{kv}" + (f"q{Lq}" if Lq != 1 else "")


def _mla_check_inputs(shape, v, dtype, device):
    B, Lq, H, kv = shape
    t = make_cache(ragged_lens(kv, B, Lq), 1, 576, v["page"], dtype, device)
    return {"q": randn(None, device, dtype, B, Lq, H, 576), "kv_cache": t["k_cache"][:, :, 0],
            "seq_lens": t["seq_lens"], "block_table": t["block_table"]}


def _mla_outputs(out, lse, v) -> dict:
    return {"out": out, "lse": _finite_lse(lse)} if v.get("lse") else {"out": out}


def _mla_check_run(kfm, t, v):
    q = t["q"]
    poison([(*q.shape[:3], 512)], q.dtype, q.device)
    poison([q.shape[:3]], torch.float32, q.device)
    out, lse = kfm.mla_decode(q, t["kv_cache"], t["seq_lens"], t["block_table"], scale=v.get("scale"),
                              return_lse=True)
    check_out("out", out, (*q.shape[:3], 512), q.dtype)
    check_out("lse", lse, q.shape[:3], torch.float32)
    return _mla_outputs(out, lse, v)


def _mla_cpp_reference(a, v):
    out, lse = torch.ops.kernelforge.mla_decode(a["q"], a["kv_cache"], a["seq_lens"], a["block_table"],
                                                scale=v.get("scale"), max_seq_len=0, return_lse=True)
    return _mla_outputs(out, lse, v)


def _mla_reference(a, v):
    out, lse = mla_decode_ref(a["q"], a["kv_cache"], a["seq_lens"], a["block_table"], scale=v.get("scale"))
    return _mla_outputs(out, lse, v)


MLA_DECODE = OpSpec(
    name="mla_decode", family="decode", shape_kind="decode",
    inputs=_mla_inputs, run=_mla_run, grad_inputs=(), grad_outputs=(), outputs=("out",),
    row_bytes=_mla_bytes, flops=_mla_flops, shapes=MLA_SHAPES, eager=_mla_eager,
    shape_applies=lambda sh: sh.d == 576 and sh.hk == 1,
    providers=("kernelforge", "eager", "compile"), modes=("fwd",), dtypes=(torch.bfloat16, torch.float16),
    bound="memory", check_shapes=MLA_CHECK_SHAPES, variants=MLA_VARIANTS, check_inputs=_mla_check_inputs,
    check_run=_mla_check_run, cpp_reference=_mla_cpp_reference, reference=_mla_reference,
    check_label=_mla_check_label,
)


# ---- cascade_decode_attention ---------------------------------------------------------------------
# B sequences sharing one prefix of P keys (a system prompt), each with its own suffix of kv keys in a
# paged cache (cascade_decode_attention in python/kernelforge/decode.py: a prefix pass of every
# sequence's queries against the prefix, the decode kernel over the suffixes, merge_attention_states).
# Memory-bound in bytes: the prefix read once, 2 * P * Hkv * D elements, every sequence's suffix once,
# 2 * B * kv * Hkv * D, plus q read and out written, 2 * B * Lq * Hq * D (the merge's intermediates
# are not counted: they are what a fused kernel would not write). GB/s against copy@size.
# Peers: ``kf_decode`` is kernelforge's own non-cascade path, decode_attention over the full
# per-sequence caches whose block tables all start with the same prefix pages (the prefix stored once,
# read by every (sequence, kv head) CTA, from L2 when they run together); ``cudnn`` is torch's SDPA
# pinned to cuDNN on contiguous [B, Hkv, P + kv, D] caches (the prefix copied into every sequence).


class CascadeShape(NamedTuple):
    """A cascade_decode_attention shape, written b{B}h{Hq}[/{Hkv}]pre{P}kv{kv}d{D}p{page}[q{Lq}]: B
    sequences sharing a prefix of P keys, each with kv suffix keys (the Lq new tokens included), Hq /
    Hkv heads, head dim D, the suffix cache's page size (P a multiple of it: the non-cascade peer shares
    whole prefix pages)."""

    b: int
    hq: int
    hk: int
    prefix: int
    kv: int
    d: int
    page: int
    lq: int = 1

    def __str__(self) -> str:
        s = f"b{self.b}h{self.hq}" + (f"/{self.hk}" if self.hk != self.hq else "")
        return s + f"pre{self.prefix}kv{self.kv}d{self.d}p{self.page}" + (f"q{self.lq}" if self.lq != 1 else "")


def cascade_ref(q, prefix_k, prefix_v, k_cache, v_cache, seq_lens, block_table=None, *, scale=None):
    """cascade_decode_attention's formula in float64 on the CPU: sequence b's keys are the prefix
    (positions 0 .. P - 1, all visible to every new token) then its suffix (suffix key j through the
    block table as decode_ref reads it; new token t sees j <= seq_lens[b] - Lq + t). Returns (out
    [B, Lq, Hq, D], lse [B, Lq, Hq]); a token that sees no key gets 0 and -inf."""
    q = q.detach().to("cpu", f64)
    pk, pv = (x.detach().to("cpu", f64) for x in (prefix_k, prefix_v))
    kc, vc = (x.detach().to("cpu", f64) for x in (k_cache, v_cache))
    B, Lq, Hq, D = q.shape
    P, page, Hkv = pk.shape[0], kc.shape[1], kc.shape[2]
    group = Hq // Hkv
    table = block_table.detach().to("cpu", torch.int64) if block_table is not None else None
    cap = page if table is None else table.shape[1] * page
    scale = D ** -0.5 if scale is None else scale
    out = torch.zeros(B, Lq, Hq, D, dtype=f64)
    lse = torch.full((B, Lq, Hq), float("-inf"), dtype=f64)
    for b in range(B):
        n = min(max(int(seq_lens[b]), 0), cap)
        j = torch.arange(n)
        if table is None:
            sk, sv = kc[b, :n], vc[b, :n]
        else:
            pages = table[b][j // page]
            ok = ((pages >= 0) & (pages < kc.shape[0])).view(n, 1, 1)
            pages = pages.clamp(0, kc.shape[0] - 1)
            sk = torch.where(ok, kc[pages, j % page], torch.zeros((), dtype=f64))
            sv = torch.where(ok, vc[pages, j % page], torch.zeros((), dtype=f64))
        keys = torch.cat([pk, sk]).repeat_interleave(group, dim=1)  # [P + n, Hq, D]
        vals = torch.cat([pv, sv]).repeat_interleave(group, dim=1)
        s = torch.einsum("thd,jhd->thj", q[b], keys) * scale  # [Lq, Hq, P + n]
        pos = n - Lq + torch.arange(Lq).view(-1, 1)  # the new tokens' suffix positions
        visible = torch.cat([torch.ones(Lq, P, dtype=torch.bool), j.view(1, -1) <= pos], dim=1)  # [Lq, P + n]
        s = s.masked_fill(~visible.unsqueeze(1), float("-inf"))
        if P + n == 0:
            continue
        m = s.amax(dim=-1, keepdim=True)
        m0 = torch.where(torch.isinf(m), torch.zeros_like(m), m)
        w = torch.exp(s - m0)
        den = w.sum(dim=-1)
        out[b] = torch.einsum("thj,jhd->thd", w, vals) / den.clamp_min(1e-300).unsqueeze(-1)
        lse[b] = torch.where(den > 0, m0.squeeze(-1) + torch.log(den.clamp_min(1e-300)),
                             torch.full_like(den, float("-inf")))
    return out, lse


def _cascade_bytes(shape: CascadeShape, mode: str, elt: int) -> int:
    # the prefix once, every suffix once, q read, out written
    return (2 * shape.prefix * shape.hk * shape.d + 2 * shape.b * shape.kv * shape.hk * shape.d
            + 2 * shape.b * shape.lq * shape.hq * shape.d) * elt


def _cascade_flops(shape: CascadeShape, mode: str) -> int:
    pairs = shape.b * shape.lq * shape.prefix + shape.b * (shape.lq * shape.kv - shape.lq * (shape.lq - 1) // 2)
    return 4 * shape.hq * shape.d * pairs


def _cascade_inputs(shape: CascadeShape, dtype, device, gen):
    """One page pool [P / page + B * ceil(kv / page), page, Hkv, D] in a random order after the prefix:
    the prefix's pages first (prefix_k / prefix_v are their [P, Hkv, D] view), every sequence's suffix
    pages after them. block_table [B, ceil(kv / page)] the suffix pages (cascade); full_table the prefix
    pages followed by them, full_lens P + kv (kf_decode). k_static / v_static [B, Hkv, P + kv, D]: the
    same keys per sequence, contiguous (cudnn)."""
    B, Hq, Hkv, P, kv, D, page, Lq = shape
    if P % page:
        raise ValueError(f"{shape}: the prefix length must be a multiple of the page size")
    pre, per = P // page, -(-kv // page)
    t = {"q": randn(gen, device, dtype, B, Lq, Hq, D)}
    table = pre + torch.randperm(B * per, generator=gen, device=device).view(B, per)
    pool = {}
    for name in ("k", "v"):
        c = torch.zeros(pre + B * per, page, Hkv, D, dtype=dtype, device=device)
        c[:pre] = randn(gen, device, dtype, pre, page, Hkv, D)
        rows = randn(gen, device, dtype, B, per * page, Hkv, D)
        c[table.flatten()] = rows.view(B * per, page, Hkv, D)
        pool[name] = c
        t[f"{name}_cache"] = c
        t[f"prefix_{name}"] = c[:pre].view(P, Hkv, D)
        full = torch.cat([c[:pre].view(1, P, Hkv, D).expand(B, P, Hkv, D), rows[:, :kv]], dim=1)
        t[f"{name}_static"] = full.transpose(1, 2).contiguous()  # [B, Hkv, P + kv, D]
    t["block_table"] = table.to(torch.int32)
    t["seq_lens"] = torch.full((B,), kv, dtype=torch.int32, device=device)
    prefix_pages = torch.arange(pre, device=device).view(1, pre).expand(B, pre)
    t["full_table"] = torch.cat([prefix_pages, table], dim=1).to(torch.int32)
    t["full_lens"] = torch.full((B,), P + kv, dtype=torch.int32, device=device)
    t["max_seq_len"] = kv
    if Lq > 1:  # SDPA's boolean mask of the bottom-right causal rows over P + kv keys
        j = torch.arange(P + kv, device=device).view(1, -1)
        t["sdpa_mask"] = j <= torch.arange(P + kv - Lq, P + kv, device=device).view(-1, 1)
    return t


def _cascade_run(t):
    return (kf().cascade_decode_attention(t["q"], t["prefix_k"], t["prefix_v"], t["k_cache"], t["v_cache"],
                                          t["seq_lens"], t["block_table"], max_seq_len=t["max_seq_len"]),)


def _kf_decode_full():
    """decode_attention over the per-sequence caches [prefix; suffix] whose block tables share the
    prefix pages: kernelforge without the cascade."""

    def run(t):
        return (kf().decode_attention(t["q"], t["k_cache"], t["v_cache"], t["full_lens"], t["full_table"],
                                      max_seq_len=t["max_seq_len"] + t["prefix_k"].shape[0]),)

    return run


# b64 x prefix 4096 x suffix 256 and b16 x prefix 8192 x suffix 512, GQA 32/8 d128 page 16; 4 new tokens
CASCADE_SHAPES = (CascadeShape(64, 32, 8, 4096, 256, 128, 16), CascadeShape(16, 32, 8, 8192, 512, 128, 16),
                  CascadeShape(64, 32, 8, 4096, 256, 128, 16, 4))
# (B, Lq, Hq, Hkv, D, P, kv): ragged suffixes with an empty one (Lq = 1), GQA 4 / 1 / 8, Lq 1 .. 4
CASCADE_CHECK_SHAPES = ((4, 1, 32, 8, 128, 1000, 300), (3, 4, 8, 8, 64, 129, 50), (2, 2, 16, 2, 256, 64, 9))
CASCADE_VARIANTS = ({"page": 16}, {"page": 1, "lse": True})


def _cascade_check_label(shape) -> str:
    B, Lq, Hq, Hkv, D, P, kv = shape
    return f"b{B}h{Hq}/{Hkv}pre{P}kv{kv}d{D}" + (f"q{Lq}" if Lq != 1 else "")


def _cascade_check_inputs(shape, v, dtype, device):
    B, Lq, Hq, Hkv, D, P, kv = shape
    t = make_cache(ragged_lens(kv, B, Lq), Hkv, D, v["page"], dtype, device)
    t["q"] = randn(None, device, dtype, B, Lq, Hq, D)
    t["prefix_k"] = randn(None, device, dtype, P, Hkv, D)
    t["prefix_v"] = randn(None, device, dtype, P, Hkv, D)
    return t


def _cascade_outputs(out, lse, v) -> dict:
    return {"out": out, "lse": _finite_lse(lse)} if v.get("lse") else {"out": out}


def _cascade_call(kfm, a):
    return kfm.cascade_decode_attention(a["q"], a["prefix_k"], a["prefix_v"], a["k_cache"], a["v_cache"],
                                        a["seq_lens"], a["block_table"], return_lse=True)


def _cascade_check_run(kfm, t, v):
    q = t["q"]
    poison([q.shape], q.dtype, q.device)
    poison([q.shape[:3]], torch.float32, q.device)
    out, lse = _cascade_call(kfm, t)
    check_out("out", out, q.shape, q.dtype)
    check_out("lse", lse, q.shape[:3], torch.float32)
    return _cascade_outputs(out, lse, v)


def _cascade_cpp_reference(a, v):
    return _cascade_outputs(*_cascade_call(kf(), a), v)  # CPU tensors: the C++ float64 references composed


def _cascade_reference(a, v):
    out, lse = cascade_ref(a["q"], a["prefix_k"], a["prefix_v"], a["k_cache"], a["v_cache"], a["seq_lens"],
                           a["block_table"])
    return _cascade_outputs(out, lse, v)


def _cascade_sdpa():
    return _sdpa_peer("CUDNN_ATTENTION")


CASCADE_DECODE = OpSpec(
    name="cascade_decode_attention", family="decode", shape_kind="cascade",
    inputs=_cascade_inputs, run=_cascade_run, grad_inputs=(), grad_outputs=(), outputs=("out",),
    row_bytes=_cascade_bytes, flops=_cascade_flops, shapes=CASCADE_SHAPES,
    providers=("kernelforge", "kf_decode", "cudnn"),
    extra_peers={"kf_decode": _kf_decode_full, "cudnn": _cascade_sdpa},
    modes=("fwd",), dtypes=(torch.bfloat16, torch.float16), bound="memory",
    check_shapes=CASCADE_CHECK_SHAPES, variants=CASCADE_VARIANTS, check_inputs=_cascade_check_inputs,
    check_run=_cascade_check_run, cpp_reference=_cascade_cpp_reference, reference=_cascade_reference,
    check_label=_cascade_check_label,
)

SPECS = (DECODE_ATTENTION, MLA_DECODE, CASCADE_DECODE)
