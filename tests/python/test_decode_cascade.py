"""kernelforge.merge_attention_states and kernelforge.cascade_decode_attention against float64
references written here from their formulas (include/kernelforge/decode.h, python/kernelforge/decode.py).

merge_attention_states: per row and head, m = max(lse_a, lse_b), out = (e^(lse_a - m) o_a + e^(lse_b -
m) o_b) / (e^(lse_a - m) + e^(lse_b - m)), lse = m + log(...); a -inf side contributes nothing (its o
holds NaN here), both -inf give 0 and -inf. CPU tensors run the op's float64 C++ reference; CUDA tensors
(float16 / bfloat16 / float32) the kernel, with the outputs' allocator blocks pre-filled with NaN.

cascade_decode_attention: every sequence's keys are the shared prefix (positions 0 .. P - 1) then its
own suffix; new token t of sequence b sees the whole prefix and the suffix keys j <= seq_lens[b] - Lq + t.
Checked against that formula in float64 and against decode_attention over each sequence's concatenated
[prefix; suffix] cache (the same keys stored per sequence), with page sizes 1 and 16, Lq 1 and 4, GQA 32/8
and 8/8, batch 1 and 5 with ragged suffix lengths including 0.
"""

from __future__ import annotations

import math

import pytest
import torch

from kernelforge.specs import TOL
from kernelforge.specs._spec import poison
from kernelforge.specs.decode import cascade_ref, make_cache

f64 = torch.float64
CPU = pytest.param("cpu", f64, id="cpu-float64")
CPU_BF16 = pytest.param("cpu", torch.bfloat16, id="cpu-bfloat16")
CUDA = [pytest.param("cuda", dt, id=f"cuda-{str(dt)[6:]}") for dt in (torch.bfloat16, torch.float16)]
CUDA_F32 = pytest.param("cuda", torch.float32, id="cuda-float32")
ERR = (RuntimeError, ValueError)
NEG_INF = float("-inf")


# ---- references ------------------------------------------------------------------------------------


def merge_ref(o_a, lse_a, o_b, lse_b):
    """The merge in float64 on the CPU: (out [..., H, D], lse [..., H])."""
    o_a, o_b = (x.detach().to("cpu", f64) for x in (o_a, o_b))
    la, lb = (x.detach().to("cpu", f64) for x in (lse_a, lse_b))
    m = torch.maximum(la, lb)
    m0 = torch.where(torch.isneginf(m), torch.zeros_like(m), m)
    ea, eb = torch.exp(la - m0), torch.exp(lb - m0)  # a -inf side: 0
    den = ea + eb
    wa = torch.where(den > 0, ea / den.clamp_min(1e-300), torch.zeros_like(den)).unsqueeze(-1)
    wb = torch.where(den > 0, eb / den.clamp_min(1e-300), torch.zeros_like(den)).unsqueeze(-1)
    zero = torch.zeros((), dtype=f64)
    out = torch.where(wa > 0, wa * o_a, zero) + torch.where(wb > 0, wb * o_b, zero)  # 0 * NaN never reached
    lse = torch.where(den > 0, m0 + torch.log(den.clamp_min(1e-300)), torch.full_like(den, NEG_INF))
    return out, lse


def close(got, want64, dtype, what, factor=1.0):
    """|got - want| <= tol (1 + |want|), want the float64 reference rounded to got's dtype; NaN never passes.
    factor > 1: a composition (two attention passes and a merge) whose merge weights come from float32
    lse values, so float64 results are only float32-close (2e-6)."""
    tol = TOL[dtype].attn * factor if factor == 1.0 else max(TOL[dtype].attn * factor, 2e-6)
    want = want64.to(got.dtype).to("cpu", f64)
    g = got.detach().to("cpu", f64)
    assert g.shape == want.shape, f"{what}: shape {tuple(g.shape)} != {tuple(want.shape)}"
    assert torch.isfinite(g).all(), f"{what}: non-finite values"
    err = ((g - want).abs() / (1 + want.abs())).max().item() if g.numel() else 0.0
    assert err <= tol, f"{what}: max error {err:.3e} > {tol:.0e}"


def check_lse(lse, want, what="lse"):
    """float32, the same -inf entries, finite ones within 1e-4 (1 + |want|)."""
    assert lse.dtype == torch.float32 and lse.shape == want.shape, f"{what}: {lse.dtype} {tuple(lse.shape)}"
    got, want = lse.detach().to("cpu", f64), want.to("cpu", f64)
    inf = torch.isneginf(want)
    assert not torch.isnan(got).any(), f"{what}: NaN"
    assert torch.equal(torch.isneginf(got), inf), f"{what}: -inf entries differ"
    if (~inf).any():
        err = ((got[~inf] - want[~inf]).abs() / (1 + want[~inf].abs())).max().item()
        assert err <= 1e-4, f"{what}: error {err:.2e}"


