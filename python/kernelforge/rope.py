"""The RoPE family: fake (meta) implementations of its ops and the functional API.

The ops (CUDA kernel, the float64 CPU reference, autograd) live in C++ (`torch/kf_rope.cpp`, formulas
in include/kernelforge/rope.h). Arguments (including ``layout``) are validated in C++ only.

Semantics: for every rotated column j < R, out[j] = x[j] * cos[j] + rot(x)[j] * sin[j], with rot the
rotate-half of HF Llama (``interleaved=False``: pairs (i, i + R/2)) or the interleaved rotation of
GPT-J / diffusers ``apply_rotary_emb(use_real=True, use_real_unbind_dim=-1)`` (pairs (2i, 2i+1));
cos/sin as those libraries pass them (full rotary width, one value per column). Columns R.. pass
through. float32 math, one rounding.

LTX-Video helpers: ``ltx_video_rope`` builds the cos/sin tables of diffusers'
``LTXVideoRotaryPosEmbed`` (pure PyTorch, once per forward) and ``apply_rope_bsc`` applies them to
[B, S, C] query/key tensors (interleaved pairs over all C channels, before the split into heads).
"""

from __future__ import annotations

import math

import torch

from ._ops import _ops

def _like(t: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(t)  # the C++ impl's rule: t's strides when t is dense, else contiguous


@torch.library.register_fake("kernelforge::apply_rope")
def _apply_rope_fake(q, k, cos, sin, position_ids, interleaved, layout, rotary_dim):
    return _like(q), (_like(k) if k is not None else q.new_empty((0,)))


@torch.library.register_fake("kernelforge::apply_rope_backward")
def _apply_rope_backward_fake(dq_out, dk_out, cos, sin, position_ids, interleaved, layout, rotary_dim):
    return _like(dq_out), (_like(dk_out) if dk_out is not None else dq_out.new_empty((0,)))


@torch.library.register_fake("kernelforge::apply_rope_inplace")
def _apply_rope_inplace_fake(q, k, cos, sin, position_ids, interleaved, layout, rotary_dim):
    return None


def apply_rope(
    q: torch.Tensor,
    k: torch.Tensor | None,
    cos: torch.Tensor,
    sin: torch.Tensor,
    *,
    interleaved: bool = False,
    layout: str = "bshd",
    position_ids: torch.Tensor | None = None,
    rotary_dim: int | None = None,
    inplace: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Rotary position embedding of q and k in one call: returns (q_out, k_out).

    q: [B, S, Hq, D] (layout="bshd") or [B, Hq, S, D] ("bhsd"); k: the same layout with Hk heads
    (GQA), or None. cos, sin: [S, R] or [B, S, R] (HF's ``LlamaRotaryEmbedding`` output works as it
    is), or a cache [max_pos, R] indexed by ``position_ids`` [B, S] (int64). R = cos.shape[-1] <= D,
    even; ``rotary_dim``, when given, must equal it (a check). Columns R.. are passed through. cos/sin may be float32 with
    16-bit q/k. ``inplace=True`` rotates q and k in place and returns them (no autograd).
    Gradients flow to q and k (not to cos/sin).
    """
    rd = 0 if rotary_dim is None else int(rotary_dim)
    if inplace:
        if torch.is_grad_enabled() and (q.requires_grad or (k is not None and k.requires_grad)):
            raise RuntimeError(
                "apply_rope: inplace=True has no autograd support; use inplace=False for tensors that require grad"
            )
        _ops.apply_rope_inplace(q, k, cos, sin, position_ids, interleaved, layout, rd)
        return q, k
    q_out, k_out = _ops.apply_rope(q, k, cos, sin, position_ids, interleaved, layout, rd)
    return q_out, (k_out if k is not None else None)


def apply_rope_bsc(
    q: torch.Tensor,
    k: torch.Tensor | None,
    cos: torch.Tensor,
    sin: torch.Tensor,
    *,
    interleaved: bool = True,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """RoPE over the channels of [B, S, C] tensors, as LTX-Video rotates query and key before splitting
    them into heads: returns (q_out, k_out).

    q: [B, S, C]; k: the same shape, or None. cos, sin: [S, R], [B, S, R] or [1, S, R] with R <= C even
    (``ltx_video_rope`` returns [B, S, C], float32). The C channels are treated as one head of width C:
    the call is ``apply_rope(q[:, :, None], k[:, :, None], cos, sin, layout="bshd")``, a view, no copy.
    ``interleaved=True`` (the default here) pairs channels (2i, 2i + 1), the pairing of diffusers'
    LTX ``apply_rotary_emb``: ``out = x * cos + stack([-x_imag, x_real], -1).flatten(2) * sin``; False
    pairs (i, i + R/2). float32 math, one rounding, as diffusers. Gradients flow to q and k.
    """
    for name, t in (("q", q), ("k", k)):
        if t is not None and t.dim() != 3:
            raise ValueError(f"apply_rope_bsc: {name} must have 3 dimensions [B, S, C], got shape {list(t.shape)}")
    if k is not None and k.shape != q.shape:
        raise ValueError(f"apply_rope_bsc: k must have the shape of q {list(q.shape)}, got {list(k.shape)}")
    q_out, k_out = apply_rope(q.unsqueeze(2), None if k is None else k.unsqueeze(2), cos, sin,
                              interleaved=interleaved, layout="bshd")
    return q_out.squeeze(2), (k_out.squeeze(2) if k is not None else None)


def ltx_video_rope(
    num_frames: int | None,
    height: int | None,
    width: int | None,
    dim: int,
    *,
    batch_size: int = 1,
    rope_interpolation_scale: "tuple[float | torch.Tensor, float, float] | None" = None,
    video_coords: torch.Tensor | None = None,
    base_num_frames: int = 20,
    base_height: int = 2048,
    base_width: int = 2048,
    patch_size: int = 1,
    patch_size_t: int = 1,
    theta: float = 10000.0,
    device: "torch.device | str | None" = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin [batch_size, num_frames * height * width, dim] (float32) of LTX-Video's 3-D RoPE: the
    values diffusers' ``LTXVideoRotaryPosEmbed(dim, base_num_frames, base_height, base_width,
    patch_size, patch_size_t, theta)(hidden_states, num_frames, height, width,
    rope_interpolation_scale, video_coords)`` returns (diffusers 0.42), computed with the same float32
    torch ops in the same order. Pure PyTorch: it runs once per model forward, not per layer; the
    per-layer work is ``apply_rope_bsc(query, key, cos, sin)``.

    Tokens are ordered frame-major (f, h, w), as LTX flattens its latents. For token position
    p = (f, h, w) (scaled: p_0 * scale[0] * patch_size_t / base_num_frames, p_1 * scale[1] *
    patch_size / base_height, p_2 * scale[2] * patch_size / base_width when
    ``rope_interpolation_scale`` is given; ``video_coords`` [B, 3, S] instead gives p_0 / base_num_frames,
    p_1 / base_height, p_2 / base_width) and n = dim // 6 frequencies
    w_i = theta ** (i / (n - 1)) * pi / 2 (``theta ** linspace(0, 1, n)``; n = 1: pi / 2), the angles are
    w_i * (2 p_a - 1) for i < n, a < 3, ordered frequency-major (i, then axis a), each repeated twice
    (interleaved pairs). When dim % 6 != 0 the first dim % 6 columns are cos = 1, sin = 0 (not rotated).
    """
    if video_coords is None:
        if num_frames is None or height is None or width is None:
            raise ValueError("ltx_video_rope: num_frames, height and width are required without video_coords")
        f32 = torch.float32
        # grid [B, 3, F, H, W]: the (frame, row, column) index of every latent token
        grid_h = torch.arange(height, dtype=f32, device=device)
        grid_w = torch.arange(width, dtype=f32, device=device)
        grid_f = torch.arange(num_frames, dtype=f32, device=device)
        grid = torch.stack(torch.meshgrid(grid_f, grid_h, grid_w, indexing="ij"), dim=0)
        grid = grid.unsqueeze(0).repeat(batch_size, 1, 1, 1, 1)
        if rope_interpolation_scale is not None:  # positions in units of the base grid (same op order as diffusers)
            s = rope_interpolation_scale
            grid[:, 0:1] = grid[:, 0:1] * s[0] * patch_size_t / base_num_frames
            grid[:, 1:2] = grid[:, 1:2] * s[1] * patch_size / base_height
            grid[:, 2:3] = grid[:, 2:3] * s[2] * patch_size / base_width
        grid = grid.flatten(2, 4).transpose(1, 2)  # [B, S, 3]
    else:
        device = video_coords.device if device is None else device
        grid = torch.stack([video_coords[:, 0] / base_num_frames, video_coords[:, 1] / base_height,
                            video_coords[:, 2] / base_width], dim=-1)
    # n = dim // 6 frequencies theta^(i / (n - 1)) * pi / 2 (two columns per angle, three axes)
    freqs = theta ** torch.linspace(math.log(1.0, theta), math.log(theta, theta), dim // 6, device=device,
                                    dtype=torch.float32)
    freqs = freqs * math.pi / 2.0
    freqs = freqs * (grid.unsqueeze(-1) * 2 - 1)  # [B, S, 3, n]: positions mapped to [-1, 1]
    freqs = freqs.transpose(-1, -2).flatten(2)  # [B, S, 3n]: frequency-major, the three axes adjacent
    cos = freqs.cos().repeat_interleave(2, dim=-1)  # pairs (2j, 2j + 1) share an angle: interleaved
    sin = freqs.sin().repeat_interleave(2, dim=-1)
    if dim % 6 != 0:  # leading columns not rotated
        cos = torch.cat([torch.ones_like(cos[:, :, : dim % 6]), cos], dim=-1)
        sin = torch.cat([torch.zeros_like(cos[:, :, : dim % 6]), sin], dim=-1)
    return cos, sin
