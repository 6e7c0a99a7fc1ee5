"""kernelforge.apply_rope against the float64 reference of kernelforge.specs.rope (rope_ref), with
the tables the libraries build: HF Llama (rotate-half pairing, cos/sin of full width from
`cat(freqs, freqs)`) and diffusers (interleaved pairing, cos/sin `repeat_interleave`d). rope_ref itself
is checked against the libraries' own code, transformers' `apply_rotary_pos_emb` and diffusers'
`apply_rotary_emb(use_real=True, use_real_unbind_dim=-1)`, in the tests that import them (skipped
where they are not installed). On CPU the op runs the float64 C++ reference for real; on CUDA the
kernel."""

from __future__ import annotations

import pytest
import torch

import norm_ref as R
from norm_ref import DEVICES, DTYPES

from kernelforge.specs.rope import rope_ref

f64 = torch.float64


def freqs(positions: torch.Tensor, R_: int, base: float = 10000.0) -> torch.Tensor:
    """[..., R/2] angles pos / base^(2i/R), float64."""
    inv = 1.0 / base ** (torch.arange(0, R_, 2, dtype=f64) / R_)
    return positions.to(f64)[..., None] * inv


def hf_tables(positions, R_):
    """HF LlamaRotaryEmbedding: emb = cat(freqs, freqs); cos, sin [..., R]."""
    emb = torch.cat((freqs(positions, R_), freqs(positions, R_)), dim=-1)
    return emb.cos(), emb.sin()


def diffusers_tables(positions, R_):
    """diffusers get_1d_rotary_pos_embed(use_real=True, repeat_interleave_real=True)."""
    f = freqs(positions, R_)
    return f.cos().repeat_interleave(2, dim=-1), f.sin().repeat_interleave(2, dim=-1)


def hf_reference(x, cos, sin, layout, R_):
    """transformers' apply_rotary_pos_emb on the first R columns (GPT-NeoX-style partial rotary:
    rotate x[..., :R], concatenate x[..., R:]); cos/sin [B, S, R], float64."""
    hf_apply_rotary_pos_emb = pytest.importorskip("transformers.models.llama.modeling_llama").apply_rotary_pos_emb
    unsqueeze_dim = 2 if layout == "bshd" else 1
    x = x.to(f64)
    rot, _ = hf_apply_rotary_pos_emb(x[..., :R_], x[..., :R_], cos.to(f64), sin.to(f64), unsqueeze_dim=unsqueeze_dim)
    return torch.cat((rot, x[..., R_:]), dim=-1)


def diffusers_reference(x, cos, sin, layout, R_):
    """diffusers' apply_rotary_emb (use_real_unbind_dim=-1) with cos/sin [S, R], float64."""
    diffusers_apply_rotary_emb = pytest.importorskip("diffusers.models.embeddings").apply_rotary_emb
    x = x.to(f64)
    sequence_dim = 1 if layout == "bshd" else 2
    rot = diffusers_apply_rotary_emb(
        x[..., :R_].contiguous(), (cos.to(f64), sin.to(f64)), use_real=True, use_real_unbind_dim=-1,
        sequence_dim=sequence_dim,
    )
    return torch.cat((rot, x[..., R_:]), dim=-1)


def heads_shape(layout, B, S, H, D):
    return (B, S, H, D) if layout == "bshd" else (B, H, S, D)