# ---- merge_attention_states ------------------------------------------------------------------------


def states(shape, dtype, device, *, inf_a=(), inf_b=()):
    """o_a, lse_a, o_b, lse_b of `shape` [..., H, D]; the flat (row, head) entries in inf_a / inf_b get
    lse -inf and NaN in their o (never to be read)."""
    o_a = torch.randn(shape, device=device).to(dtype)
    o_b = torch.randn(shape, device=device).to(dtype)
    lse_a = torch.randn(shape[:-1], device=device) * 3
    lse_b = torch.randn(shape[:-1], device=device) * 3
    for o, lse, idx in ((o_a, lse_a, inf_a), (o_b, lse_b, inf_b)):
        for i in idx:
            lse.view(-1)[i] = NEG_INF
            o.view(-1, shape[-1])[i] = float("nan")
    return o_a, lse_a, o_b, lse_b


def run_merge(kf, o_a, lse_a, o_b, lse_b):
    poison([o_a.shape], o_a.dtype, o_a.device)
    poison([o_a.shape[:-1]], torch.float32, o_a.device)
    return kf.merge_attention_states(o_a, lse_a, o_b, lse_b)


MERGE_DEVICES = [CPU, CPU_BF16] + CUDA + [CUDA_F32]
# [N, H, D]: 1 and 7 rows, odd H and D (the 1-element path), decode's shapes, leading dims [B, Lq]
MERGE_SHAPES = [(1, 1, 64), (7, 5, 33), (7, 3, 128), (64, 32, 128), (2, 4, 8, 256), (3, 1, 7, 1)]


