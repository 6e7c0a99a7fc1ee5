"""LTX-Video RoPE helpers: kernelforge.ltx_video_rope (the cos/sin tables) against diffusers' own
LTXVideoRotaryPosEmbed (bit for bit: the same float32 torch ops), and kernelforge.apply_rope_bsc
([B, S, C] query/key, interleaved pairs over all channels) against diffusers' LTX apply_rotary_emb.
On CPU the op runs the float64 C++ reference; on CUDA the kernel."""

from __future__ import annotations

import importlib

import pytest
import torch

import norm_ref as R
from norm_ref import DEVICES, DTYPES

f64 = torch.float64


def _ltx():
    pytest.importorskip("diffusers")  # per test: a module-level skip would hide the CUDA tests from KF_REQUIRE_GPU
    return importlib.import_module("diffusers.models.transformers.transformer_ltx")


# (dim, num_frames, height, width, batch, rope_interpolation_scale, patch_size, patch_size_t)
TABLE_CASES = [
    (64, 3, 4, 5, 2, None, 1, 1),
    (2048, 2, 3, 4, 1, (8 / 25, 32, 32), 1, 1),  # LTXPipeline: (1 / latent frame rate, VAE ratio, VAE ratio)
    (70, 3, 2, 5, 2, (0.5, 2.0, 3.0), 2, 3),  # dim % 6 != 0: leading columns cos = 1, sin = 0
    (96, 1, 1, 1, 1, (torch.tensor(0.25), 1.0, 1.0), 1, 1),  # one token; a tensor scale as diffusers allows
]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("case", TABLE_CASES, ids=lambda c: f"dim{c[0]}-{c[1]}x{c[2]}x{c[3]}-b{c[4]}")
def test_tables_match_diffusers(kf, case, device):
    dim, F, H, W, B, scale, ps, pt = case
    T = _ltx()
    module = T.LTXVideoRotaryPosEmbed(dim, patch_size=ps, patch_size_t=pt)
    if scale is not None and isinstance(scale[0], torch.Tensor):
        scale = (scale[0].to(device), *scale[1:])
    want_cos, want_sin = module(torch.zeros(B, 1, 1, device=device), F, H, W, scale)
    cos, sin = kf.ltx_video_rope(F, H, W, dim, batch_size=B, rope_interpolation_scale=scale, patch_size=ps,
                                 patch_size_t=pt, device=device)
    assert cos.shape == sin.shape == (B, F * H * W, dim) and cos.dtype == torch.float32
    assert cos.device == want_cos.device
    assert torch.equal(cos, want_cos) and torch.equal(sin, want_sin)
    if dim % 6:
        assert (cos[..., : dim % 6] == 1).all() and (sin[..., : dim % 6] == 0).all()


@pytest.mark.parametrize("device", DEVICES)
def test_tables_from_video_coords(kf, device):
    T = _ltx()
    coords = torch.rand(2, 3, 11, device=device) * torch.tensor([8.0, 512.0, 768.0], device=device)[:, None]
    module = T.LTXVideoRotaryPosEmbed(132, base_num_frames=16, base_height=1024, base_width=1024, theta=500.0)
    want_cos, want_sin = module(torch.zeros(2, 1, 1, device=device), video_coords=coords)
    cos, sin = kf.ltx_video_rope(None, None, None, 132, video_coords=coords, base_num_frames=16, base_height=1024,
                                 base_width=1024, theta=500.0)
    assert torch.equal(cos, want_cos) and torch.equal(sin, want_sin)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("device", DEVICES)
def test_apply_matches_diffusers(kf, device, dtype):
    """The LTX attention processor's two calls apply_rotary_emb(query, ...) and apply_rotary_emb(key, ...)
    (float32 math, one rounding) against one apply_rope_bsc(query, key, ...)."""
    T = _ltx()
    B, F, H, W, C = 2, 2, 3, 4, 132  # 132 = 6 * 22: no padding columns; 2 heads of 66 in the model
    cos, sin = kf.ltx_video_rope(F, H, W, C, batch_size=B, rope_interpolation_scale=(0.32, 32, 32), device=device)
    q = R.rand((B, F * H * W, C), dtype, device, scale=2.0)
    k = R.rand((B, F * H * W, C), dtype, device, scale=2.0)
    q_out, k_out = kf.apply_rope_bsc(q, k, cos, sin)
    R.assert_close(q_out, T.apply_rotary_emb(q, (cos, sin)), dtype, msg="q")
    R.assert_close(k_out, T.apply_rotary_emb(k, (cos, sin)), dtype, msg="k")
    only_q, none = kf.apply_rope_bsc(q, None, cos, sin)
    assert none is None and torch.equal(only_q, q_out)
    # [1, S, C] tables broadcast over the batch; so do [S, C] tables
    q1, _ = kf.apply_rope_bsc(q, None, cos[:1], sin[:1])
    q2, _ = kf.apply_rope_bsc(q, None, cos[0], sin[0])
    assert torch.equal(q1, q_out) and torch.equal(q2, q_out)


