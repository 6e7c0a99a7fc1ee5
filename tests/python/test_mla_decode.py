"""kernelforge.mla_decode (DeepSeek-V2 / V3 MLA decode, absorbed form) against a float64 reference
written here from the formula of include/kernelforge/mla.h: each sequence's cache rows gathered through
its block table, one sequence and one new token at a time; the keys are the whole 576-column rows, the
values their first 512 columns.

CPU tensors run the op's float64 C++ reference; CUDA tensors (float16 / bfloat16) run the kernel, within
TOL[dtype].attn of the reference rounded to the dtype, with the outputs' allocator blocks pre-filled
with NaN. The caches hold NaN in every row no sequence uses and their pages are shuffled (make_cache):
a kernel that reads past a sequence or ignores the block table fails.
"""

from __future__ import annotations

import math

import pytest
import torch

from kernelforge.specs import TOL
from kernelforge.specs._spec import poison
from kernelforge.specs.decode import make_cache, mla_decode_ref

f64 = torch.float64
DK, DV = 576, 512
CPU = pytest.param("cpu", f64, id="cpu-float64")
CUDA = [pytest.param("cuda", dt, id=f"cuda-{str(dt)[6:]}") for dt in (torch.bfloat16, torch.float16)]
DEVICES = [CPU] + CUDA
ERR = (RuntimeError, ValueError)

# (seq_lens, Lq, H, page): H 16 / 128 (two 64-row tiles) / 7 (a partial row block) / 1 / 32 / 24, Lq 1 .. 8,
# page sizes 1, 16, 64 and a contiguous cache (0); an empty sequence, lengths 1 and 7, 4097 (past a split),
# lengths below Lq (the first new tokens see no key).
CASES = [
    ([1, 7, 0, 33], 1, 16, 16),
    ([5, 17, 3], 2, 7, 1),
    ([70, 8, 129], 4, 128, 64),
    ([4097, 100], 1, 16, 64),
    ([23, 61, 0], 1, 32, 0),
    ([12, 31], 8, 16, 16),
    ([40], 1, 1, 16),
    ([2, 130, 1], 3, 24, 16),  # 72 rows: token 2 across the two row tiles; lengths below Lq see nothing
]


def case_id(c) -> str:
    lens, lq, h, page = c
    return f"p{page}-lens{'_'.join(map(str, lens))}-q{lq}-h{h}"


