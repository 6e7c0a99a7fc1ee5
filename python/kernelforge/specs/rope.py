"""The rope family: apply_rope (rotary position embedding of q and k in one call).

Bench shapes are RopeShapes (b{B}s{S}h{Hq}/{Hk}d{D}); check shapes (B, S, Hq, Hk, D, R) with R the
rotary width (partial rotary when R < D).
"""

from __future__ import annotations

import torch

from ._spec import OpSpec, RopeShape, check_out, f64, kf, poison, randn

# ---- float64 reference ----------------------------------------------------------------------------


def rope_ref(x, cos, sin, interleaved: bool, layout: str, dtype=f64):
    """out[j] = x[j] cos[j] + rot(x)[j] sin[j] for j < R, columns R.. unchanged. rot: HF's rotate_half
    on x[..., :R] (cat(-x2, x1)), or the interleaved pairs (2i, 2i+1) -> (-x_{2i+1}, x_{2i}) of GPT-J /
    diffusers. x [B, S, H, D] (layout "bshd") or [B, H, S, D] ("bhsd"); cos/sin [B, S, R] or [S, R],
    broadcast over the heads. Math in float64, one rounding to dtype."""
    x, cos, sin = x.to(f64), cos.to(f64), sin.to(f64)
    R = cos.shape[-1]
    xr = x[..., :R]
    if interleaved:
        rot = torch.stack((-xr[..., 1::2], xr[..., 0::2]), dim=-1).flatten(-2)
    else:
        rot = torch.cat((-xr[..., R // 2:], xr[..., :R // 2]), dim=-1)
    if layout == "bshd":  # [.., S, 1, R] against [B, S, H, R]
        cos, sin = cos.unsqueeze(-2), sin.unsqueeze(-2)
    elif cos.dim() == 3:  # [B, 1, S, R] against [B, H, S, R] ([S, R] broadcasts as it is)
        cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
    return torch.cat((xr * cos + rot * sin, x[..., R:]), dim=-1).to(dtype)


def hf_rope_tables(position_ids: torch.Tensor, d: int, dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin [B, S, D] in `dtype` for position_ids [B, S], as transformers' LlamaRotaryEmbedding
    computes them (rope_theta 10000, no scaling): angles in float32, emb = cat(freqs, freqs) (the
    rotate-half pairing's duplicated halves), cos/sin in float32, then cast to q's dtype."""
    inv_freq = 1.0 / 10000.0 ** (torch.arange(0, d, 2, device=position_ids.device, dtype=torch.float32) / d)
    freqs = position_ids.float()[..., None] * inv_freq
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos().to(dtype), emb.sin().to(dtype)


# ---- traffic and arithmetic -----------------------------------------------------------------------
# Bytes = (QK_TENSORS * (|q| + |k|) + TABLES * B*S*D) * element size, |q| + |k| = B*S*(Hq + Hk)*D.
# fwd reads q, k, cos, sin and writes q_out, k_out; bwd reads dq_out, dk_out, cos, sin and writes dq,
# dk (the rotation is linear: it needs no q or k). Counting cos/sin, our GB/s is (Hq + Hk + 1) /
# (Hq + Hk) of a count over q and k only (1.025x at 32/8 heads).
QK_TENSORS = {"fwd": 2, "fwdbwd": 4}
TABLES = {"fwd": 2, "fwdbwd": 4}
FLOPS_PER_ELT = {"fwd": 3, "fwdbwd": 6}  # x*cos + rot(x)*sin: 2 mul, 1 add (rot: a sign and a swap); bwd the same


def _bytes(shape, mode, elt):
    b, s, hq, hk, d = shape
    return (QK_TENSORS[mode] * b * s * (hq + hk) * d + TABLES[mode] * b * s * d) * elt


def _flops(shape, mode):
    b, s, hq, hk, d = shape
    return FLOPS_PER_ELT[mode] * b * s * (hq + hk) * d


# ---- bench ----------------------------------------------------------------------------------------


def _inputs(shape, dtype, device, gen):
    b, s, hq, hk, d = shape
    t = {}
    # HF Llama attention: q_proj(x).view(B, S, H, D).transpose(1, 2), a [B, H, S, D] view of
    # [B, S, H, D] memory; the gradients from attention are laid out the same way.
    for name, heads in (("q", hq), ("k", hk), ("dq_out", hq), ("dk_out", hk)):
        t[name] = randn(gen, device, dtype, b, s, heads, d).transpose(1, 2)
    # each sequence starts at a random position < 4096 (a decode step is then not at position 0, where
    # sin = 0 and the rotation is the identity)
    start = torch.randint(0, 4096, (b, 1), generator=gen, device=device)
    t["cos"], t["sin"] = hf_rope_tables(start + torch.arange(s, device=device), d, dtype)
    return t


def _kf_run(t):  # HF's strided [B, H, S, D] views as they are (any strides, last one 1)
    return kf().apply_rope(t["q"], t["k"], t["cos"], t["sin"], layout="bhsd")


def _eager():
    """transformers' Llama apply_rotary_pos_emb, as LlamaAttention.forward calls it (unsqueeze_dim=1).
    Imported when the provider is made: transformers is no dependency of the bench; without it this
    peer (and compile) fails and the run goes on."""
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb  # noqa: PLC0415

    return lambda t: apply_rotary_pos_emb(t["q"], t["k"], t["cos"], t["sin"])


def _liger():
    """Liger's liger_rotary_pos_emb (what its HF Llama patch installs). Its Triton kernel works in place
    on HF's [B, H, S, D] views of [B, S, H, D] memory (and in the backward on dq_out, dk_out): later
    timed calls then run on rotated values, which changes no timing; each mode's correctness check
    runs first, and Liger runs last of the providers."""
    try:
        from liger_kernel.transformers.rope import liger_rotary_pos_emb  # noqa: PLC0415
    except Exception:  # noqa: BLE001
        return None
    return lambda t: liger_rotary_pos_emb(t["q"], t["k"], t["cos"], t["sin"])


# The anchors' rope_fwd rows (Llama-3-8B heads, 16 K tokens), then two decode steps (1 and 64 tokens:
# fwd_graph and fwd_call too).
SHAPES = (RopeShape(4, 4096, 32, 8, 128), RopeShape(1, 16384, 32, 8, 128),
          RopeShape(1, 1, 32, 8, 128), RopeShape(64, 1, 32, 8, 128))

# ---- kforge check ---------------------------------------------------------------------------------
# (B, S, Hq, Hk, D, R): Llama GQA heads, a decode step, MQA with a quarter of the head rotated,
# Phi-like partial rotary (D = 80), a head_dim that is no multiple of the 16-byte vector (67, R = 66:
# the one-element path), 40 + 8 heads of 256 (several rounds of heads per thread), more tokens.
CHECK_SHAPES = ((2, 33, 8, 2, 128, 128), (1, 1, 32, 8, 128, 128), (3, 7, 4, 1, 128, 32),
                (1, 13, 5, 5, 80, 32), (1, 7, 2, 1, 67, 66), (1, 5, 40, 8, 256, 256),
                (2, 64, 16, 4, 128, 128))
# Pairing; layout (bhsd: HF attention's view of [B, S, H, D] memory, or a contiguous [B, H, S, D]);
# cos/sin: [B, S, R] in q's dtype (HF), [S, R] float32 (diffusers), or a float32 cache [P, R] read
# through position_ids [B, S].
VARIANTS = (
    {"interleaved": False, "layout": "bshd", "view": False, "tables": "BSR"},
    {"interleaved": False, "layout": "bhsd", "view": True, "tables": "BSR"},
    {"interleaved": False, "layout": "bhsd", "view": False, "tables": "SR32"},
    {"interleaved": False, "layout": "bshd", "view": False, "tables": "cache"},
    {"interleaved": True, "layout": "bshd", "view": False, "tables": "SR32"},
    {"interleaved": True, "layout": "bhsd", "view": True, "tables": "BSR"},
    {"interleaved": True, "layout": "bhsd", "view": False, "tables": "cache"},
)


def check_label(shape) -> str:
    B, S, Hq, Hk, D, R = shape
    return f"b{B}s{S}h{Hq}/{Hk}d{D}" + (f"r{R}" if R != D else "")


def _check_inputs(shape, v, dtype, device):
    B, S, Hq, Hk, D, R = shape

    def heads(H):
        if v["layout"] == "bshd":
            return randn(None, device, dtype, B, S, H, D)
        if v["view"]:
            return randn(None, device, dtype, B, S, H, D).transpose(1, 2)
        return randn(None, device, dtype, B, H, S, D)

    def table(*shape, dt):
        # uniform in [-1, 1] per column, not a real cos/sin table: the two members of a pair read
        # different values, so a kernel that mixes up a pair's cos/sin indices fails (the op's formula
        # is per column, as the libraries' is)
        return (torch.rand(*shape, device=device) * 2 - 1).to(dt)

    t = {"q": heads(Hq), "k": heads(Hk), "dq_out": heads(Hq), "dk_out": heads(Hk), "position_ids": None}
    if v["tables"] == "BSR":
        t["cos"], t["sin"] = table(B, S, R, dt=dtype), table(B, S, R, dt=dtype)
    elif v["tables"] == "SR32":
        t["cos"], t["sin"] = table(S, R, dt=torch.float32), table(S, R, dt=torch.float32)
    else:
        P = S + 5  # cache rows; positions in any order, repeats allowed
        t["cos"], t["sin"] = table(P, R, dt=torch.float32), table(P, R, dt=torch.float32)
        t["position_ids"] = torch.randint(0, P, (B, S), device=device)
    return t


def _kwargs(t, v):
    # rotary_dim given explicitly (it must equal cos.shape[-1]): partial rotary when R < D
    return {"interleaved": v["interleaved"], "layout": v["layout"], "position_ids": t["position_ids"],
            "rotary_dim": t["cos"].shape[-1]}


def _check_run(kfm, t, v):
    q, k = t["q"].detach().clone().requires_grad_(True), t["k"].detach().clone().requires_grad_(True)
    poison([q.shape, k.shape] * 2, q.dtype, q.device)
    q_out, k_out = kfm.apply_rope(q, k, t["cos"], t["sin"], **_kwargs(t, v))
    check_out("q_out", q_out, q.shape, q.dtype)
    check_out("k_out", k_out, k.shape, k.dtype)
    dq, dk = torch.autograd.grad([q_out, k_out], [q, k], [t["dq_out"], t["dk_out"]])
    check_out("dq", dq, q.shape, q.dtype)
    check_out("dk", dk, k.shape, k.dtype)
    # the in-place op on copies of q and k (same strides): its own kernel path (passthrough columns are
    # not rewritten)
    q_in, k_in = t["q"].clone(), t["k"].clone()
    kfm.apply_rope(q_in, k_in, t["cos"], t["sin"], inplace=True, **_kwargs(t, v))
    return {"q_out": q_out.detach(), "k_out": k_out.detach(), "dq": dq, "dk": dk,
            "q_inplace": q_in, "k_inplace": k_in}


def _cpp_reference(a, v):
    ops = torch.ops.kernelforge
    args = (a["cos"], a["sin"], a["position_ids"], v["interleaved"], v["layout"], 0)
    q_out, k_out = ops.apply_rope(a["q"], a["k"], *args)
    dq, dk = ops.apply_rope_backward(a["dq_out"], a["dk_out"], *args)
    return {"q_out": q_out, "k_out": k_out, "dq": dq, "dk": dk, "q_inplace": q_out, "k_inplace": k_out}


def _reference(a, v):
    cos, sin = a["cos"], a["sin"]
    if a["position_ids"] is not None:  # the cache rows of each token: [B, S, R]
        cos, sin = cos[a["position_ids"]], sin[a["position_ids"]]
    q, k = a["q"].requires_grad_(True), a["k"].requires_grad_(True)
    q_out = rope_ref(q, cos, sin, v["interleaved"], v["layout"])
    k_out = rope_ref(k, cos, sin, v["interleaved"], v["layout"])
    dq, dk = torch.autograd.grad([q_out, k_out], [q, k], [a["dq_out"], a["dk_out"]])
    return {"q_out": q_out.detach(), "k_out": k_out.detach(), "dq": dq, "dk": dk,
            "q_inplace": q_out.detach(), "k_inplace": k_out.detach()}


APPLY_ROPE = OpSpec(
    name="apply_rope", family="rope", shape_kind="rope",
    inputs=_inputs, run=_kf_run, grad_inputs=("q", "k"), grad_outputs=("dq_out", "dk_out"),
    outputs=("q_out", "k_out"), row_bytes=_bytes, flops=_flops, shapes=SHAPES,
    # no fused PyTorch op; Liger has the HF rotate-half RoPE
    eager=_eager, liger=_liger, providers=("kernelforge", "eager", "compile", "liger"),
    check_shapes=CHECK_SHAPES, variants=VARIANTS, check_inputs=_check_inputs, check_run=_check_run,
    cpp_reference=_cpp_reference, reference=_reference, check_label=check_label,
)

SPECS = (APPLY_ROPE,)
