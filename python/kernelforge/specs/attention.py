"""The attention family: attention (scaled dot-product attention, forward and backward).

Bench shapes are AttnShapes, written as the anchors write them: b{B}h{Hq}[/{Hkv}]s{Sq}[/{Sk}]d{D}[/{Dv}],
``c`` for causal, ``-varlen`` for packed ragged sequences (B sequences of lengths S, 3S/4, S/2, S/4,
repeated). Check shapes are (B, Sq, Sk, Hq, Hkv, Dqk, Dv) with variants for the options.

Attention is compute-bound: the bench reports TFLOP/s (``bound="compute"``), counted as the anchors
count it: 4 * B * H * Sq * Sk * D for Dqk = Dv (2 * Sq * Sk * (Dqk + Dv) per (b, h) in general: the
QK^T and PV GEMMs), halved when causal (Sq = Sk: the visible pairs are about half; exactly
Sq * (Sq + 1) / 2, the anchors and FlashAttention's benchmarks use half). Forward + backward
(``fwdbwd``) counts 3.5x that: the forward's two GEMMs, then the backward's five (S recomputed, dP,
dV, dQ, dK: 2.5x the forward), as FlashAttention's benchmarks count it.
"""

from __future__ import annotations

import torch

from ._spec import AttnShape, OpSpec, check_out, f64, kf, poison, randn


# ---- float64 reference ----------------------------------------------------------------------------


def _dense_ref(q, k, v, causal, scale, window, softcap, sinks):
    """q [B, Sq, Hq, D], k [B, Sk, Hkv, D], v [B, Sk, Hkv, Dv] (float64) -> out [B, Sq, Hq, Dv],
    lse [B, Hq, Sq]. The visibility mask is built explicitly from the formula."""
    B, Sq, Hq, D = q.shape
    Sk, Hkv = k.shape[1], k.shape[2]
    group = Hq // Hkv
    k = k.repeat_interleave(group, dim=2)
    v = v.repeat_interleave(group, dim=2)
    s = torch.einsum("bqhd,bkhd->bhqk", q, k) * (D ** -0.5 if scale is None else scale)
    if softcap:
        s = softcap * torch.tanh(s / softcap)
    i = torch.arange(Sq).view(-1, 1)
    j = torch.arange(Sk).view(1, -1)
    off = Sk - Sq  # bottom-right alignment
    left, right = window
    if causal:
        right = 0
    visible = torch.ones(Sq, Sk, dtype=torch.bool)
    if left >= 0:
        visible &= j >= i + off - left
    if right >= 0:
        visible &= j <= i + off + right
    s = s.masked_fill(~visible, float("-inf"))
    m = s.amax(dim=-1) if Sk > 0 else torch.full((B, Hq, Sq), float("-inf"), dtype=f64)
    if sinks is not None:
        m = torch.maximum(m, sinks.to(f64).view(1, Hq, 1))
    m_safe = torch.where(torch.isinf(m), torch.zeros_like(m), m)
    p = torch.exp(s - m_safe.unsqueeze(-1))
    den = p.sum(dim=-1)
    if sinks is not None:
        den = den + torch.exp(sinks.to(f64).view(1, Hq, 1) - m_safe)
    out = torch.einsum("bhqk,bkhd->bqhd", p, v) / den.transpose(1, 2).unsqueeze(-1).clamp_min(1e-300)
    lse = torch.where(den > 0, m_safe + torch.log(den), torch.full_like(den, float("-inf")))
    return out, lse


def attention_ref(q, k, v, *, causal=False, scale=None, window=(-1, -1), softcap=0.0, sinks=None,
                  cu_seqlens_q=None, cu_seqlens_k=None, layout="bshd"):
    """The contract's formula in float64 (include/kernelforge/attention.h): returns (out, lse),
    out float64 in q's layout, lse float64 [B, Hq, Sq] ([Hq, Tq] for varlen). A row that sees no key:
    out 0, lse -inf (or the sink)."""
    q, k, v = q.to(f64), k.to(f64), v.to(f64)
    if layout == "bhsd":
        out, lse = _dense_ref(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), causal, scale, window,
                              softcap, sinks)
        return out.transpose(1, 2), lse
    if layout == "bshd":
        return _dense_ref(q, k, v, causal, scale, window, softcap, sinks)
    cq, ck = cu_seqlens_q.tolist(), cu_seqlens_k.tolist()
    outs, lses = [], []
    for b in range(len(cq) - 1):
        o, lse = _dense_ref(q[None, cq[b]:cq[b + 1]], k[None, ck[b]:ck[b + 1]], v[None, ck[b]:ck[b + 1]], causal,
                            scale, window, softcap, sinks)
        outs.append(o[0])
        lses.append(lse[0])
    Hq, Dv = q.shape[1], v.shape[2]
    out = torch.cat(outs) if outs else q.new_zeros((0, Hq, Dv))
    lse = torch.cat(lses, dim=1) if lses else q.new_zeros((Hq, 0))
    return out, lse