# (B, S, Hq, Hk, D, R): GQA, MQA, partial rotary, odd S, decode
SHAPES = [(2, 17, 8, 2, 128, 128), (1, 1, 32, 8, 128, 128), (2, 9, 4, 1, 64, 32), (1, 5, 3, 3, 80, 32)]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("layout", ["bshd", "bhsd"])
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_hf_rotate_half(kf, shape, layout, device, dtype):
    B, S, Hq, Hk, D, R_ = shape
    q = R.rand(heads_shape(layout, B, S, Hq, D), dtype, device)
    k = R.rand(heads_shape(layout, B, S, Hk, D), dtype, device)
    pos = torch.arange(S).expand(B, S) + torch.arange(B)[:, None] * 3  # [B, S]: per-batch offsets
    cos, sin = hf_tables(pos, R_)
    # HF hands cos/sin over in q's dtype; float32 tables are accepted as well
    for cs_dtype in {dtype, torch.float32}:
        c, s = cos.to(device, cs_dtype), sin.to(device, cs_dtype)
        q_out, k_out = kf.apply_rope(q, k, c, s, layout=layout)
        R.assert_close(q_out, rope_ref(q, c, s, False, layout, dtype), dtype, msg=f"q {cs_dtype}")
        R.assert_close(k_out, rope_ref(k, c, s, False, layout, dtype), dtype, msg=f"k {cs_dtype}")
        assert q_out.is_contiguous() and k_out.is_contiguous()


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("layout", ["bshd", "bhsd"])
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_diffusers_interleaved(kf, shape, layout, device, dtype):
    B, S, Hq, Hk, D, R_ = shape
    q = R.rand(heads_shape(layout, B, S, Hq, D), dtype, device)
    k = R.rand(heads_shape(layout, B, S, Hk, D), dtype, device)
    cos, sin = diffusers_tables(torch.arange(S), R_)  # [S, R] float32 in diffusers
    c, s = cos.to(device, torch.float32), sin.to(device, torch.float32)
    q_out, k_out = kf.apply_rope(q, k, c, s, interleaved=True, layout=layout)
    R.assert_close(q_out, rope_ref(q, c, s, True, layout, dtype), dtype, msg="q")
    R.assert_close(k_out, rope_ref(k, c, s, True, layout, dtype), dtype, msg="k")


