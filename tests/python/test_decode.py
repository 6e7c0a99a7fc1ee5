"""kernelforge.decode_attention and kernelforge.kv_append against a float64 reference written here from
the formula of include/kernelforge/decode.h: each sequence's keys gathered through its block table,
one sequence and one new token at a time.

CPU tensors run the op's float64 C++ reference (a second, independent implementation of the formula);
CUDA tensors (float16 / bfloat16) run the kernels, within TOL[dtype].attn of the reference rounded to
the dtype, with the outputs' allocator blocks pre-filled with NaN. The caches hold NaN in every row no
sequence uses (the tail of each sequence's last page, spare pages; unused block-table entries point
at a NaN page) and their pages are shuffled: a kernel that reads past a sequence or ignores the block
table fails. Sizes are small so that the CPU cases run in seconds.
"""

from __future__ import annotations

import math
import warnings

import pytest
import torch

from kernelforge.decode import static_cache_view
from kernelforge.specs import TOL
from kernelforge.specs._spec import poison
from kernelforge.specs.decode import decode_ref, make_cache

f64 = torch.float64
CPU = pytest.param("cpu", f64, id="cpu-float64")
CPU_BF16 = pytest.param("cpu", torch.bfloat16, id="cpu-bfloat16")
CUDA = [pytest.param("cuda", dt, id=f"cuda-{str(dt)[6:]}") for dt in (torch.bfloat16, torch.float16)]
DEVICES = [CPU, CPU_BF16] + CUDA

# (seq_lens, Lq, Hq, Hkv, D, cache): every head dim, GQA groups 1, 2, 4, 7, 8, 16, 1 .. 8 new tokens,
# page sizes 1, 2, 16, 64, 256, a contiguous cache (p0) and transformers' static cache ("static");
# an empty sequence (Lq = 1: out 0, lse -inf), lengths 1 and 7, 4097 (past a 4096-key split).
CASES = [
    ([1, 7, 0, 33], 1, 8, 1, 128, "p16"),
    ([5, 17, 3], 2, 4, 2, 64, "p1"),
    ([9, 40], 3, 4, 4, 256, "p2"),
    ([70, 8, 129], 4, 7, 1, 128, "p64"),
    ([300, 257], 8, 16, 1, 64, "p256"),
    ([4097, 100], 1, 16, 4, 128, "p16"),
    ([23, 61, 0], 1, 8, 2, 64, "p0"),
    ([50, 11], 5, 8, 1, 256, "static"),
    ([12, 31], 6, 16, 2, 128, "p16"),
]
VARIANTS = [
    {},
    {"window_left": 5},
    {"softcap": 5.0},
    {"sinks": "float32"},
    {"sinks": "dtype"},
    {"scale": 0.375},  # a float32 value: the contract takes the scale as a float
    {"window_left": 0, "softcap": 3.0, "sinks": "float32"},  # each token sees itself only
]


def case_id(c) -> str:
    lens, lq, hq, hk, d, cache = c
    return f"{cache}-lens{'_'.join(map(str, lens))}-q{lq}-h{hq}/{hk}-d{d}"


def vid(v: dict) -> str:
    return "-".join(f"{k}={v[k]}" for k in v) or "plain"


# ---- the reference ---------------------------------------------------------------------------------