def reference(q, kv_cache, seq_lens, block_table=None, *, scale=None):
    """mla.h in float64: for sequence b (n = seq_lens[b]) row j is row j % page_size of page
    block_table[b, j // page_size] (contiguous: row j of page b); new token t sits at i = n - Lq + t and
    sees rows j <= i; s_j = scale * q . row_j, out = softmax(s) @ row[:512]. Returns (out [B, Lq, H,
    512], lse [B, Lq, H]), float64 on CPU."""
    q = q.detach().cpu().double()
    kv = kv_cache.detach().cpu()
    B, Lq, H, _ = q.shape
    page = kv.shape[1]
    table = block_table.detach().cpu().long() if block_table is not None else None
    scale = DK ** -0.5 if scale is None else scale
    out = torch.zeros(B, Lq, H, DV, dtype=f64)
    lse = torch.full((B, Lq, H), -math.inf, dtype=f64)
    for b in range(B):
        n = int(seq_lens[b])
        j = torch.arange(n)
        rows = (kv[b, :n] if table is None else kv[table[b][j // page], j % page]).double()  # [n, 576]
        s = torch.einsum("thd,jd->thj", q[b], rows) * scale
        for t in range(Lq):
            visible = j <= n - Lq + t
            if not visible.any():
                continue  # sees nothing: out 0, lse -inf
            logits = s[t][:, visible]  # [H, visible]
            m = logits.amax(dim=1, keepdim=True)
            w = torch.exp(logits - m)
            den = w.sum(dim=1)
            out[b, t] = (w @ rows[visible, :DV]) / den.view(H, 1)
            lse[b, t] = m.view(H) + torch.log(den)
    return out, lse


def build(case, dtype, device):
    """The case's cache ([P, page, 576], shuffled pages, NaN in every unused row) and q."""
    lens, lq, h, page = case
    c = make_cache(lens, 1, DK, page, dtype, device)
    return {"q": torch.randn(len(lens), lq, h, DK, device=device).to(dtype), "kv_cache": c["k_cache"][:, :, 0],
            "seq_lens": c["seq_lens"], "block_table": c["block_table"], "capacity": c["capacity"]}


def run(kf, c, **kw):
    q = c["q"]
    poison([(*q.shape[:3], DV)], q.dtype, q.device)
    poison([q.shape[:3]], torch.float32, q.device)
    return kf.mla_decode(q, c["kv_cache"], c["seq_lens"], c["block_table"], return_lse=True, **kw)


def close(got, want64, dtype, what):
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
    if (~inf).any():
        err = (lse64[~inf] - want[~inf]).abs().max().item()
        assert err <= 1e-4 * (1 + want[~inf].abs().max().item()), f"lse error {err:.2e}"


# ---- values ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("scale", [None, 0.09375], ids=["default_scale", "scale"])  # exact in float32 (the op's type)
@pytest.mark.parametrize("case", CASES, ids=case_id)
@pytest.mark.parametrize("device,dtype", DEVICES)
def test_values(kf, device, dtype, case, scale):
    c = build(case, dtype, device)
    out, lse = run(kf, c, scale=scale)
    want, want_lse = reference(c["q"], c["kv_cache"], c["seq_lens"], c["block_table"], scale=scale)
    assert out.shape == (*c["q"].shape[:3], DV) and out.dtype == dtype and out.is_contiguous()
    close(out, want, dtype, "out")
    check_lse(lse, want_lse)


@pytest.mark.parametrize("device,dtype", DEVICES)
def test_four_dim_cache_and_no_lse(kf, device, dtype):
    """A [P, page_size, 1, 576] cache (one latent head, as serving engines store it) is squeezed; without
    return_lse the op returns out alone."""
    c = build(CASES[0], dtype, device)
    out = kf.mla_decode(c["q"], c["kv_cache"].unsqueeze(2), c["seq_lens"], c["block_table"], max_seq_len=33)
    want, _ = reference(c["q"], c["kv_cache"], c["seq_lens"], c["block_table"])
    close(out, want, dtype, "out")


@pytest.mark.parametrize("case", CASES[:3], ids=case_id)
def test_spec_reference_agrees(case):
    """The bench / check reference (specs.decode.mla_decode_ref, vectorized) is the same formula."""
    c = build(case, f64, "cpu")
    a, a_lse = reference(c["q"], c["kv_cache"], c["seq_lens"], c["block_table"])
    b, b_lse = mla_decode_ref(c["q"], c["kv_cache"], c["seq_lens"], c["block_table"])
    assert torch.allclose(a, b, atol=1e-12) and torch.equal(torch.isinf(a_lse), torch.isinf(b_lse))


def test_inference_only(kf):
    c = build(CASES[0], f64, "cpu")
    q = c["q"].requires_grad_()
    out = kf.mla_decode(q, c["kv_cache"], c["seq_lens"], c["block_table"])
    assert not out.requires_grad


# ---- errors ----------------------------------------------------------------------------------------


def test_errors(kf):
    c = build(([9, 20], 1, 4, 16), f64, "cpu")
    q, kv, lens, bt = c["q"], c["kv_cache"], c["seq_lens"], c["block_table"]
    with pytest.raises(ValueError, match=r"q must have 4 dimensions \[B, Lq, H, 576\]"):
        kf.mla_decode(q[0], kv, lens, bt)
    with pytest.raises(ERR, match="q's last dimension must be 576"):
        kf.mla_decode(q[..., :512], kv, lens, bt)
    with pytest.raises(ERR, match="kv_cache's last dimension must be 576"):
        kf.mla_decode(q, kv[..., :512], lens, bt)
    with pytest.raises(ERR, match="kv_cache must have 3 dimensions"):
        kf.mla_decode(q, kv[0], lens, bt)
    with pytest.raises(ERR, match="kv_cache must have q's dtype"):
        kf.mla_decode(q, kv.float(), lens, bt)
    with pytest.raises(ERR, match="1 to 8 new tokens"):
        kf.mla_decode(q.expand(2, 9, 4, DK), kv, lens, bt)
    with pytest.raises(ERR, match="1 to 128 heads"):
        kf.mla_decode(q[:, :, :1].expand(2, 1, 129, DK), kv, lens, bt)
    with pytest.raises(ERR, match="seq_lens must be int32"):
        kf.mla_decode(q, kv, lens.long(), bt)
    with pytest.raises(ERR, match="block_table must be int32"):
        kf.mla_decode(q, kv, lens, bt.long())
    with pytest.raises(ERR, match="page size"):
        kf.mla_decode(q, kv[:, :12], lens, bt)
    with pytest.raises(ValueError, match="scale must be a finite value > 0"):
        kf.mla_decode(q, kv, lens, bt, scale=0.0)


def test_check_flag(kf):
    c = build(([9, 20], 1, 4, 16), f64, "cpu")
    q, kv, bt = c["q"], c["kv_cache"], c["block_table"]
    kf.mla_decode(q, kv, c["seq_lens"], bt, check=True)
    with pytest.raises(ValueError, match=r"mla_decode: seq_lens\[1\] = 999 is outside"):
        kf.mla_decode(q, kv, torch.tensor([9, 999], dtype=torch.int32), bt, check=True)
    bad = bt.clone()
    bad[0, 0] = 10_000
    with pytest.raises(ValueError, match=r"block_table\[0, 0\] = 10000 is not a page"):
        kf.mla_decode(q, kv, c["seq_lens"], bad, check=True)


# ---- CUDA graphs, opcheck --------------------------------------------------------------------------


@pytest.mark.cuda
def test_cuda_graph_replay_new_lengths(kf):
    """mla_decode captured once into a CUDA graph replays for new seq_lens and a new q: the lengths are
    read on the device only, the split workspace comes from the graph's pool."""
    dtype, device = torch.bfloat16, "cuda"
    c = build(([1024, 1024, 1024], 2, 128, 64), dtype, device)
    q, seq_lens = c["q"], c["seq_lens"]
    for b in range(3):  # every row of the capacity holds a key, so any new length reads real rows
        pages = c["block_table"][b]
        c["kv_cache"][pages.long()] = torch.randn(pages.numel(), 64, DK, device=device).to(dtype)

    def step():
        return kf.mla_decode(q, c["kv_cache"], seq_lens, c["block_table"], max_seq_len=1024, return_lse=True)

    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        step()  # warm up (allocator, plan)
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out, lse = step()
    for lens in ([1024, 4, 129], [31, 700, 2]):
        seq_lens.copy_(torch.tensor(lens, dtype=torch.int32))
        q.copy_(torch.randn_like(q, dtype=torch.float32).to(dtype))
        graph.replay()
        torch.cuda.synchronize()
        want, want_lse = reference(q, c["kv_cache"], seq_lens, c["block_table"])
        close(out, want, dtype, f"out {lens}")
        check_lse(lse, want_lse)


@pytest.mark.parametrize("device,dtype", [CPU, CUDA[0]])
def test_opcheck(kf, device, dtype):
    ops = torch.ops.kernelforge
    c = build(([9, 20], 2, 4, 16), dtype, device)
    for ret in (True, False):
        torch.library.opcheck(ops.mla_decode.default, (c["q"], c["kv_cache"], c["seq_lens"], c["block_table"]),
                              dict(scale=None, max_seq_len=0, return_lse=ret))
    d = build(([9, 20], 1, 16, 0), dtype, device)
    torch.library.opcheck(ops.mla_decode.default, (d["q"], d["kv_cache"], d["seq_lens"], None),
                          dict(scale=0.1, max_seq_len=20, return_lse=True))