def test_apply_float64_cpu(kf):
    """float64 against diffusers' function in float64 (inputs representable in float32, so its x.float() is
    exact and its products are float64): the CPU reference agrees to 1e-12."""
    T = _ltx()
    B, S, C = 2, 24, 64
    cos, sin = kf.ltx_video_rope(2, 3, 4, C, batch_size=B)
    cos, sin = cos.to(f64), sin.to(f64)
    x = torch.randn(B, S, C).to(f64)
    out, _ = kf.apply_rope_bsc(x, None, cos, sin)
    R.assert_close(out, T.apply_rotary_emb(x, (cos, sin)), f64)


@pytest.mark.parametrize("device", DEVICES)
def test_apply_gradients(kf, device):
    T = _ltx()
    B, S, C = 2, 12, 48
    cos, sin = kf.ltx_video_rope(1, 3, 4, C, batch_size=B, device=device)
    q = R.rand((B, S, C), torch.float32, device).requires_grad_()
    k = R.rand((B, S, C), torch.float32, device).requires_grad_()
    gq, gk = R.rand((B, S, C), torch.float32, device), R.rand((B, S, C), torch.float32, device)
    q_out, k_out = kf.apply_rope_bsc(q, k, cos, sin)
    dq, dk = torch.autograd.grad((q_out, k_out), (q, k), (gq, gk))
    want_dq, want_dk = torch.autograd.grad(
        (T.apply_rotary_emb(q, (cos, sin)), T.apply_rotary_emb(k, (cos, sin))), (q, k), (gq, gk))
    R.assert_close(dq, want_dq.double(), torch.float32, grad=True, msg="dq")
    R.assert_close(dk, want_dk.double(), torch.float32, grad=True, msg="dk")


def test_strided_input(kf):
    """A channel slice of a wider buffer (stride of S != C) goes in as it is."""
    T = _ltx()
    cos, sin = kf.ltx_video_rope(2, 2, 2, 36, batch_size=2)
    big = torch.randn(2, 8, 50)
    x = big[:, :, 7:43]
    out, _ = kf.apply_rope_bsc(x, None, cos, sin)
    R.assert_close(out, T.apply_rotary_emb(x.contiguous(), (cos, sin)), torch.float32)


# ---- bad inputs: clear errors ---------------------------------------------------------------------------


def test_errors(kf):
    B, S, C = 2, 8, 64
    q, k = torch.randn(B, S, C), torch.randn(B, S, C)
    cos, sin = torch.randn(B, S, C), torch.randn(B, S, C)
    with pytest.raises(ValueError, match=r"q must have 3 dimensions \[B, S, C\], got shape \[2, 8, 4, 16\]"):
        kf.apply_rope_bsc(q.view(B, S, 4, 16), None, cos, sin)
    with pytest.raises(ValueError, match=r"k must have the shape of q \[2, 8, 64\], got \[2, 8, 32\]"):
        kf.apply_rope_bsc(q, k[..., :32], cos, sin)
    with pytest.raises(RuntimeError, match=r"cos and sin must have shape \[S, rotary_dim\] = \[8, 64\]"):
        kf.apply_rope_bsc(q, k, cos[:, :5], sin[:, :5])  # 5 positions for 8 tokens
    with pytest.raises(RuntimeError, match=r"sin must have the shape of cos"):
        kf.apply_rope_bsc(q, k, cos, sin[:, :, :32])
    with pytest.raises(RuntimeError, match=r"rotary_dim .* must be even"):
        kf.apply_rope_bsc(q, k, cos[..., :31], sin[..., :31])
    with pytest.raises(RuntimeError, match=r"rotary_dim .* must not exceed head_dim 64, got 66"):
        kf.apply_rope_bsc(q, k, torch.randn(B, S, 66), torch.randn(B, S, 66))
    with pytest.raises(RuntimeError, match=r"k must have the same dtype as q \(float32\), got float16"):
        kf.apply_rope_bsc(q, k.half(), cos, sin)
    with pytest.raises(RuntimeError, match=r"cos must have the dtype of q \(float32\) or float32, got float16"):
        kf.apply_rope_bsc(q, k, cos.half(), sin.half())
    with pytest.raises(RuntimeError, match=r"sin must have the dtype of cos"):
        kf.apply_rope_bsc(q, k, cos, sin.double())
    with pytest.raises(RuntimeError, match="gradients with respect to cos and sin are not implemented"):
        kf.apply_rope_bsc(q, k, cos.clone().requires_grad_(), sin)
    with pytest.raises(ValueError, match="num_frames, height and width are required without video_coords"):
        kf.ltx_video_rope(2, None, 4, 64)


@pytest.mark.cuda
def test_errors_devices(kf):
    q = torch.randn(2, 8, 64, device="cuda")
    cos, sin = torch.randn(2, 8, 64), torch.randn(2, 8, 64)
    with pytest.raises(RuntimeError, match=r"cos must be on the same device as q \(cuda:0\), got cpu"):
        kf.apply_rope_bsc(q, None, cos, sin)
    with pytest.raises(RuntimeError, match=r"k must be on the same device as q"):
        kf.apply_rope_bsc(q, q.cpu(), cos.cuda(), sin.cuda())