def reference(q, k_cache, v_cache, seq_lens, block_table=None, *, scale=None, window_left=-1, softcap=0.0,
              sinks=None, key_starts=None):
    """decode.h in float64: for sequence b (n = seq_lens[b]) key j is row j % page_size of page
    block_table[b, j // page_size] (contiguous: row j of page b); new token t sits at i = n - Lq + t
    and sees keys j <= i (and j >= i - window_left); the softmax of the (softcapped) scaled scores and
    the sink logit weighs the values. Returns (out [B, Lq, Hq, D], lse [B, Lq, Hq]), float64 on CPU."""
    q = q.detach().cpu().double()
    kc, vc = k_cache.detach().cpu(), v_cache.detach().cpu()
    B, Lq, Hq, D = q.shape
    page, Hkv = kc.shape[1], kc.shape[2]
    group = Hq // Hkv
    table = block_table.detach().cpu().long() if block_table is not None else None
    scale = D ** -0.5 if scale is None else scale
    sink = sinks.detach().cpu().double() if sinks is not None else None
    out = torch.zeros(B, Lq, Hq, D, dtype=f64)
    lse = torch.full((B, Lq, Hq), -math.inf, dtype=f64)
    for b in range(B):
        n = int(seq_lens[b])
        j = torch.arange(n)
        if table is None:
            keys, vals = kc[b, :n], vc[b, :n]
        else:
            pages = table[b][j // page]
            keys, vals = kc[pages, j % page], vc[pages, j % page]
        keys = keys.double().repeat_interleave(group, dim=1)  # [n, Hq, D]: query head h reads kv head h // group
        vals = vals.double().repeat_interleave(group, dim=1)
        s = torch.einsum("thd,jhd->thj", q[b], keys) * scale
        if softcap:
            s = softcap * torch.tanh(s / softcap)
        for t in range(Lq):
            i = n - Lq + t
            visible = j <= i
            if window_left >= 0:
                visible &= j >= i - window_left
            if key_starts is not None:
                visible &= j >= int(key_starts[b])
            logits = s[t][:, visible]  # [Hq, visible keys]
            if sink is not None:
                logits = torch.cat([logits, sink.view(Hq, 1)], dim=1)
            if logits.shape[1] == 0:
                continue  # sees nothing: out 0, lse -inf
            m = logits.amax(dim=1, keepdim=True)
            w = torch.exp(logits - m)
            den = w.sum(dim=1)
            out[b, t] = torch.einsum("hj,jhd->hd", w[:, :int(visible.sum())], vals[visible]) / den.view(Hq, 1)
            lse[b, t] = m.view(Hq) + torch.log(den)
    return out, lse


# ---- helpers ---------------------------------------------------------------------------------------


def close(got: torch.Tensor, want64: torch.Tensor, dtype, what: str):
    """|got - want| <= tol (1 + |want|), want the float64 reference rounded to got's dtype; NaN never passes."""
    tol = TOL[dtype].attn
    want = want64.to(got.dtype).to("cpu", f64)
    g = got.detach().to("cpu", f64)
    assert g.shape == want.shape, f"{what}: shape {tuple(g.shape)} != {tuple(want.shape)}"
    assert torch.isfinite(g).all(), f"{what}: non-finite values"
    err = ((g - want).abs() / (1 + want.abs())).max().item() if g.numel() else 0.0
    assert err <= tol, f"{what}: max error {err:.3e} > {tol:.0e}"


def check_lse(lse, want):
    assert lse.dtype == torch.float32 and lse.shape == want.shape
    lse64, want = lse.detach().cpu().double(), want.cpu()
    inf = torch.isinf(want)
    assert not torch.isnan(lse64).any(), "lse: NaN"
    assert torch.equal(torch.isinf(lse64), inf) and (lse64[inf] < 0).all(), "lse: -inf rows differ"
    err = (lse64[~inf] - want[~inf]).abs().max().item() if (~inf).any() else 0.0
    assert err <= 1e-4 * (1 + want[~inf].abs().max().item() if (~inf).any() else 1), f"lse error {err:.2e}"


def build(case, dtype, device, *, capacity=None):
    """The case's cache (shuffled pages, NaN in every unused row) and q."""
    lens, lq, hq, hk, d, cache = case
    page = 0 if cache in ("p0", "static") else int(cache[1:])
    c = make_cache(lens, hk, d, page, dtype, device, static=cache == "static", capacity=capacity)
    c["q"] = torch.randn(len(lens), lq, hq, d, device=device).to(dtype)
    return c


def make_sinks(v, hq, dtype, device):
    if not v.get("sinks"):
        return None
    s = torch.randn(hq, device=device) * 2
    return s if v["sinks"] == "float32" else s.to(dtype)


def options(v) -> dict:
    return {k: v[k] for k in ("window_left", "softcap", "scale") if k in v}


def run(kf, c, *, sinks=None, **kw):
    """decode_attention with return_lse=True, its outputs' allocator blocks pre-filled with NaN (CUDA)."""
    q = c["q"]
    poison([q.shape], q.dtype, q.device)
    poison([q.shape[:3]], torch.float32, q.device)
    return kf.decode_attention(q, c["k_cache"], c["v_cache"], c["seq_lens"], c["block_table"], sinks=sinks,
                               return_lse=True, **kw)


def want_of(c, *, sinks=None, **kw):
    return reference(c["q"], c["k_cache"], c["v_cache"], c["seq_lens"], c["block_table"], sinks=sinks, **kw)


def cache_row(c, name, b, j):
    """Row j of sequence b of the cache `name` ("k" or "v"), through the block table."""
    cache = c[f"{name}_cache"]
    if c["block_table"] is None:
        return cache[b, j]
    page = cache.shape[1]
    return cache[int(c["block_table"][b, j // page]), j % page]


# ---- values ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("v", VARIANTS, ids=vid)
@pytest.mark.parametrize("case", CASES, ids=case_id)
@pytest.mark.parametrize("device,dtype", DEVICES)
def test_values(kf, device, dtype, case, v):
    if device == "cpu" and dtype != f64 and v not in (VARIANTS[0], VARIANTS[4]):
        pytest.skip("CPU half precision: the plain and q-dtype sinks cases suffice (the reference computes in float64)")
    c = build(case, dtype, device)
    sinks = make_sinks(v, case[2], dtype, device)
    out, lse = run(kf, c, sinks=sinks, **options(v))
    want, want_lse = want_of(c, sinks=sinks, **options(v))
    assert out.shape == c["q"].shape and out.dtype == dtype and out.is_contiguous()
    close(out, want, dtype, "out")
    check_lse(lse, want_lse)


@pytest.mark.parametrize("cache", ["p16", "p0"])
@pytest.mark.parametrize("device,dtype", [CPU] + CUDA)
def test_long_sequence(kf, device, dtype, cache):
    """32768 keys next to a short sequence, GQA 4, with and without a window."""
    c = build(([32768, 5], 1, 8, 2, 128, cache), dtype, device)
    for kw in ({}, {"window_left": 1000}):
        out, lse = run(kf, c, **kw)
        want, want_lse = want_of(c, **kw)
        close(out, want, dtype, f"out {kw}")
        check_lse(lse, want_lse)


@pytest.mark.parametrize("cache", ["p16", "p0"])
@pytest.mark.parametrize("device,dtype", [CPU] + CUDA)
def test_empty_sequences(kf, device, dtype, cache):
    """seq_lens 0 with one new token: out 0 (never NaN), lse -inf; with sinks lse is the sink."""
    c = build(([0, 0, 9], 1, 4, 2, 64, cache), dtype, device)
    out, lse = run(kf, c)
    assert torch.isfinite(out).all() and (out[:2] == 0).all() and not (out[2] == 0).all()
    assert torch.isinf(lse[:2]).all() and (lse[:2] < 0).all() and torch.isfinite(lse[2]).all()
    sinks = torch.tensor([0.5, -1.0, 2.0, 0.0], device=device)
    out, lse = run(kf, c, sinks=sinks)
    assert (out[:2] == 0).all()
    assert torch.equal(lse[:2].cpu(), sinks.cpu().view(1, 1, 4).expand(2, 1, 4))
    want, want_lse = want_of(c, sinks=sinks)
    close(out, want, dtype, "out")
    check_lse(lse, want_lse)


@pytest.mark.parametrize("cache", ["p16", "p1", "static"])
@pytest.mark.parametrize("lq", [1, 4])
@pytest.mark.parametrize("device,dtype", [CPU] + CUDA)
def test_key_starts(kf, device, dtype, lq, cache):
    """A left-padded batch: keys before key_starts[b] are invisible (a start inside the first tile, past
    a tile, at the length: nothing visible, zeros and lse -inf or the sink, and 0); with a window and
    sinks too."""
    c = build(([700, 90, 300, 2049], lq, 8, 2, 128, cache), dtype, device)
    starts = torch.tensor([3, 70, 300, 0], dtype=torch.int32, device=device)
    for kw in ({}, {"window_left": 40}, {"sinks": torch.randn(8, device=device)}):
        out, lse = run(kf, c, key_starts=starts, **kw)
        want, want_lse = want_of(c, key_starts=starts, **kw)
        close(out, want, dtype, f"out {kw}")
        check_lse(lse, want_lse)
    out = run(kf, c, key_starts=starts)[0]
    assert (out[2] == 0).all()  # start == length: the sequence sees nothing
    assert torch.equal(run(kf, c, key_starts=torch.zeros_like(starts))[0], run(kf, c)[0])  # 0: no padding


@pytest.mark.parametrize("lq", [1, 4])
@pytest.mark.parametrize("device,dtype", [CPU] + CUDA)
def test_shared_prefix_pages(kf, device, dtype, lq):
    """A shared prefix (a system prompt, beams, parallel samples): every sequence's block table starts with
    the same physical pages, then its own. One call attends to prefix + suffix; the prefix is stored
    once and each (sequence, kv head) CTA reads it (through L2 when they run together)."""
    page, prefix_pages, hk, hq, d = 16, 5, 2, 8, 128
    c = make_cache([prefix_pages * page + n for n in (1, 9, 40, 3)], hk, d, page, dtype, device)
    table = c["block_table"].clone()
    table[:, :prefix_pages] = table[0, :prefix_pages]  # sequences 1..3 read sequence 0's prefix pages
    c["block_table"] = table
    c["q"] = torch.randn(4, lq, hq, d, device=device).to(dtype)
    out, lse = run(kf, c)
    want, want_lse = want_of(c)
    close(out, want, dtype, "out")
    check_lse(lse, want_lse)
    # the same as each sequence holding a private copy of the prefix
    own = make_cache([prefix_pages * page + n for n in (1, 9, 40, 3)], hk, d, page, dtype, device)
    for b in range(4):
        for j in range(int(c["seq_lens"][b])):
            for name in ("k", "v"):
                p_own = int(own["block_table"][b, j // page])
                own[f"{name}_cache"][p_own, j % page] = cache_row(c, name, b, j)
    own["q"] = c["q"]
    out_own, _ = run(kf, own)
    close(out_own, want, dtype, "out (private prefix copies)")


@pytest.mark.parametrize("device,dtype", [CPU] + CUDA)
def test_strided_inputs_and_no_lse(kf, device, dtype):
    """q a slice of a fused projection [B, Lq, 3, Hq, D], v_cache with strides of its own (a slice of
    a wider pool); without return_lse one output."""
    c = build(([20, 45], 2, 8, 2, 128, "p16"), dtype, device)
    fused = torch.randn(2, 2, 3, 8, 128, device=device).to(dtype)
    q = fused[:, :, 1]
    wide = torch.full((c["v_cache"].shape[0], 16, 4, 128), float("nan"), device=device, dtype=dtype)
    wide[:, :, 1:3] = c["v_cache"]
    v_cache = wide[:, :, 1:3]
    assert v_cache.stride() != c["k_cache"].stride()
    out = kf.decode_attention(q, c["k_cache"], v_cache, c["seq_lens"], c["block_table"])
    assert isinstance(out, torch.Tensor) and out.shape == q.shape and out.is_contiguous()
    want, _ = reference(q, c["k_cache"], v_cache, c["seq_lens"], c["block_table"])
    close(out, want, dtype, "out")


@pytest.mark.parametrize("device,dtype", [CPU] + CUDA)
def test_static_cache_view(kf, device, dtype):
    """transformers' static cache (B, Hkv, max_len, D) through static_cache_view: a view of the same
    memory (no copy), and the reference's result, as the same keys in a dense [B, max_len, Hkv, D] cache."""
    c = build(([30, 64], 3, 8, 2, 64, "static"), dtype, device, capacity=64)
    k, v = static_cache_view(c["k_static"]), static_cache_view(c["v_static"])
    assert k.shape == (2, 64, 2, 64) and k.data_ptr() == c["k_static"].data_ptr() and k.stride() == (8192, 64, 4096, 1)
    want, _ = want_of(c)
    close(kf.decode_attention(c["q"], k, v, c["seq_lens"]), want, dtype, "out (static view)")
    close(kf.decode_attention(c["q"], k.contiguous(), v.contiguous(), c["seq_lens"]), want, dtype, "out (dense)")
    with pytest.raises(ValueError, match="cache must have 4 dimensions"):
        static_cache_view(c["k_static"][0])


def test_default_scale_and_max_seq_len(kf):
    """scale None is 1 / sqrt(D); max_seq_len (a host bound of every length) at or above the longest
    sequence gives the reference's result (CPU: identical)."""
    c = build(([40, 7, 23], 2, 4, 2, 64, "p16"), f64, "cpu")
    base = run(kf, c)[0]
    assert torch.allclose(base, run(kf, c, scale=1 / math.sqrt(64))[0], rtol=0, atol=1e-14)
    for bound in (40, 41, 1000):
        assert torch.equal(run(kf, c, max_seq_len=bound)[0], base)


@pytest.mark.parametrize("device,dtype", CUDA)
def test_max_seq_len_bound_cuda(kf, device, dtype):
    """The key split sized from max_seq_len (the longest length, a larger bound, None: the capacity)."""
    c = build(([3000, 17, 1200], 1, 16, 2, 128, "p16"), dtype, device, capacity=8192)
    want, want_lse = want_of(c)
    for bound in (3000, 5000, None):
        out, lse = run(kf, c, max_seq_len=bound)
        close(out, want, dtype, f"out max_seq_len={bound}")
        check_lse(lse, want_lse)


@pytest.mark.parametrize("case", [CASES[0], CASES[3], CASES[7]], ids=case_id)
def test_spec_reference_agrees(case):
    """The spec's vectorized float64 reference (kforge check's oracle) is this file's, with sinks, a
    window and softcap."""
    c = build(case, f64, "cpu")
    sinks = torch.randn(case[2], dtype=f64)
    for kw in ({}, {"window_left": 3, "softcap": 4.0}):
        want, want_lse = want_of(c, sinks=sinks, **kw)
        got, got_lse = decode_ref(c["q"], c["k_cache"], c["v_cache"], c["seq_lens"], c["block_table"], sinks=sinks,
                                  **kw)
        assert torch.allclose(got, want, rtol=0, atol=1e-12) and torch.allclose(got_lse, want_lse, rtol=0, atol=1e-12)


def test_inference_only(kf):
    """Inputs that require grad: the outputs do not (no graph, no warning at backward time)."""
    c = build(([9, 4], 1, 4, 2, 64, "p16"), f64, "cpu")
    q = c["q"].requires_grad_()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        out, lse = kf.decode_attention(q, c["k_cache"], c["v_cache"], c["seq_lens"], c["block_table"],
                                       return_lse=True)
    assert not out.requires_grad and not lse.requires_grad and out.grad_fn is None


# ---- kv_append -------------------------------------------------------------------------------------


@pytest.mark.parametrize("lq", [1, 4])
@pytest.mark.parametrize("cache", ["p16", "p1", "p0", "static"])
@pytest.mark.parametrize("device,dtype", [CPU, CPU_BF16] + CUDA)
def test_kv_append_then_decode(kf, device, dtype, cache, lq):
    """The rows of the Lq new tokens start as NaN; kv_append writes k, v there and nowhere else (a new
    sequence included: prefix 0), then decode_attention over the grown cache equals the reference."""
    prefix = [10, 0, 37]
    c = build(([n + lq for n in prefix], lq, 8, 2, 64, cache), dtype, device)
    new = [(b, n + t) for b, n in enumerate(prefix) for t in range(lq)]
    kv = {name: torch.stack([cache_row(c, name, b, j).clone() for b, j in new]).view(3, lq, 2, 64)
          for name in ("k", "v")}
    for name in ("k", "v"):
        for b, j in new:
            cache_row(c, name, b, j).fill_(float("nan"))
    expected = dict(c, k_cache=c["k_cache"].clone(), v_cache=c["v_cache"].clone())
    for name in ("k", "v"):
        for i, (b, j) in enumerate(new):
            cache_row(expected, name, b, j).copy_(kv[name].view(-1, 2, 64)[i])
    kf.kv_append(c["k_cache"], c["v_cache"], kv["k"], kv["v"], c["seq_lens"], c["block_table"])
    for name in ("k_cache", "v_cache"):
        got, want = c[name], expected[name]
        assert torch.equal(got.isnan(), want.isnan()) and torch.equal(got.nan_to_num(), want.nan_to_num()), \
            f"{name}: kv_append wrote other rows than the new ones, or other values"
    out, lse = run(kf, c)
    want, want_lse = want_of(c)
    close(out, want, dtype, "out")
    check_lse(lse, want_lse)


@pytest.mark.parametrize("device,dtype", [CPU] + CUDA)
def test_kv_append_skips_empty_slots(kf, device, dtype):
    """seq_lens 0 (an empty batch slot) writes nothing; the other sequences get their row."""
    c = build(([0, 5], 1, 4, 2, 64, "p16"), dtype, device)
    before = c["k_cache"].clone()
    k = torch.randn(2, 1, 2, 64, device=device).to(dtype)
    kf.kv_append(c["k_cache"], c["v_cache"], k, k, c["seq_lens"], c["block_table"])
    assert torch.equal(cache_row(c, "k", 1, 4), k[1, 0])
    cache_row(c, "k", 1, 4).copy_(before[int(c["block_table"][1, 0]), 4])
    assert torch.equal(c["k_cache"].nan_to_num(), before.nan_to_num())


# ---- errors ----------------------------------------------------------------------------------------

ERR = (RuntimeError, ValueError)


def valid(dtype=f64, page=16, hq=4, hk=2, d=64, lq=1):
    c = make_cache([9, 20], hk, d, page, dtype, "cpu")
    c["q"] = torch.randn(2, lq, hq, d).to(dtype)
    return c


def call(kf, c, **over):
    a = {k: c[k] for k in ("q", "k_cache", "v_cache", "seq_lens", "block_table")}
    kw = {k: over.pop(k) for k in list(over) if k not in a}
    a.update(over)
    return kf.decode_attention(a["q"], a["k_cache"], a["v_cache"], a["seq_lens"], a["block_table"], **kw)


def test_errors_decode_attention(kf):
    c = valid()
    with pytest.raises(ValueError, match=r"q must have 4 dimensions \[B, Lq, Hq, D\]"):
        call(kf, c, q=c["q"][0])
    with pytest.raises(ERR, match="k_cache"):
        call(kf, c, k_cache=c["k_cache"][0])
    with pytest.raises(ERR, match="v_cache"):
        call(kf, c, v_cache=c["v_cache"][..., :32])
    b = valid(torch.bfloat16)
    with pytest.raises(ERR, match="k_cache"):
        call(kf, b, k_cache=b["k_cache"].half())
    with pytest.raises(ERR, match="head dim"):
        call(kf, valid(d=80))
    with pytest.raises(ERR, match="heads"):
        call(kf, valid(hq=6, hk=4))
    with pytest.raises(ERR, match="seq_lens"):
        call(kf, c, seq_lens=c["seq_lens"].long())
    with pytest.raises(ERR, match="seq_lens"):
        call(kf, c, seq_lens=c["seq_lens"][:1])
    with pytest.raises(ERR, match="block_table"):
        call(kf, c, block_table=c["block_table"].long())
    with pytest.raises(ERR, match="block_table"):
        call(kf, c, block_table=c["block_table"][0])
    odd = make_cache([9, 20], 2, 64, 16, f64, "cpu")
    with pytest.raises(ERR, match="page size"):
        call(kf, c, k_cache=odd["k_cache"][:, :12], v_cache=odd["v_cache"][:, :12])
    with pytest.raises(ERR, match="sinks"):
        call(kf, c, sinks=torch.zeros(3))
    with pytest.raises(ERR, match=r"key_starts must have shape \[2\]"):
        call(kf, c, key_starts=torch.zeros(3, dtype=torch.int32))
    with pytest.raises(ERR, match="key_starts must be int32"):
        call(kf, c, key_starts=torch.zeros(2, dtype=torch.int64))
    with pytest.raises(ValueError, match=r"key_starts\[1\] = 21 is outside \[0, seq_lens\[1\]\]"):
        call(kf, c, key_starts=torch.tensor([0, 21], dtype=torch.int32), check=True)
    with pytest.raises(ValueError, match="scale must be a finite value > 0"):
        call(kf, c, scale=0.0)
    with pytest.raises(ERR, match="window_left"):
        call(kf, c, window_left=-2)


def test_errors_kv_append(kf):
    c = valid()
    k = torch.randn(2, 1, 2, 64, dtype=f64)
    with pytest.raises(ERR, match=r"\bk\b"):
        kf.kv_append(c["k_cache"], c["v_cache"], k[0], k, c["seq_lens"], c["block_table"])
    with pytest.raises(ERR, match=r"\bv\b|dtype"):
        kf.kv_append(c["k_cache"], c["v_cache"], k, k.float(), c["seq_lens"], c["block_table"])
    with pytest.raises(ERR, match="seq_lens"):
        kf.kv_append(c["k_cache"], c["v_cache"], k, k, c["seq_lens"].long(), c["block_table"])
    with pytest.raises(ERR, match="block_table"):
        kf.kv_append(c["k_cache"], c["v_cache"], k, k, c["seq_lens"], c["block_table"].long())


@pytest.mark.parametrize("device,dtype", [CPU, CUDA[0]])
def test_check_flag(kf, device, dtype):
    """check=True reads seq_lens and block_table on the host: lengths above the capacity or below Lq
    (0 allowed: an empty slot) and used block-table entries outside [0, P) are ValueErrors naming the
    argument; unused entries may hold anything."""
    c = make_cache([9, 20], 2, 64, 16, dtype, device, capacity=32)  # 2 pages of 16
    P = c["k_cache"].shape[0]
    q = torch.randn(2, 2, 4, 64, device=device).to(dtype)
    ok = kf.decode_attention(q, c["k_cache"], c["v_cache"], c["seq_lens"], c["block_table"], check=True)
    close(ok, want_of(dict(c, q=q))[0], dtype, "out")

    def dec(lens=None, table=None, qq=q):
        lens = c["seq_lens"] if lens is None else torch.tensor(lens, dtype=torch.int32, device=device)
        table = c["block_table"] if table is None else table
        return kf.decode_attention(qq, c["k_cache"], c["v_cache"], lens, table, check=True)

    with pytest.raises(ValueError, match=r"seq_lens\[1\] = 33"):
        dec([9, 33])
    with pytest.raises(ValueError, match=r"seq_lens\[0\] = -1"):
        dec([-1, 20])
    with pytest.raises(ValueError, match=r"seq_lens\[0\] = 1 .*below"):
        dec([1, 20])
    dec([0, 20])  # an empty slot
    for bad in (-1, P):
        table = c["block_table"].clone()
        table[1, 1] = bad
        with pytest.raises(ValueError, match=r"block_table\[1, 1\]"):
            dec(table=table)
        table = c["block_table"].clone()
        table[0, 1] = bad  # sequence 0 (9 keys) uses page 0 only
        close(dec(table=table), want_of(dict(c, q=q, block_table=table))[0], dtype, "out")
    # contiguous: the capacity is the cache length
    d = make_cache([9, 20], 2, 64, 0, dtype, device, capacity=24)
    with pytest.raises(ValueError, match=r"seq_lens\[1\] = 25 .*capacity"):
        kf.decode_attention(q, d["k_cache"], d["v_cache"], torch.tensor([9, 25], dtype=torch.int32, device=device),
                            check=True)
    # kv_append checks the pages it writes: sequence 1 (20 keys after the append) writes row 19, page 1
    k = torch.randn(2, 1, 2, 64, device=device).to(dtype)
    table = c["block_table"].clone()
    table[1, 0] = -1
    kf.kv_append(c["k_cache"], c["v_cache"], k, k, c["seq_lens"], table, check=True)
    with pytest.raises(ValueError, match=r"block_table\[1, 0\]"):
        kf.decode_attention(q[:, :1], c["k_cache"], c["v_cache"], c["seq_lens"], table, check=True)
    table[1, 1] = P
    with pytest.raises(ValueError, match=r"kv_append: block_table\[1, 1\]"):
        kf.kv_append(c["k_cache"], c["v_cache"], k, k, c["seq_lens"], table, check=True)
    with pytest.raises(ValueError, match=r"kv_append: seq_lens\[0\] = 33"):
        kf.kv_append(c["k_cache"], c["v_cache"], k, k, torch.tensor([33, 1], dtype=torch.int32, device=device),
                     check=True)


# ---- torch.compile, CUDA graphs, opcheck ----------------------------------------------------------

COMPILE_DEVICES = [pytest.param("cpu", f64, id="cpu-float64"), CUDA[0]]


@pytest.mark.parametrize("device,dtype", COMPILE_DEVICES)
@torch._dynamo.config.patch(error_on_recompile=True)
def test_compile_fullgraph_no_recompile(kf, fresh_dynamo, device, dtype):
    """torch.compile(fullgraph=True) of a function calling decode_attention: the fake impl's shapes, no
    graph break, and one compilation for any seq_lens values (read on the device only)."""
    c = make_cache([64, 64], 2, 64, 16, dtype, device, capacity=64)
    sinks = torch.randn(8, device=device)
    q = torch.randn(2, 2, 8, 64, device=device).to(dtype)

    def f(q, k_cache, v_cache, seq_lens, block_table):
        out, lse = kf.decode_attention(q, k_cache, v_cache, seq_lens, block_table, window_left=30, softcap=20.0,
                                       sinks=sinks, return_lse=True)
        return out * 2, lse

    g = torch.compile(f, fullgraph=True)
    for lens in ([64, 9], [33, 2], [5, 64]):
        seq_lens = torch.tensor(lens, dtype=torch.int32, device=device)
        out, lse = g(q, c["k_cache"], c["v_cache"], seq_lens, c["block_table"])
        want, want_lse = reference(q, c["k_cache"], c["v_cache"], seq_lens, c["block_table"], window_left=30,
                                   softcap=20.0, sinks=sinks)
        assert out.dtype == dtype and lse.dtype == torch.float32
        close(out / 2, want, dtype, f"out {lens}")
        check_lse(lse, want_lse)


@pytest.mark.parametrize("device,dtype", COMPILE_DEVICES)
def test_compile_decode_step_with_kv_append(kf, fresh_dynamo, device, dtype):
    """A whole decode step (kv_append, then decode_attention) compiled with fullgraph=True: the cache
    mutation is kept and the output is the reference's on the grown cache."""
    c = make_cache([40, 12], 2, 64, 16, dtype, device, capacity=64)
    q = torch.randn(2, 1, 4, 64, device=device).to(dtype)
    k = torch.randn(2, 1, 2, 64, device=device).to(dtype)
    v = torch.randn(2, 1, 2, 64, device=device).to(dtype)
    seq_lens = torch.tensor([41, 13], dtype=torch.int32, device=device)

    @torch.compile(fullgraph=True)
    def step(q, k, v, k_cache, v_cache, seq_lens, block_table):
        kf.kv_append(k_cache, v_cache, k, v, seq_lens, block_table)
        return kf.decode_attention(q, k_cache, v_cache, seq_lens, block_table)

    out = step(q, k, v, c["k_cache"], c["v_cache"], seq_lens, c["block_table"])
    c["seq_lens"] = seq_lens
    assert torch.equal(cache_row(c, "k", 0, 40), k[0, 0]) and torch.equal(cache_row(c, "v", 1, 12), v[1, 0])
    close(out, want_of(dict(c, q=q))[0], dtype, "out")


@pytest.mark.cuda
def test_cuda_graph_replay_new_lengths(kf):
    """A decode step (kv_append, decode_attention) captured once into a CUDA graph replays for new
    seq_lens and new q, k, v: no host read of the lengths, the workspace from the graph's pool."""
    dtype, device = torch.bfloat16, "cuda"
    c = make_cache([256, 256, 256], 2, 128, 16, dtype, device, capacity=256)
    lq = 4
    q = torch.randn(3, lq, 8, 128, device=device).to(dtype)
    k = torch.randn(3, lq, 2, 128, device=device).to(dtype)
    v = torch.randn_like(k)
    seq_lens = torch.tensor([100, 7, 256], dtype=torch.int32, device=device)

    def step():
        kf.kv_append(c["k_cache"], c["v_cache"], k, v, seq_lens, c["block_table"])
        return kf.decode_attention(q, c["k_cache"], c["v_cache"], seq_lens, c["block_table"], return_lse=True)

    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        step()  # warm up (allocator, plan)
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out, lse = step()
    for lens in ([256, 4, 129], [31, 200, 8]):
        seq_lens.copy_(torch.tensor(lens, dtype=torch.int32))
        for t in (q, k, v):
            t.copy_(torch.randn_like(t, dtype=torch.float32).to(dtype))
        graph.replay()
        torch.cuda.synchronize()
        cc = dict(c, seq_lens=seq_lens)
        for b, n in enumerate(lens):
            assert torch.equal(cache_row(cc, "k", b, n - 1), k[b, lq - 1])
        want, want_lse = want_of(dict(cc, q=q))
        close(out, want, dtype, f"out {lens}")
        check_lse(lse, want_lse)


@pytest.mark.parametrize("device,dtype", [CPU, CUDA[0]])
def test_opcheck(kf, device, dtype):
    ops = torch.ops.kernelforge
    c = make_cache([9, 20], 2, 64, 16, dtype, device)
    q = torch.randn(2, 2, 4, 64, device=device).to(dtype)
    sinks = torch.randn(4, device=device)
    for bt, ret in ((c["block_table"], True), (c["block_table"], False)):
        torch.library.opcheck(ops.decode_attention.default, (q, c["k_cache"], c["v_cache"], c["seq_lens"], bt),
                              dict(scale=None, window_left=4, softcap=0.0, sinks=sinks, max_seq_len=0,
                                   return_lse=ret))
    d = make_cache([9, 20], 2, 64, 0, dtype, device)
    torch.library.opcheck(ops.decode_attention.default, (q, d["k_cache"], d["v_cache"], d["seq_lens"], None),
                          dict(scale=0.1, window_left=-1, softcap=5.0, sinks=None, max_seq_len=20, return_lse=True))
    k = torch.randn(2, 2, 2, 64, device=device).to(dtype)
    torch.library.opcheck(ops.kv_append.default,
                          (c["k_cache"].clone(), c["v_cache"].clone(), k, k, c["seq_lens"], c["block_table"]))


# ---- rope_kv_append --------------------------------------------------------------------------------


def hf_tables(max_pos, rd, dtype, device, base=10000.0):
    """cos, sin [max_pos, rd] as HF's rotary embedding computes them for positions 0 .. max_pos - 1:
    inv_freq = base^(-2i / rd), emb = cat(freqs, freqs) (both halves equal), float32 then cast."""
    inv = 1.0 / (base ** (torch.arange(0, rd, 2, dtype=torch.float32) / rd))
    freqs = torch.arange(max_pos, dtype=torch.float32).view(-1, 1) * inv.view(1, -1)
    emb = torch.cat([freqs, freqs], dim=-1)
    return emb.cos().to(device, dtype), emb.sin().to(device, dtype)


def rope_append_composed(kf, q, k, v, cos, sin, c):
    """apply_rope at the new tokens' positions, then kv_append of the rotated k: the unfused path."""
    lq = q.shape[1]
    pos = c["seq_lens"].long().view(-1, 1) - lq + torch.arange(lq, device=q.device).view(1, -1)
    pos = pos.clamp(0, cos.shape[0] - 1)
    q_rot, k_rot = kf.apply_rope(q, k, cos, sin, position_ids=pos)
    kf.kv_append(c["k_cache"], c["v_cache"], k_rot, v, c["seq_lens"], c["block_table"])
    return q_rot


def same_bits(a, b):
    return torch.equal(a.isnan(), b.isnan()) and torch.equal(a.nan_to_num(), b.nan_to_num())


@pytest.mark.parametrize("rd", [64, 32])
@pytest.mark.parametrize("cs_dtype", ["float32", "dtype"])
@pytest.mark.parametrize("lq", [1, 4])
@pytest.mark.parametrize("cache", ["p16", "p1", "p0", "static"])
@pytest.mark.parametrize("device,dtype", [CPU, CPU_BF16] + CUDA)
def test_rope_kv_append_equals_apply_rope_then_kv_append(kf, device, dtype, cache, lq, cs_dtype, rd):
    """The fused op against apply_rope + kv_append on the same inputs: q_out and both caches bit for bit
    (CPU: the same float64 formula rounded once; CUDA: the same float32 fmaf chain), a new sequence
    (prefix 0) included, GQA 8 / 2, rotary_dim = D and D / 2, float32 and q-dtype tables."""
    prefix = [10, 0, 37]
    c = build(([n + lq for n in prefix], lq, 8, 2, 64, cache), dtype, device)
    fused = dict(c, k_cache=c["k_cache"].clone(), v_cache=c["v_cache"].clone())
    q, k, v = (torch.randn(3, lq, h, 64, device=device).to(dtype) for h in (8, 2, 2))
    cos, sin = hf_tables(c["capacity"], rd, torch.float32 if cs_dtype == "float32" else dtype, device)
    q_in = q.clone()
    poison([q.shape], dtype, device)
    q_out = kf.rope_kv_append(q, k, v, cos, sin, fused["k_cache"], fused["v_cache"], c["seq_lens"], c["block_table"],
                              check=True)
    assert q_out.shape == q.shape and q_out.dtype == dtype and q_out.is_contiguous()
    assert torch.equal(q, q_in), "q was written"
    want_q = rope_append_composed(kf, q, k, v, cos, sin, c)
    assert torch.equal(q_out, want_q)
    for name in ("k_cache", "v_cache"):
        assert same_bits(fused[name], c[name]), f"{name} differs from apply_rope + kv_append"


@pytest.mark.parametrize("device,dtype", [CPU] + CUDA)
def test_rope_kv_append_hf_formula(kf, device, dtype):
    """HF's apply_rotary_pos_emb in float64 (q * cos + rotate_half(q) * sin on the first rotary_dim
    columns, the rest concatenated unchanged, as partial-rotary models do) with the cos / sin rows of
    the positions seq_lens - Lq + t; the cache rows hold k's rotation and v."""
    lq, rd, page = 3, 32, 16
    c = make_cache([n + lq for n in (5, 20)], 2, 64, page, dtype, device)
    q, k, v = (torch.randn(2, lq, h, 64, device=device).to(dtype) for h in (4, 2, 2))
    cos, sin = hf_tables(c["capacity"], rd, torch.float32, device)
    q_out = kf.rope_kv_append(q, k, v, cos, sin, c["k_cache"], c["v_cache"], c["seq_lens"], c["block_table"])
    pos = c["seq_lens"].long().cpu().view(-1, 1) - lq + torch.arange(lq).view(1, -1)
    cs, sn = cos.cpu().double()[pos].unsqueeze(2), sin.cpu().double()[pos].unsqueeze(2)  # [B, Lq, 1, rd]

    def hf(x):
        x = x.cpu().double()
        xr, xp = x[..., :rd], x[..., rd:]
        rot = torch.cat([-xr[..., rd // 2:], xr[..., :rd // 2]], dim=-1)
        return torch.cat([xr * cs + rot * sn, xp], dim=-1)

    tol = 0 if dtype == f64 else TOL[dtype].out
    want_q, want_k = hf(q), hf(k)
    assert torch.allclose(q_out.cpu().double(), want_q.to(dtype).double(), rtol=tol, atol=tol)
    for b in range(2):
        for t in range(lq):
            j = int(pos[b, t])
            assert torch.allclose(cache_row(c, "k", b, j).cpu().double(), want_k[b, t].to(dtype).double(), rtol=tol,
                                  atol=tol)
            assert torch.equal(cache_row(c, "v", b, j), v[b, t])


@pytest.mark.parametrize("device,dtype", [CPU] + CUDA)
def test_rope_kv_append_out_of_range(kf, device, dtype):
    """An empty slot (seq_lens 0) writes no cache row and rotates q by position 0 (the identity); a
    position past the table reads its last row; a length past the capacity writes nothing. check=True
    reports the last two."""
    c = make_cache([0, 5, 3], 2, 64, 16, dtype, device, capacity=32)
    lens = torch.tensor([0, 5, 40], dtype=torch.int32, device=device)
    q, k, v = (torch.randn(3, 1, h, 64, device=device).to(dtype) for h in (4, 2, 2))
    cos, sin = hf_tables(4, 64, torch.float32, device)  # positions 0 .. 3
    before = c["k_cache"].clone()
    q_out = kf.rope_kv_append(q, k, v, cos, sin, c["k_cache"], c["v_cache"], lens, c["block_table"])
    assert torch.equal(q_out[0], q[0])  # position -1 -> row 0: cos 1, sin 0
    clamped = kf.apply_rope(q[1:2], None, cos, sin, position_ids=torch.tensor([[3]], device=device))[0]
    assert torch.equal(q_out[1:2], clamped)  # position 4 -> row 3
    written = cache_row(dict(c, seq_lens=lens), "k", 1, 4).clone()
    cache_row(dict(c, seq_lens=lens), "k", 1, 4).copy_(before[int(c["block_table"][1, 0]), 4])
    assert same_bits(c["k_cache"], before), "rows other than sequence 1's new one changed"
    assert torch.isfinite(written).all()
    with pytest.raises(ValueError, match=r"rope_kv_append: seq_lens\[2\] = 40 is outside \[0, 32\]"):
        kf.rope_kv_append(q, k, v, cos, sin, c["k_cache"], c["v_cache"], lens, c["block_table"], check=True)
    with pytest.raises(ValueError, match=r"rope_kv_append: seq_lens\[1\] = 5 puts new tokens at positions up to 4, "
                                         r"past the 4 rows of cos / sin"):
        kf.rope_kv_append(q[:2], k[:2], v[:2], cos, sin, c["k_cache"], c["v_cache"], lens[:2].contiguous(),
                          c["block_table"][:2], check=True)


def test_errors_rope_kv_append(kf):
    c = valid()
    q, k = torch.randn(2, 1, 4, 64, dtype=f64), torch.randn(2, 1, 2, 64, dtype=f64)
    cos, sin = hf_tables(32, 64, f64, "cpu")

    def call(**over):
        a = dict(q=q, k=k, v=k, cos=cos, sin=sin, k_cache=c["k_cache"], v_cache=c["v_cache"],
                 seq_lens=c["seq_lens"], block_table=c["block_table"])
        a.update(over)
        return kf.rope_kv_append(**a)

    with pytest.raises(ERR, match=r"rope_kv_append: q must have 4 dimensions"):
        call(q=q[0])
    with pytest.raises(ERR, match=r"q must have k's batch, new tokens and head dim \[2, 1, Hq, 64\]"):
        call(q=torch.randn(2, 2, 4, 64, dtype=f64))
    with pytest.raises(ERR, match="q must have k's dtype"):
        call(q=q.float())
    with pytest.raises(ERR, match=r"cos must have 2 dimensions \[max_pos, rotary_dim\]"):
        call(cos=cos[0])
    with pytest.raises(ERR, match="sin must have cos's shape"):
        call(sin=sin[:, :32])
    with pytest.raises(ERR, match=r"rotary_dim \(dimension 1\) must be even and within \[2, 64\]"):
        call(cos=cos[:, :5], sin=sin[:, :5])
    with pytest.raises(ERR, match="cos must be float32 or q's dtype"):
        call(cos=cos.half(), sin=sin.half())
    with pytest.raises(ERR, match="rope_kv_append: seq_lens must be int32"):
        call(seq_lens=c["seq_lens"].long())
    with pytest.raises(ERR, match="rope_kv_append: v must have k's shape"):
        call(v=k[..., :32])
    skew = sin.clone()
    skew[:, 40:] += 1.0
    with pytest.raises(ValueError, match=r"rope_kv_append: sin must hold HF's layout"):
        kf.rope_kv_append(q, k, k, cos, skew, c["k_cache"], c["v_cache"], c["seq_lens"], c["block_table"], check=True)


def test_rope_kv_append_inference_only(kf):
    c = valid()
    q = torch.randn(2, 1, 4, 64, dtype=f64, requires_grad=True)
    k = torch.randn(2, 1, 2, 64, dtype=f64)
    cos, sin = hf_tables(32, 64, f64, "cpu")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        out = kf.rope_kv_append(q, k, k, cos, sin, c["k_cache"], c["v_cache"], c["seq_lens"], c["block_table"])
    assert not out.requires_grad and out.grad_fn is None


@pytest.mark.parametrize("device,dtype", COMPILE_DEVICES)
def test_compile_rope_kv_append_step(kf, fresh_dynamo, device, dtype):
    """A decode step (rope_kv_append, then decode_attention) compiled with fullgraph=True: the fake impl,
    the cache mutation kept, the same result as eager."""
    c = make_cache([40, 12], 2, 64, 16, dtype, device, capacity=64)
    eager = dict(c, k_cache=c["k_cache"].clone(), v_cache=c["v_cache"].clone())
    q, k, v = (torch.randn(2, 1, h, 64, device=device).to(dtype) for h in (4, 2, 2))
    cos, sin = hf_tables(64, 64, torch.float32, device)
    seq_lens = torch.tensor([41, 13], dtype=torch.int32, device=device)

    def step(q, k, v, k_cache, v_cache, seq_lens, block_table):
        q = kf.rope_kv_append(q, k, v, cos, sin, k_cache, v_cache, seq_lens, block_table)
        return kf.decode_attention(q, k_cache, v_cache, seq_lens, block_table)

    got = torch.compile(step, fullgraph=True)(q, k, v, c["k_cache"], c["v_cache"], seq_lens, c["block_table"])
    want = step(q, k, v, eager["k_cache"], eager["v_cache"], seq_lens, c["block_table"])
    assert torch.equal(got, want)
    assert same_bits(c["k_cache"], eager["k_cache"]) and same_bits(c["v_cache"], eager["v_cache"])


@pytest.mark.parametrize("device,dtype", [CPU, CUDA[0]])
def test_opcheck_rope_kv_append(kf, device, dtype):
    c = make_cache([9, 20], 2, 64, 16, dtype, device)
    q = torch.randn(2, 2, 4, 64, device=device).to(dtype)
    k = torch.randn(2, 2, 2, 64, device=device).to(dtype)
    cos, sin = hf_tables(32, 32, torch.float32, device)
    torch.library.opcheck(torch.ops.kernelforge.rope_kv_append.default,
                          (q, k, k, cos, sin, c["k_cache"].clone(), c["v_cache"].clone(), c["seq_lens"],
                           c["block_table"]))
    d = make_cache([9, 20], 2, 64, 0, dtype, device)
    torch.library.opcheck(torch.ops.kernelforge.rope_kv_append.default,
                          (q, k, k, cos.to(dtype), sin.to(dtype), d["k_cache"].clone(), d["v_cache"].clone(),
                           d["seq_lens"], None))


# ---- prefetch_l2 ---------------------------------------------------------------------------------------------


def test_prefetch_l2_errors_cpu(kf):
    """A CPU tensor has no L2 to fill: ValueError naming the device, whatever the range."""
    t = torch.zeros(10)
    for args in [(t,), (t, 8), (t, 4, 36), (t, 0)]:
        with pytest.raises(ValueError, match="prefetch_l2: t must be a CUDA tensor"):
            kf.prefetch_l2(*args)


@pytest.mark.cuda
def test_prefetch_l2_writes_nothing(kf):
    """Ranges of every size class (under one 16-byte word, one per-thread chunk and its neighbours, many
    chunks) at unaligned offsets: the memory keeps its bytes (NaN poison included), in a stream and in a
    CUDA graph replayed three times; a following read sees the same values."""
    buf = torch.empty(3 * 2**20 + 37, dtype=torch.uint8, device="cuda")
    buf.random_(0, 256)
    buf[:4096] = 0xFF  # NaN bytes in every float dtype
    want = buf.clone()
    cases = [(0, 1), (7, 9), (3, 16), (1, 16383), (5, 16384), (16380, 16389), (11, 2**20 + 3), (0, buf.numel()),
             (buf.numel() - 17, 17), (buf.numel(), 0)]
    for off, n in cases:
        kf.prefetch_l2(buf, n, off)
    kf.prefetch_l2(buf)  # the rest of the tensor from offset 0
    kf.prefetch_l2(buf[1:].view(-1), None, 1)  # an unaligned base
    torch.cuda.synchronize()
    assert torch.equal(buf, want)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        kf.prefetch_l2(buf, 2**20, 13)
        kf.prefetch_l2(buf[: 2**20].view(torch.float16)[1:], 4096)
    for _ in range(3):
        g.replay()
    torch.cuda.synchronize()
    assert torch.equal(buf, want)
    f = buf[: 2**20].view(torch.float32)
    kf.prefetch_l2(f)
    assert torch.equal(f.clone().view(torch.uint8), want[: 2**20])  # a copy kernel reads the prefetched lines


@pytest.mark.cuda
def test_prefetch_l2_errors_cuda(kf):
    """A range outside the bytes the tensor spans and a negative size: ValueError naming the argument and the
    expectation. A strided view's span is its first element to its last: a transpose spans its base, a
    column of a padded matrix from its first row to its last."""
    t = torch.zeros(16, 8, device="cuda", dtype=torch.float16)  # 256 bytes
    for view, span in [(t, 256), (t.t(), 256), (t[:, 3], 2 * (15 * 8 + 1)), (t[2:5, :4], 2 * (2 * 8 + 4))]:
        for nbytes, offset in [(span + 1, 0), (1, span), (-1, 0), (8, -8), (span - 6, 10)]:
            with pytest.raises(ValueError, match=rf"the range \[offset, offset \+ nbytes\).* inside the {span} "
                                                 "bytes t spans"):
                kf.prefetch_l2(view, nbytes, offset)
        kf.prefetch_l2(view)  # the whole span
        kf.prefetch_l2(view, 0, span)  # an empty range at the end: nothing to do
    kf.prefetch_l2(torch.empty(0, device="cuda"))
    torch.cuda.synchronize()
    assert not t.any()


# ---- a caller's workspace -------------------------------------------------------------------------------------


def test_decode_workspace_cpu(kf):
    """On the CPU (the float64 reference) no workspace is needed: decode_workspace is empty and a workspace
    passed to decode_attention changes nothing."""
    c = make_cache([9, 20], 2, 64, 16, f64, "cpu")
    q = torch.randn(2, 1, 4, 64, dtype=f64)
    ws = kf.decode_workspace(q, c["k_cache"], c["v_cache"], c["seq_lens"], c["block_table"])
    assert ws.numel() == 0 and ws.dtype == torch.uint8
    want = kf.decode_attention(q, c["k_cache"], c["v_cache"], c["seq_lens"], c["block_table"])
    got = kf.decode_attention(q, c["k_cache"], c["v_cache"], c["seq_lens"], c["block_table"], workspace=ws)
    assert torch.equal(got, want)


@pytest.mark.cuda
@pytest.mark.parametrize("page", [16, 0])
def test_cuda_workspace_reused(kf, page):
    """A split plan (one sequence of 8k keys: every SM on its keys) with one workspace from decode_workspace
    for five calls at new lengths, q, return_lse and key_starts: the same bits as calls with their own
    workspaces, and the merge counters (the first 256 bytes) zero after each call; in a CUDA graph
    captured once with it, replays for new lengths agree with eager calls."""
    dtype, device = torch.bfloat16, "cuda"
    c = make_cache([8192, 5000], 2, 128, page, dtype, device, capacity=8192)
    q = torch.randn(2, 1, 8, 128, device=device).to(dtype)
    args = (c["k_cache"], c["v_cache"], c["seq_lens"], c["block_table"])
    ws = kf.decode_workspace(q, *args, max_seq_len=8192)
    assert ws.numel() > 256 and not ws.any()
    ws[256:] = 0xFF  # the partial results need no initial value: poison them
    starts = torch.tensor([3, 0], dtype=torch.int32, device=device)
    for lens in ([8192, 5000], [1, 8000], [4097, 0], [8192, 8192], [77, 3]):
        c["seq_lens"].copy_(torch.tensor(lens, dtype=torch.int32))
        q.copy_(torch.randn_like(q, dtype=torch.float32).to(dtype))
        for kw in (dict(), dict(return_lse=True), dict(key_starts=starts)):
            want = kf.decode_attention(q, *args, max_seq_len=8192, **kw)
            got = kf.decode_attention(q, *args, max_seq_len=8192, workspace=ws, **kw)
            torch.cuda.synchronize()
            for a, b in zip(got if isinstance(got, tuple) else (got,), want if isinstance(want, tuple) else (want,)):
                assert same_bits(a, b), (lens, kw)
            assert not ws[:256].any(), "the merge counters must be zero after a completed call"
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = kf.decode_attention(q, *args, max_seq_len=8192, workspace=ws)
    for lens in ([6000, 12], [8192, 4096]):
        c["seq_lens"].copy_(torch.tensor(lens, dtype=torch.int32))
        graph.replay()
        torch.cuda.synchronize()
        assert same_bits(out, kf.decode_attention(q, *args, max_seq_len=8192)), lens
        assert not ws[:256].any()


@pytest.mark.cuda
def test_cuda_workspace_errors(kf):
    """Too small a workspace, one on another device, a non-contiguous one: ValueError naming the workspace and
    what it must be."""
    dtype, device = torch.bfloat16, "cuda"
    c = make_cache([8192], 2, 128, 16, dtype, device, capacity=8192)
    q = torch.randn(1, 1, 8, 128, device=device).to(dtype)
    args = (c["k_cache"], c["v_cache"], c["seq_lens"], c["block_table"])
    ws = kf.decode_workspace(q, *args)
    assert ws.numel() > 0
    with pytest.raises(ValueError, match=r"workspace holds \d+ bytes, the plan decode.* needs \d+"):
        kf.decode_attention(q, *args, workspace=ws[: ws.numel() - 1])
    with pytest.raises(ValueError, match="workspace must be a tensor on q's device"):
        kf.decode_attention(q, *args, workspace=ws.cpu())
    with pytest.raises(ValueError, match="workspace must be contiguous"):
        kf.decode_attention(q, *args, workspace=torch.zeros(2 * ws.numel(), dtype=torch.uint8, device=device)[::2])


@pytest.mark.cuda
def test_cuda_opcheck_workspace(kf):
    c = make_cache([3000, 20], 2, 64, 16, torch.bfloat16, "cuda", capacity=4096)
    q = torch.randn(2, 1, 4, 64, device="cuda").to(torch.bfloat16)
    args = (q, c["k_cache"], c["v_cache"], c["seq_lens"], c["block_table"])
    kw = dict(scale=None, window_left=-1, softcap=0.0, sinks=None, max_seq_len=4096, return_lse=True)
    ws = kf.decode_workspace(*args, max_seq_len=4096, return_lse=True)
    torch.library.opcheck(torch.ops.kernelforge.decode_attention.default, args, dict(kw, workspace=ws))