# ---- FLOPs and bytes ------------------------------------------------------------------------------


def varlen_lengths(b: int, s: int) -> list[int]:
    """The bench's ragged sequence lengths: S, 3S/4, S/2, S/4, repeated over B sequences."""
    return [s - (i % 4) * s // 4 for i in range(b)]


def _pairs(shape: AttnShape) -> int:
    """(query, key) pairs per head, the anchors' count: Sq * Sk per sequence, halved when causal."""
    if shape.varlen:
        lens = varlen_lengths(shape.b, shape.sq)
        pairs = sum(n * n for n in lens)
    else:
        pairs = shape.b * shape.sq * shape.sk
    return pairs // 2 if shape.causal else pairs


def _flops(shape: AttnShape, mode: str) -> int:
    # QK^T: 2 * D per pair; PV: 2 * Dv per pair. Backward: S = QK^T again (2 D), dP = dO V^T (2 Dv),
    # dV = P^T dO (2 Dv), dQ = dS K (2 D), dK = dS^T Q (2 D): 2.5x the forward for D = Dv
    fwd = 2 * shape.hq * _pairs(shape) * (shape.d + shape.dv)
    return fwd * 7 // 2 if mode == "fwdbwd" else fwd


def _tokens(shape: AttnShape) -> tuple[int, int]:
    if shape.varlen:
        t = sum(varlen_lengths(shape.b, shape.sq))
        return t, t
    return shape.b * shape.sq, shape.b * shape.sk


def _bytes(shape: AttnShape, mode: str, elt: int) -> int:
    # q, k, v read once, out written once (informational: the op is compute-bound); fwdbwd adds the
    # backward's q, k, v, out, dout reads and dq, dk, dv writes (lse and the float32 dq accumulator aside)
    tq, tk = _tokens(shape)
    fwd = (tq * shape.hq * (shape.d + shape.dv) + tk * shape.hk * (shape.d + shape.dv)) * elt
    bwd = (2 * tq * shape.hq * (shape.d + 2 * shape.dv) + 2 * tk * shape.hk * (shape.d + shape.dv)) * elt
    return fwd + bwd if mode == "fwdbwd" else fwd


# ---- bench ----------------------------------------------------------------------------------------


def _inputs(shape: AttnShape, dtype, device, gen):
    """q, k, v in FlashAttention's layout: [B, S, H, D] (varlen: packed [T, H, D] with cu_seqlens), and
    dout (out's shape) for fwdbwd."""
    if shape.varlen:
        lens = varlen_lengths(shape.b, shape.sq)
        t = sum(lens)
        cu = torch.tensor([0] + lens, dtype=torch.int32).cumsum(0).to(torch.int32).to(device)
        return {"q": randn(gen, device, dtype, t, shape.hq, shape.d),
                "k": randn(gen, device, dtype, t, shape.hk, shape.d),
                "v": randn(gen, device, dtype, t, shape.hk, shape.dv),
                "dout": randn(gen, device, dtype, t, shape.hq, shape.dv),
                "cu_seqlens": cu, "max_seqlen": max(lens), "causal": shape.causal, "varlen": True}
    return {"q": randn(gen, device, dtype, shape.b, shape.sq, shape.hq, shape.d),
            "k": randn(gen, device, dtype, shape.b, shape.sk, shape.hk, shape.d),
            "v": randn(gen, device, dtype, shape.b, shape.sk, shape.hk, shape.dv),
            "dout": randn(gen, device, dtype, shape.b, shape.sq, shape.hq, shape.dv),
            "causal": shape.causal, "varlen": False}


def _kf_run(t):
    if t["varlen"]:
        return (kf().attention(t["q"], t["k"], t["v"], causal=t["causal"], cu_seqlens_q=t["cu_seqlens"],
                               cu_seqlens_k=t["cu_seqlens"], max_seqlen_q=t["max_seqlen"],
                               max_seqlen_k=t["max_seqlen"]),)
    return (kf().attention(t["q"], t["k"], t["v"], causal=t["causal"]),)


def _sdpa_peer(backend_name: str):
    """torch's SDPA pinned to one backend (SDPBackend.FLASH_ATTENTION: FlashAttention-2,
    CUDNN_ATTENTION, EFFICIENT_ATTENTION), on [B, H, S, D] views of the [B, S, H, D] inputs; the
    output is returned as a [B, S, H, D] view to compare with kernelforge's. varlen (flash only):
    torch.nn.attention.varlen.varlen_attn (FlashAttention-2's varlen kernel)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel  # noqa: PLC0415

    backend = getattr(SDPBackend, backend_name)

    def run(t):
        if t["varlen"]:
            from torch.nn.attention.varlen import varlen_attn  # noqa: PLC0415

            m = t["max_seqlen"]
            return (varlen_attn(t["q"], t["k"], t["v"], t["cu_seqlens"], t["cu_seqlens"], m, m,
                                window_size=(-1, 0) if t["causal"] else (-1, -1)),)
        q, k, v = (x.transpose(1, 2) for x in (t["q"], t["k"], t["v"]))
        with sdpa_kernel(backend):
            o = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=t["causal"],
                                                                 enable_gqa=q.shape[1] != k.shape[1])
        return (o.transpose(1, 2),)

    return run


def _flex_peer():
    """flex_attention, compiled once per process (the bench resets dynamo per case; the block mask is
    built once per input set, outside the timed call). varlen: a document mask over the packed
    tokens (one batch of T tokens)."""
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention  # noqa: PLC0415

    flex = torch.compile(flex_attention, dynamic=False)
    masks: dict = {}

    def block_mask(t):
        key = (id(t["q"]), t["causal"], t["varlen"])
        if key not in masks:
            masks.clear()
            if t["varlen"]:
                cu = t["cu_seqlens"]
                n = t["q"].shape[0]
                doc = torch.searchsorted(cu, torch.arange(n, device=cu.device, dtype=cu.dtype), right=True) - 1
                causal = t["causal"]

                def mod(b, h, qi, ki):
                    same = doc[qi] == doc[ki]
                    return same & (ki <= qi) if causal else same

                masks[key] = create_block_mask(mod, None, None, n, n, device=cu.device)
            elif t["causal"]:
                sq, sk = t["q"].shape[1], t["k"].shape[1]
                masks[key] = create_block_mask(lambda b, h, qi, ki: ki - (sk - sq) <= qi, None, None, sq, sk,
                                               device=t["q"].device)
            else:
                masks[key] = None
        return masks[key]

    def run(t):
        bm = block_mask(t)
        if t["varlen"]:
            q, k, v = (x.unsqueeze(0).transpose(1, 2) for x in (t["q"], t["k"], t["v"]))
        else:
            q, k, v = (x.transpose(1, 2) for x in (t["q"], t["k"], t["v"]))
        o = flex(q, k, v, block_mask=bm, enable_gqa=q.shape[1] != k.shape[1])
        o = o.transpose(1, 2)
        return (o[0] if t["varlen"] else o,)

    return run


def _peer_applies(provider: str, shape: AttnShape) -> bool:
    """cuDNN and memory-efficient SDPA have no packed varlen entry."""
    return not (shape.varlen and provider in ("cudnn", "mem_eff"))


# 16 K tokens per batch (batch = 16384 / seqlen) at 512 .. 16384; heads 16 (d128), 32 (d64), 8 (d256);
# causal and not; GQA 32/8 d128; q/k 192 with v 128 (MLA prefill); one varlen case (the anchors' rows are the d64 / d128 ones at
# 1024, 4096, 16384).
def _bench_shapes():
    shapes = []
    for s in (512, 1024, 2048, 4096, 8192, 16384):
        b = 16384 // s
        for h, d in ((16, 128), (32, 64), (8, 256)):
            for causal in (False, True):
                shapes.append(AttnShape(b, h, h, s, s, d, d, causal))
    for causal in (False, True):
        shapes.append(AttnShape(4, 32, 8, 4096, 4096, 128, 128, causal))
        shapes.append(AttnShape(8, 16, 16, 4096, 4096, 128, 128, causal, varlen=True))
        shapes.append(AttnShape(4, 16, 16, 4096, 4096, 192, 128, causal))  # MLA prefill (DeepSeek-V2 heads)
    return tuple(shapes)


SHAPES = _bench_shapes()

# ---- kforge check ---------------------------------------------------------------------------------
# (B, Sq, Sk, Hq, Hkv, Dqk, Dv): one per code path: tile multiples, odd lengths, Sq != Sk both ways
# (bottom-right causal: rows that see no key when Sq > Sk), GQA 4:1 and MQA, every head dim pair,
# a decode-like single row.
CHECK_SHAPES = ((2, 128, 128, 4, 4, 64, 64), (1, 77, 203, 8, 2, 128, 128), (2, 200, 65, 4, 1, 96, 96),
                (1, 64, 64, 2, 2, 192, 128), (1, 130, 130, 2, 1, 256, 256), (3, 1, 300, 4, 2, 128, 128),
                (2, 65, 65, 4, 4, 96, 96))
VARIANTS = (
    {"layout": "bshd"},
    {"layout": "bshd", "causal": True, "lse": True},
    {"layout": "bhsd", "causal": True, "window": (32, 0)},
    {"layout": "bshd", "window": (16, 16)},
    {"layout": "bshd", "causal": True, "softcap": 30.0},
    {"layout": "bshd", "causal": True, "sinks": True, "lse": True},
    {"layout": "varlen", "causal": True, "lse": True},
    {"layout": "varlen", "window": (24, 0), "causal": True, "sinks": True},
)


def check_label(shape) -> str:
    B, Sq, Sk, Hq, Hkv, D, Dv = shape
    return AttnShape(B, Hq, Hkv, Sq, Sk, D, Dv, False).__str__()


def ragged(n: int, b: int) -> list[int]:
    """b ragged lengths at most n (the first n, then shorter, one of them empty when b >= 3)."""
    return [n if i == 0 else (0 if i == 2 else max(1, n - (i * n) // b - i)) for i in range(b)]


def make_inputs(shape, v, dtype, device, gen=None) -> dict:
    """The check (and test) inputs of a shape and variant: q, k, v in the variant's layout (varlen:
    ragged lengths, kv lengths = q lengths + Sk - Sq), sinks float32 [Hq] when asked."""
    B, Sq, Sk, Hq, Hkv, D, Dv = shape
    layout = v.get("layout", "bshd")
    t = {"cu_seqlens_q": None, "cu_seqlens_k": None, "max_seqlen_q": None, "max_seqlen_k": None, "sinks": None}
    if layout == "varlen":
        lq = ragged(Sq, B)
        lk = [max(0, n + Sk - Sq) if n > 0 else 0 for n in lq]
        t["cu_seqlens_q"] = torch.tensor([0] + lq).cumsum(0).to(device=device, dtype=torch.int32)
        t["cu_seqlens_k"] = torch.tensor([0] + lk).cumsum(0).to(device=device, dtype=torch.int32)
        t["max_seqlen_q"], t["max_seqlen_k"] = max(lq), max(lk)
        t["q"] = randn(gen, device, dtype, sum(lq), Hq, D)
        t["k"] = randn(gen, device, dtype, sum(lk), Hkv, D)
        t["v"] = randn(gen, device, dtype, sum(lk), Hkv, Dv)
    else:
        def heads(S, H, d):
            x = randn(gen, device, dtype, B, S, H, d)
            return x.transpose(1, 2) if layout == "bhsd" else x

        t["q"], t["k"], t["v"] = heads(Sq, Hq, D), heads(Sk, Hkv, D), heads(Sk, Hkv, Dv)
    if v.get("sinks"):
        t["sinks"] = randn(gen, device, torch.float32, Hq, scale=2.0)
    return t


def _options(v) -> dict:
    return {"causal": v.get("causal", False), "window": v.get("window", (-1, -1)),
            "softcap": v.get("softcap", 0.0), "layout": v.get("layout", "bshd")}


def _check_inputs(shape, v, dtype, device):
    """make_inputs plus dout, the incoming gradient (out's shape)."""
    t = make_inputs(shape, v, dtype, device)
    t["dout"] = randn(None, device, dtype, *t["q"].shape[:-1], t["v"].shape[-1])
    return t


def _leaves(t) -> list[str]:
    return ["q", "k", "v"] + (["sinks"] if t["sinks"] is not None else [])


def _tensor_args(t) -> dict:
    return {k: t[k] for k in ("sinks", "cu_seqlens_q", "cu_seqlens_k", "max_seqlen_q", "max_seqlen_k")}


def _check_run(kfm, t, v):
    """Forward and backward through kernelforge.attention's autograd; deterministic=True: check runs
    every case twice and needs bit-identical gradients."""
    q = t["q"]
    poison([q.shape[:-1] + (t["v"].shape[-1],), q.shape, t["k"].shape, t["v"].shape], q.dtype, q.device)
    x = {n: t[n].detach().clone().requires_grad_() for n in _leaves(t)}
    args = {**_tensor_args(t), **({"sinks": x["sinks"]} if "sinks" in x else {})}
    out, lse = kfm.attention(x["q"], x["k"], x["v"], **_options(v), **args, return_lse=True, deterministic=True)
    check_out("out", out, q.shape[:-1] + (t["v"].shape[-1],), q.dtype)
    out.backward(t["dout"])
    res = {"out": out.detach()}
    if v.get("lse"):
        res["lse"] = lse
    for n in x:
        check_out(f"d{n}", x[n].grad, t[n].shape, t[n].dtype)
        res[f"d{n}"] = x[n].grad
    return res


def _finite_lse(lse):
    # -inf rows (no visible key) compare as 0 on both sides: errors() refuses non-finite values
    return torch.where(torch.isinf(lse), torch.zeros_like(lse), lse)


def _cpp_reference(a, v):
    o = _options(v)
    kw = dict(causal=o["causal"], scale=None, window_left=o["window"][0], window_right=o["window"][1],
              softcap=o["softcap"], sinks=a["sinks"], cu_seqlens_q=a["cu_seqlens_q"], cu_seqlens_k=a["cu_seqlens_k"],
              max_seqlen_q=a["max_seqlen_q"] or 0, max_seqlen_k=a["max_seqlen_k"] or 0, layout=o["layout"])
    out, lse = torch.ops.kernelforge.attention(a["q"], a["k"], a["v"], **kw, return_lse=True)
    dq, dk, dv, dsinks = torch.ops.kernelforge.attention_backward(a["dout"], a["q"], a["k"], a["v"], out, lse, **kw,
                                                                  deterministic=False)
    res = {"out": out, "dq": dq, "dk": dk, "dv": dv}
    if a["sinks"] is not None:
        res["dsinks"] = dsinks
    if v.get("lse"):
        res["lse"] = _finite_lse(lse)
    return res


def _reference(a, v):
    o = _options(v)
    x = {n: a[n].detach().clone().requires_grad_() for n in _leaves(a)}
    out, lse = attention_ref(x["q"], x["k"], x["v"], causal=o["causal"], window=o["window"], softcap=o["softcap"],
                             sinks=x.get("sinks"), cu_seqlens_q=a["cu_seqlens_q"], cu_seqlens_k=a["cu_seqlens_k"],
                             layout=o["layout"])
    grads = torch.autograd.grad(out, list(x.values()), a["dout"])
    res = {"out": out.detach(), **{f"d{n}": g for n, g in zip(x, grads)}}
    lse = lse.detach()
    if v.get("lse"):
        res["lse"] = _finite_lse(lse)
    return res


def _check_run_finite(kfm, t, v):
    res = _check_run(kfm, t, v)
    if "lse" in res:
        res["lse"] = _finite_lse(res["lse"])
    return res


ATTENTION = OpSpec(
    name="attention", family="attention", shape_kind="attn",
    inputs=_inputs, run=_kf_run, grad_inputs=("q", "k", "v"), grad_outputs=("dout",), outputs=("out",),
    row_bytes=_bytes, flops=_flops, shapes=SHAPES,
    providers=("kernelforge", "flash2", "cudnn", "mem_eff", "flex"),
    extra_peers={"flash2": lambda: _sdpa_peer("FLASH_ATTENTION"), "cudnn": lambda: _sdpa_peer("CUDNN_ATTENTION"),
                 "mem_eff": lambda: _sdpa_peer("EFFICIENT_ATTENTION"), "flex": _flex_peer},
    peer_applies=_peer_applies, modes=("fwd", "fwdbwd"), dtypes=(torch.bfloat16, torch.float16), bound="compute",
    check_shapes=CHECK_SHAPES, variants=VARIANTS, check_inputs=_check_inputs, check_run=_check_run_finite,
    cpp_reference=_cpp_reference, reference=_reference, check_label=check_label,
)

SPECS = (ATTENTION,)