@pytest.mark.parametrize("layout", ["bshd", "bhsd"])
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_reference_matches_transformers(shape, layout):
    """rope_ref (rotate-half) is transformers' apply_rotary_pos_emb, partial rotary included."""
    B, S, Hq, Hk, D, R_ = shape
    x = torch.randn(heads_shape(layout, B, S, Hq, D), dtype=f64)
    pos = torch.arange(S).expand(B, S) + torch.arange(B)[:, None] * 3
    cos, sin = hf_tables(pos, R_)
    torch.testing.assert_close(rope_ref(x, cos, sin, False, layout), hf_reference(x, cos, sin, layout, R_),
                               rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("layout", ["bshd", "bhsd"])
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_reference_matches_diffusers(shape, layout):
    """rope_ref (interleaved) is diffusers' apply_rotary_emb(use_real=True, use_real_unbind_dim=-1).
    diffusers computes x * cos + rot(x) * sin in float32 (x.float()), whatever x's dtype: the two agree
    to float32 rounding."""
    B, S, Hq, Hk, D, R_ = shape
    x = torch.randn(heads_shape(layout, B, S, Hq, D), dtype=f64)
    cos, sin = diffusers_tables(torch.arange(S), R_)
    torch.testing.assert_close(rope_ref(x, cos, sin, True, layout), diffusers_reference(x, cos, sin, layout, R_),
                               rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("interleaved", [False, True])
def test_position_ids_cache(kf, device, interleaved):
    B, S, H, D, P = 3, 6, 4, 64, 50
    dtype = torch.bfloat16
    q = R.rand((B, S, H, D), dtype, device)
    tables = diffusers_tables if interleaved else hf_tables
    cos, sin = tables(torch.arange(P), D)
    cos, sin = cos.float().to(device), sin.float().to(device)
    pos = torch.randint(0, P, (B, S), device=device)
    q1, k1 = kf.apply_rope(q, None, cos, sin, position_ids=pos, interleaved=interleaved)
    q2, _ = kf.apply_rope(q, None, cos[pos], sin[pos], interleaved=interleaved)
    assert k1 is None
    assert torch.equal(q1, q2)
    # [1, S] position ids broadcast over the batch
    q3, _ = kf.apply_rope(q, None, cos, sin, position_ids=pos[:1], interleaved=interleaved)
    q4, _ = kf.apply_rope(q, None, cos[pos[:1]], sin[pos[:1]], interleaved=interleaved)
    assert torch.equal(q3, q4)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("interleaved", [False, True])
def test_inplace_and_fused_qkv(kf, device, interleaved):
    B, S, Hq, Hk, D = 2, 7, 8, 2, 64
    dtype = torch.float16
    qkv = R.rand((B, S, Hq + 2 * Hk, D), dtype, device)
    q, k, v = qkv.split([Hq, Hk, Hk], dim=2)  # strided views of one buffer
    cos, sin = hf_tables(torch.arange(S), D)
    cos, sin = cos.float().to(device), sin.float().to(device)
    want_q, want_k = kf.apply_rope(q, k, cos, sin, interleaved=interleaved)
    v_before = v.clone()
    q_ret, k_ret = kf.apply_rope(q, k, cos, sin, interleaved=interleaved, inplace=True)
    assert q_ret is q and k_ret is k
    assert torch.equal(q, want_q) and torch.equal(k, want_k)
    assert torch.equal(v, v_before)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("interleaved", [False, True])
def test_backward_matches_reference_autograd(kf, device, interleaved):
    B, S, Hq, Hk, D, R_ = 2, 5, 4, 2, 64, 32
    dtype = torch.float32
    q = R.rand((B, S, Hq, D), dtype, device).requires_grad_()
    k = R.rand((B, S, Hk, D), dtype, device).requires_grad_()
    if interleaved:
        cos, sin = diffusers_tables(torch.arange(S), R_)
    else:
        cos, sin = hf_tables(torch.arange(S).expand(B, S), R_)
    cos, sin = cos.float().to(device), sin.float().to(device)
    q_out, k_out = kf.apply_rope(q, k, cos, sin, interleaved=interleaved)
    gq, gk = R.rand(q_out.shape, dtype, device), R.rand(k_out.shape, dtype, device)
    dq, dk = torch.autograd.grad((q_out, k_out), (q, k), (gq, gk))
    q64 = q.detach().to(f64).requires_grad_()
    k64 = k.detach().to(f64).requires_grad_()
    rq, rk = rope_ref(q64, cos, sin, interleaved, "bshd"), rope_ref(k64, cos, sin, interleaved, "bshd")
    want_q, want_k = torch.autograd.grad((rq, rk), (q64, k64), (gq.to(f64), gk.to(f64)))
    R.assert_close(dq, want_q.to(dtype), dtype, msg="dq")
    R.assert_close(dk, want_k.to(dtype), dtype, msg="dk")
    # only q's output used: dk is zero-free None-free (k gets no gradient from an unused output)
    q_out, k_out = kf.apply_rope(q, k, cos, sin, interleaved=interleaved)
    (dq2,) = torch.autograd.grad(q_out, (q,), gq)
    torch.testing.assert_close(dq2, dq)


@pytest.mark.parametrize("interleaved", [False, True])
def test_gradcheck_cpu(kf, interleaved):
    q = torch.randn(1, 3, 2, 6, dtype=f64, requires_grad=True)
    k = torch.randn(1, 3, 1, 6, dtype=f64, requires_grad=True)
    cos, sin = torch.randn(3, 4, dtype=f64), torch.randn(3, 4, dtype=f64)  # per-column, not duplicated

    def f(q, k):
        return kf.apply_rope(q, k, cos, sin, interleaved=interleaved)

    assert torch.autograd.gradcheck(f, (q, k))


@pytest.mark.parametrize("device", DEVICES)
def test_opcheck(kf, device):
    q = R.rand((2, 3, 4, 16), torch.float32, device)
    k = R.rand((2, 3, 2, 16), torch.float32, device)
    cos, sin = torch.rand(3, 8, device=device), torch.rand(3, 8, device=device)
    pos = torch.tensor([[0, 1, 2], [2, 1, 0]], device=device)
    ops = torch.ops.kernelforge
    torch.library.opcheck(ops.apply_rope.default, (q, k, cos, sin, None, False, "bshd", 0))
    torch.library.opcheck(ops.apply_rope.default, (q, None, cos, sin, pos, True, "bshd", 8))
    torch.library.opcheck(ops.apply_rope_backward.default, (q, k, cos, sin, None, True, "bshd", 0))
    torch.library.opcheck(ops.apply_rope_inplace.default, (q.clone(), k.clone(), cos, sin, None, False, "bshd", 0))


def test_errors(kf):
    q = torch.randn(1, 3, 2, 8)
    cos, sin = torch.randn(3, 8), torch.randn(3, 8)
    with pytest.raises(ValueError, match="layout must be 'bshd' or 'bhsd'"):
        kf.apply_rope(q, None, cos, sin, layout="sbhd")
    with pytest.raises(RuntimeError, match="rotary_dim .* must be even"):
        kf.apply_rope(q, None, cos[:, :7], sin[:, :7])
    with pytest.raises(RuntimeError, match=r"rotary_dim \(4\) must equal the last dimension of cos"):
        kf.apply_rope(q, None, cos, sin, rotary_dim=4)
    with pytest.raises(RuntimeError, match="position_ids\\[0, 2\\] = 9 is outside the cos/sin cache"):
        kf.apply_rope(q, None, cos, sin, position_ids=torch.tensor([[0, 1, 9]]))
    with pytest.raises(RuntimeError, match="inplace=True has no autograd support"):
        kf.apply_rope(q.clone().requires_grad_(), None, cos, sin, inplace=True)
    with pytest.raises(RuntimeError, match="gradients with respect to cos and sin are not implemented"):
        kf.apply_rope(q, None, cos.clone().requires_grad_(), sin)


def _strided(t: torch.Tensor, kind: str) -> torch.Tensor:
    """The same values as t ([B, S, H, D]) stored as: padded heads (big[..., :D]), a base pointer one
    element into a buffer (no 16-byte vectors), or the bhsd transpose of a contiguous bshd buffer."""
    if kind == "padded":
        big = torch.full((*t.shape[:-1], t.shape[-1] + 8), float("nan"), dtype=t.dtype, device=t.device)
        big[..., : t.shape[-1]] = t
        return big[..., : t.shape[-1]]
    if kind == "unaligned":
        flat = torch.empty(t.numel() + 1, dtype=t.dtype, device=t.device)
        v = flat[1:].view(t.shape)
        v.copy_(t)
        return v
    raise ValueError(kind)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("kind", ["padded", "unaligned"])
@pytest.mark.parametrize("interleaved", [False, True])
def test_strided_views(kf, kind, interleaved, device, dtype):
    B, S, Hq, Hk, D = 2, 7, 4, 2, 64
    q = R.rand((B, S, Hq, D), dtype, device)
    k = R.rand((B, S, Hk, D), dtype, device)
    cos, sin = torch.randn(S, 48, device=device), torch.randn(S, 48, device=device)  # partial rotary
    want = kf.apply_rope(q, k, cos, sin, interleaved=interleaved)
    got = kf.apply_rope(_strided(q, kind), _strided(k, kind), cos, sin, interleaved=interleaved)
    for g, w in zip(got, want):
        assert torch.equal(g, w)
    qs, ks = _strided(q, kind), _strided(k, kind)
    kf.apply_rope(qs, ks, cos, sin, interleaved=interleaved, inplace=True)
    assert torch.equal(qs, want[0]) and torch.equal(ks, want[1])


@pytest.mark.parametrize("device", DEVICES)
def test_output_layout(kf, device):
    """Outputs (and input gradients) keep a dense input's strides, as HF's own elementwise RoPE does:
    q as the [B, H, S, D] view of [B, S, H, D] memory stays that; a padded view gives a contiguous
    output. The fake impl follows the same rule (opcheck compares the strides)."""
    B, S, Hq, Hk, D = 2, 5, 4, 2, 32
    q = R.rand((B, S, Hq, D), torch.float32, device).transpose(1, 2).requires_grad_()
    k = R.rand((B, S, Hk, D), torch.float32, device).transpose(1, 2).requires_grad_()
    cos, sin = torch.randn(B, S, D, device=device), torch.randn(B, S, D, device=device)
    q_out, k_out = kf.apply_rope(q, k, cos, sin, layout="bhsd")
    assert q_out.stride() == q.stride() and k_out.stride() == k.stride()
    torch.autograd.backward([q_out, k_out], [torch.randn_like(q_out), torch.randn_like(k_out)])
    assert q.grad.stride() == q.stride() and k.grad.stride() == k.stride()
    padded = _strided(R.rand((B, S, Hq, D), torch.float32, device), "padded")
    out, _ = kf.apply_rope(padded, None, cos, sin)
    assert out.is_contiguous()
    torch.library.opcheck(torch.ops.kernelforge.apply_rope, (q.detach(), k.detach(), cos, sin, None, False, "bhsd", 0))


@pytest.mark.cuda
def test_cuda_position_out_of_range_is_nan(kf):
    """The kernel cannot report bad positions: it reads nothing outside the cache and writes NaN into
    that token's rotated columns; passthrough columns are still copied."""
    q = torch.randn(1, 3, 2, 16, device="cuda")
    cos, sin = torch.randn(4, 8, device="cuda"), torch.randn(4, 8, device="cuda")
    pos = torch.tensor([[1, 4, -1]], device="cuda")
    out, _ = kf.apply_rope(q, None, cos, sin, position_ids=pos)
    assert out[0, 0].isfinite().all()
    assert out[0, 1:, :, :8].isnan().all()
    assert torch.equal(out[0, 1:, :, 8:], q[0, 1:, :, 8:])