@pytest.mark.parametrize("shape", MERGE_SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("device,dtype", MERGE_DEVICES)
def test_merge_values(kf, device, dtype, shape):
    """Random states with -inf on one side of some (row, head) pairs and on both sides of one."""
    rows = math.prod(shape[:-1])
    inf_a = [i for i in (0, 3, rows - 1) if i < rows]
    inf_b = [i for i in (1, rows - 1) if i < rows]
    o_a, lse_a, o_b, lse_b = states(shape, dtype, device, inf_a=inf_a, inf_b=inf_b)
    out, lse = run_merge(kf, o_a, lse_a, o_b, lse_b)
    assert out.shape == o_a.shape and out.dtype == dtype and out.is_contiguous()
    assert lse.shape == lse_a.shape and lse.is_contiguous()
    want, want_lse = merge_ref(o_a, lse_a, o_b, lse_b)
    close(out, want, dtype, "out")
    check_lse(lse, want_lse)
    both = out.reshape(-1, shape[-1])[rows - 1]
    assert (both == 0).all() and torch.isneginf(lse.reshape(-1)[rows - 1])  # both sides -inf: 0, -inf


@pytest.mark.parametrize("device,dtype", [CPU] + CUDA)
def test_merge_strided(kf, device, dtype):
    """o_a a head slice of a wider tensor, o_b a transpose view ([N, H, D] of [H, N, D] memory), lse_a
    the transpose of attention's [H, N] layout, lse_b a column slice: strides are honored."""
    N, H, D = 9, 6, 128
    wide = torch.randn(N, H + 3, D, device=device).to(dtype)
    o_a = wide[:, 2:2 + H]
    o_b = torch.randn(H, N, D, device=device).to(dtype).transpose(0, 1)
    lse_a = (torch.randn(H, N, device=device) * 2).t()
    lse_b = (torch.randn(N, 2 * H, device=device) * 2)[:, ::2]
    assert not o_a.is_contiguous() and not o_b.is_contiguous() and not lse_a.is_contiguous()
    out, lse = run_merge(kf, o_a, lse_a, o_b, lse_b)
    want, want_lse = merge_ref(o_a, lse_a, o_b, lse_b)
    close(out, want, dtype, "out")
    check_lse(lse, want_lse)
    # the same values made contiguous: the same result
    out2, lse2 = kf.merge_attention_states(o_a.contiguous(), lse_a.contiguous(), o_b.contiguous(),
                                           lse_b.contiguous())
    assert torch.equal(out, out2) and torch.equal(lse, lse2)


@pytest.mark.parametrize("device,dtype", [CPU] + CUDA)
def test_merge_empty_and_one_side(kf, device, dtype):
    """No rows: empty outputs. One side all -inf: the other side's o (rounded once) and lse."""
    o_a, lse_a, o_b, lse_b = states((0, 4, 64), dtype, device)
    out, lse = kf.merge_attention_states(o_a, lse_a, o_b, lse_b)
    assert out.shape == (0, 4, 64) and lse.shape == (0, 4)
    o_a, lse_a, o_b, lse_b = states((3, 4, 64), dtype, device, inf_a=range(12))
    out, lse = run_merge(kf, o_a, lse_a, o_b, lse_b)
    assert torch.equal(out, o_b) and torch.equal(lse, lse_b)


@pytest.mark.parametrize("device,dtype", [CPU] + CUDA)
def test_merge_of_two_key_halves_is_attention_over_all_keys(kf, device, dtype):
    """decode_attention over keys [0, n) equals the merge of its two halves: keys [0, s) (a cache of s
    keys, every new token sees all: Lq = 1) and [s, n) (key_starts = s)."""
    from kernelforge.specs.decode import decode_ref

    c = make_cache([70, 33, 5], 2, 128, 16, dtype, device)
    q = torch.randn(3, 1, 8, 128, device=device).to(dtype)
    s = torch.tensor([30, 1, 5], dtype=torch.int32, device=device)
    lo, lse_lo = kf.decode_attention(q, c["k_cache"], c["v_cache"], s, c["block_table"], return_lse=True)
    hi, lse_hi = kf.decode_attention(q, c["k_cache"], c["v_cache"], c["seq_lens"], c["block_table"], key_starts=s,
                                     return_lse=True)
    out, lse = kf.merge_attention_states(lo, lse_lo, hi, lse_hi)
    want, want_lse = decode_ref(q, c["k_cache"], c["v_cache"], c["seq_lens"], c["block_table"])
    close(out, want, dtype, "out", factor=2.0)  # three roundings: two halves, the merge
    check_lse(lse, want_lse)


def test_merge_errors(kf):
    o_a, lse_a, o_b, lse_b = states((4, 3, 64), f64, "cpu")
    with pytest.raises(ValueError, match=r"o_a must have at least 2 dimensions"):
        kf.merge_attention_states(o_a[0, 0], lse_a, o_b, lse_b)
    with pytest.raises(ValueError, match=r"o_b must have o_a's shape \[4, 3, 64\], got \[4, 3, 32\]"):
        kf.merge_attention_states(o_a, lse_a, o_b[..., :32], lse_b)
    with pytest.raises(ValueError, match=r"lse_b must have o_a's shape without the head dim"):
        kf.merge_attention_states(o_a, lse_a, o_b, lse_b[:, :2])
    with pytest.raises(ERR, match="o_b must have o_a's dtype"):
        kf.merge_attention_states(o_a, lse_a, o_b.float(), lse_b)
    with pytest.raises(ERR, match="lse_a must be float32"):
        kf.merge_attention_states(o_a, lse_a.to(torch.int32), o_b, lse_b)
    with pytest.raises(ERR, match="o_a must be float16, bfloat16 or float32"):
        kf.merge_attention_states(o_a.to(torch.int32), lse_a, o_b.to(torch.int32), lse_b)
    every_other = torch.randn(4, 3, 64, 2, dtype=f64)[..., 0]  # last stride 2
    with pytest.raises(ERR, match=r"o_a must be contiguous in its last dimension \(stride 1\), got strides "
                                  r"\[384, 128, 2\]"):
        kf.merge_attention_states(every_other, lse_a, o_b, lse_b)


@pytest.mark.parametrize("device,dtype", [CPU, CUDA[0]])
def test_merge_compile_and_opcheck(kf, fresh_dynamo, device, dtype):
    """torch.compile(fullgraph=True) through the fake impl; opcheck of the op; inference only."""
    o_a, lse_a, o_b, lse_b = states((2, 3, 4, 64), dtype, device, inf_a=[1])

    def f(o_a, lse_a, o_b, lse_b):
        out, lse = kf.merge_attention_states(o_a, lse_a, o_b, lse_b)
        return out * 2, lse

    out, lse = torch.compile(f, fullgraph=True)(o_a, lse_a, o_b, lse_b)
    want, want_lse = merge_ref(o_a, lse_a, o_b, lse_b)
    close(out / 2, want, dtype, "out")
    check_lse(lse, want_lse)
    o_a, lse_a, o_b, lse_b = states((5, 3, 64), dtype, device)
    torch.library.opcheck(torch.ops.kernelforge.merge_attention_states.default, (o_a, lse_a.t().contiguous().t(),
                                                                                 o_b, lse_b))
    out, _ = kf.merge_attention_states(o_a.requires_grad_(), lse_a, o_b, lse_b)
    assert not out.requires_grad


# ---- cascade_decode_attention ----------------------------------------------------------------------


def cascade_case(lens, lq, hq, hk, d, page, prefix, dtype, device):
    """The shared prefix [P, Hkv, D], the suffix cache (make_cache: shuffled pages, NaN in unused rows) and
    the concatenated per-sequence cache holding prefix + suffix (seq_lens + P), q [B, Lq, Hq, D]."""
    c = make_cache(lens, hk, d, page, dtype, device)
    c["prefix_k"] = torch.randn(prefix, hk, d, device=device).to(dtype)
    c["prefix_v"] = torch.randn(prefix, hk, d, device=device).to(dtype)
    c["q"] = torch.randn(len(lens), lq, hq, d, device=device).to(dtype)
    full = make_cache([prefix + n for n in lens], hk, d, page, dtype, device)
    for b, n in enumerate(lens):
        for name in ("k", "v"):
            j = torch.arange(n, device=device)
            suffix = c[f"{name}_cache"][c["block_table"][b][j // page].long(), j % page]
            rows = torch.cat([c[f"prefix_{name}"], suffix])
            jf = torch.arange(prefix + n, device=device)
            full[f"{name}_cache"][full["block_table"][b][jf // page].long(), jf % page] = rows
    c["full"] = full
    return c


def run_cascade(kf, c, **kw):
    q = c["q"]
    poison([q.shape, (q.shape[0] * q.shape[1], q.shape[2], q.shape[3])], q.dtype, q.device)
    poison([q.shape[:3]], torch.float32, q.device)
    return kf.cascade_decode_attention(q, c["prefix_k"], c["prefix_v"], c["k_cache"], c["v_cache"], c["seq_lens"],
                                       c["block_table"], return_lse=True, **kw)


SUFFIXES = {1: [20], 5: [9, 0, 40, 4, 17]}


@pytest.mark.parametrize("heads", [(32, 8), (8, 8)], ids=lambda h: f"h{h[0]}/{h[1]}")
@pytest.mark.parametrize("batch", [1, 5])
@pytest.mark.parametrize("lq", [1, 4])
@pytest.mark.parametrize("page", [1, 16])
@pytest.mark.parametrize("device,dtype", [CPU] + CUDA)
def test_cascade_values(kf, device, dtype, page, lq, batch, heads):
    """Against the float64 formula, and against decode_attention over each sequence's concatenated
    [prefix; suffix] cache for every sequence whose suffix holds its Lq new tokens (an empty suffix sees
    the whole prefix, which the concatenated cache's causal rows do not give for Lq > 1)."""
    hq, hk = heads
    lens = [max(n, lq) if n else 0 for n in SUFFIXES[batch]]
    c = cascade_case(lens, lq, hq, hk, 128, page, 37, dtype, device)
    out, lse = run_cascade(kf, c)
    assert out.shape == c["q"].shape and out.dtype == dtype and out.is_contiguous()
    want, want_lse = cascade_ref(c["q"], c["prefix_k"], c["prefix_v"], c["k_cache"], c["v_cache"], c["seq_lens"],
                                 c["block_table"])
    close(out, want, dtype, "out", factor=2.0)  # two passes and the merge: three roundings
    check_lse(lse, want_lse)
    full = c["full"]
    dec, dec_lse = kf.decode_attention(c["q"], full["k_cache"], full["v_cache"], full["seq_lens"],
                                       full["block_table"], return_lse=True)
    same = [b for b, n in enumerate(lens) if n >= lq or (n == 0 and lq == 1)]
    assert same
    dec64 = dec.to("cpu", f64)
    close(out[same], dec64[same], dtype, "out against decode_attention on the concatenated cache", factor=3.0)
    check_lse(lse[same], dec_lse[same].to("cpu", f64), "lse against decode_attention")


@pytest.mark.parametrize("device,dtype", [CPU] + CUDA)
def test_cascade_empty_prefix_and_scale(kf, device, dtype):
    """P = 0: decode_attention's result exactly; an explicit scale applies to both passes."""
    c = cascade_case([12, 3], 2, 8, 2, 64, 16, 0, dtype, device)
    out, lse = run_cascade(kf, c)
    dec, dec_lse = kf.decode_attention(c["q"], c["k_cache"], c["v_cache"], c["seq_lens"], c["block_table"],
                                       return_lse=True)
    assert torch.equal(out, dec) and torch.equal(lse, dec_lse)
    c = cascade_case([12, 3], 2, 8, 2, 64, 16, 50, dtype, device)
    out, lse = run_cascade(kf, c, scale=0.3)
    want, want_lse = cascade_ref(c["q"], c["prefix_k"], c["prefix_v"], c["k_cache"], c["v_cache"], c["seq_lens"],
                                 c["block_table"], scale=0.3)
    close(out, want, dtype, "out", factor=2.0)
    check_lse(lse, want_lse)
    plain = kf.cascade_decode_attention(c["q"], c["prefix_k"], c["prefix_v"], c["k_cache"], c["v_cache"],
                                        c["seq_lens"], c["block_table"], scale=0.3)
    assert isinstance(plain, torch.Tensor) and torch.equal(plain, out)


def test_cascade_rejects(kf):
    c = cascade_case([12, 3], 1, 8, 2, 64, 16, 20, f64, "cpu")
    args = (c["q"], c["prefix_k"], c["prefix_v"], c["k_cache"], c["v_cache"], c["seq_lens"], c["block_table"])
    with pytest.raises(ValueError, match="cascade_decode_attention: window_left is not supported"):
        kf.cascade_decode_attention(*args, window_left=8)
    with pytest.raises(ValueError, match="cascade_decode_attention: softcap is not supported"):
        kf.cascade_decode_attention(*args, softcap=30.0)
    with pytest.raises(ValueError, match="cascade_decode_attention: sinks are not supported"):
        kf.cascade_decode_attention(*args, sinks=torch.zeros(8))
    bad = list(args)
    bad[1] = c["prefix_k"][0]
    with pytest.raises(ValueError, match=r"prefix_k must have 3 dimensions \[P, Hkv, D\]"):
        kf.cascade_decode_attention(*bad)
    bad = list(args)
    bad[2] = c["prefix_v"][:5]
    with pytest.raises(ValueError, match="prefix_v must have prefix_k's shape"):
        kf.cascade_decode_attention(*bad)
    bad = list(args)
    bad[1], bad[2] = c["prefix_k"][:, :1], c["prefix_v"][:, :1]
    with pytest.raises(ValueError, match="prefix_k's kv heads and head dim"):
        kf.cascade_decode_attention(*bad)
    bad = list(args)
    bad[1], bad[2] = c["prefix_k"].float(), c["prefix_v"].float()
    with pytest.raises(ValueError, match="prefix_k must have q's dtype"):
        kf.cascade_decode_attention(*bad)


@pytest.mark.parametrize("device,dtype", [CPU, CUDA[0]])
def test_cascade_compile(kf, fresh_dynamo, device, dtype):
    """torch.compile(fullgraph=True): the three ops traced through their fake impls, no graph break."""
    c = cascade_case([12, 30], 2, 8, 2, 64, 16, 40, dtype, device)

    def f(q, pk, pv, kc, vc, lens, table):
        out, lse = kf.cascade_decode_attention(q, pk, pv, kc, vc, lens, table, return_lse=True)
        return out * 2, lse

    out, lse = torch.compile(f, fullgraph=True)(c["q"], c["prefix_k"], c["prefix_v"], c["k_cache"], c["v_cache"],
                                                 c["seq_lens"], c["block_table"])
    want, want_lse = cascade_ref(c["q"], c["prefix_k"], c["prefix_v"], c["k_cache"], c["v_cache"], c["seq_lens"],
                                 c["block_table"])
    close(out / 2, want, dtype, "out", factor=2.0)
    check_lse(lse, want_lse)


@pytest.mark.cuda
def test_cascade_cuda_graph_replay(kf):
    """Captured once into a CUDA graph, replayed for new suffix lengths: no host read of seq_lens."""
    dtype, device = torch.bfloat16, "cuda"
    c = cascade_case([64, 64, 64], 1, 32, 8, 128, 16, 300, dtype, device)
    lens = c["seq_lens"]

    def step():
        return kf.cascade_decode_attention(c["q"], c["prefix_k"], c["prefix_v"], c["k_cache"], c["v_cache"], lens,
                                           c["block_table"], return_lse=True)

    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        step()
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out, lse = step()
    for new in ([64, 1, 30], [0, 64, 7]):
        lens.copy_(torch.tensor(new, dtype=torch.int32))
        graph.replay()
        torch.cuda.synchronize()
        want, want_lse = cascade_ref(c["q"], c["prefix_k"], c["prefix_v"], c["k_cache"], c["v_cache"], lens,
                                     c["block_table"])
        close(out, want, dtype, f"out {new}", factor=2.0)
        check_lse(lse, want_lse)
