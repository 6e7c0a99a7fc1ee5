"""`kforge check`: every op (norm, activation and RoPE), forward and backward, on the current GPU
against float64 oracles.

For each op, dtype (bf16, fp16, fp32), shape (one row, N = 1, odd N, long rows, ...; RoPE: GQA, MQA,
decode, partial rotary, odd head_dim, many heads) and variant (with / without weight and bias; AdaLN
layer and rms kinds, three scale shapes; GELU erf / tanh, gate first / second; RoPE rotate-half /
interleaved, bshd / bhsd (contiguous or HF attention's view of [B, S, H, D] memory), cos/sin
[B, S, R] in q's dtype, [S, R] float32 or a float32 cache read through position_ids), on fresh
random data:

  * the GPU result through the public API (kf.*, autograd for the gradients) is compared with
    (a) the op's own CPU implementation, the C++ float64 reference, run on the inputs upcast to
        float64, and
    (b) an independent float64 PyTorch formula (autograd for its gradients),
  * NaN/Inf never passes; the allocator is pre-filled with NaN blocks of the outputs' sizes before
    each GPU call (best effort: an output element the kernel forgets then shows up as NaN),
  * the GPU forward and backward are run twice and must be bit-identical (fixed reduction order);
  * apply_rope also runs in place (inplace=True) on copies of q and k, checked like its outputs.

Error = max|got - ref| / max(max|ref|, 1), plus the relative L2 error (same floor of 1); PASS needs both under the
dtype's tolerance against both oracles. Prints one PASS/FAIL line per op and dtype; exit status 1
if anything FAILs, 2 without a GPU or without the extension.
"""
from __future__ import annotations

import argparse
import math
import os
import sys
import time
from dataclasses import dataclass, field

import torch

NORM_OPS = ("rms_norm", "add_rms_norm", "layer_norm", "ada_norm")
ACT_OPS = ("silu_and_mul", "swiglu", "gelu_and_mul", "geglu", "gelu")
ROPE_OPS = ("apply_rope",)
# softmax / log_softmax: checked like a one-input activation (x, dy -> y, dx)
SOFTMAX_OPS = ("softmax", "log_softmax")
OPS = NORM_OPS + ACT_OPS + ROPE_OPS + SOFTMAX_OPS
SPLIT_OPS = ("silu_and_mul", "gelu_and_mul")  # x [..., 2I] -> y [..., I]; shapes give I
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
# (max error relative to max|ref|, relative L2 error): bf16/fp16 allow a couple of roundings of
# the result; fp32 only accumulation-order differences.
TOL = {torch.float32: (1e-4, 3e-5), torch.float16: (4e-3, 2e-3), torch.bfloat16: (2e-2, 8e-3)}
# one per code path: a single row, N = 1, odd N, N not a multiple of the vector width, a mid-size
# batch, and long rows that do not fit one pass of registers
SHAPES = ((1, 4096), (3, 1), (7, 1000), (19, 4097), (128, 2048), (2, 65536), (1, 131072))
EPS = {"rms_norm": 1e-6, "add_rms_norm": 1e-6, "layer_norm": 1e-5, "ada_norm": 1e-6}
# apply_rope (B, S, Hq, Hk, D, R): Llama GQA heads, a decode step, MQA with a quarter of the head
# rotated, Phi-like partial rotary (D = 80), a head_dim that is no multiple of the 16-byte vector (67,
# R = 66: the one-element path), 40 + 8 heads of 256 (several rounds of heads per thread), more tokens
ROPE_SHAPES = ((2, 33, 8, 2, 128, 128), (1, 1, 32, 8, 128, 128), (3, 7, 4, 1, 128, 32),
               (1, 13, 5, 5, 80, 32), (1, 7, 2, 1, 67, 66), (1, 5, 40, 8, 256, 256),
               (2, 64, 16, 4, 128, 128))

# variants: which optional tensors are present (and, for ada_norm, the kind and scale shape)
VARIANTS = {
    "rms_norm": ({"weight": True}, {"weight": False}),
    "add_rms_norm": ({"weight": True}, {"weight": False}),
    "layer_norm": ({"weight": True, "bias": True}, {"weight": False, "bias": False}),
    "ada_norm": (
        {"kind": "layer", "weight": False, "bias": False, "mod": "B1N"},
        {"kind": "layer", "weight": True, "bias": True, "mod": "N"},
        {"kind": "rms", "weight": False, "bias": False, "mod": "B1N"},
        {"kind": "rms", "weight": True, "bias": False, "mod": "BSN"},
    ),
    "silu_and_mul": ({},),
    "swiglu": ({},),
    "gelu_and_mul": tuple({"approximate": a, "gate_first": g} for a in ("tanh", "none") for g in (True, False)),
    "geglu": ({"approximate": "none"}, {"approximate": "tanh"}),
    "gelu": ({"approximate": "none"}, {"approximate": "tanh"}),
    "softmax": ({},),
    "log_softmax": ({},),
    # pairing; layout (bhsd: HF attention's q_proj(x).view(B, S, H, D).transpose(1, 2), a view of
    # [B, S, H, D] memory, or a contiguous [B, H, S, D]); cos/sin tables: [B, S, R] in q's dtype
    # (HF), [S, R] float32 (diffusers), or a float32 cache [P, R] read through position_ids [B, S]
    "apply_rope": (
        {"interleaved": False, "layout": "bshd", "view": False, "tables": "BSR"},
        {"interleaved": False, "layout": "bhsd", "view": True, "tables": "BSR"},
        {"interleaved": False, "layout": "bhsd", "view": False, "tables": "SR32"},
        {"interleaved": False, "layout": "bshd", "view": False, "tables": "cache"},
        {"interleaved": True, "layout": "bshd", "view": False, "tables": "SR32"},
        {"interleaved": True, "layout": "bhsd", "view": True, "tables": "BSR"},
        {"interleaved": True, "layout": "bhsd", "view": False, "tables": "cache"},
    ),
}


def variant_label(v: dict) -> str:
    parts = [v["kind"]] if "kind" in v else []
    parts += [k for k in ("weight", "bias") if v.get(k)]
    if "mod" in v:
        parts.append("scale[" + ",".join(v["mod"]) + "]")
    if "approximate" in v:
        parts.append(v["approximate"])
    if "gate_first" in v:
        parts.append("gate_first" if v["gate_first"] else "gate_second")
    if "interleaved" in v:
        parts.append("interleaved" if v["interleaved"] else "rotate_half")
        parts.append(v["layout"] + ("_view" if v["view"] else ""))
        parts.append({"BSR": "cos[B,S,R]", "SR32": "cos[S,R]f32", "cache": "cache+position_ids"}[v["tables"]])
    return "+".join(parts) if parts else "plain"


def shape_label(op: str, shape: tuple) -> str:
    """ROWSxN; apply_rope b{B}s{S}h{Hq}/{Hk}d{D} as in the bench, plus r{R} for partial rotary."""
    if op in ROPE_OPS:
        B, S, Hq, Hk, D, R = shape
        return f"b{B}s{S}h{Hq}/{Hk}d{D}" + (f"r{R}" if R != D else "")
    return f"{shape[0]}x{shape[1]}"


# ---- inputs ----------------------------------------------------------------------------------

def make_inputs(op: str, shape: tuple, v: dict, dtype, device) -> dict:
    """Fresh random inputs in `dtype` (never zeros), on `device`."""

    def rnd(*shape, scale=1.0, offset=0.0):
        return (torch.randn(*shape, device=device) * scale + offset).to(dtype)

    if op in ROPE_OPS:
        return _rope_inputs(shape, v, dtype, device, rnd)
    rows, n = shape

    if op in ACT_OPS or op in SOFTMAX_OPS:  # n = the output width I; inputs N(0, 2^2) reach both tails
        t = {name: rnd(rows, n, scale=2.0) for name in grad_names(op, {})}
        if op in SPLIT_OPS:
            t["x"] = rnd(rows, 2 * n, scale=2.0)
        t["dy"] = rnd(rows, n)
        return t
    t = {"weight": None, "bias": None}
    if op == "ada_norm":
        b = 2 if rows >= 2 and rows % 2 == 0 else 1
        s = rows // b
        t["x"] = rnd(b, s, n)
        mshape = {"N": (n,), "B1N": (b, 1, n), "BSN": (b, s, n)}[v["mod"]]
        t["scale"] = rnd(*mshape, scale=0.5)
        t["shift"] = rnd(*mshape, scale=0.5)
    else:
        t["x"] = rnd(rows, n)
    if op == "add_rms_norm":
        t["residual"] = rnd(rows, n)
    if v.get("weight"):
        t["weight"] = rnd(n, scale=0.5, offset=1.0)
    if v.get("bias"):
        t["bias"] = rnd(n, scale=0.5)
    t["dy"] = rnd(*t["x"].shape)
    if op == "add_rms_norm":
        t["ds"] = rnd(rows, n)  # gradient flowing into s = x + residual from later layers
    return t


def _rope_inputs(shape: tuple, v: dict, dtype, device, rnd) -> dict:
    B, S, Hq, Hk, D, R = shape

    def heads(H):
        if v["layout"] == "bshd":
            return rnd(B, S, H, D)
        return rnd(B, S, H, D).transpose(1, 2) if v["view"] else rnd(B, H, S, D)

    def table(*shape, dt):
        # uniform in [-1, 1] per column, not a real cos/sin table: the two members of a pair read
        # different values, so a kernel that mixes up a pair's cos/sin indices fails (the op's
        # formula is per column, as the libraries' is)
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


def grad_names(op: str, t: dict) -> list[str]:
    names = {"rms_norm": ["x", "weight"], "add_rms_norm": ["x", "residual", "weight"],
             "layer_norm": ["x", "weight", "bias"],
             "ada_norm": ["x", "scale", "shift", "weight", "bias"],
             "silu_and_mul": ["x"], "swiglu": ["gate", "up"], "gelu_and_mul": ["x"],
             "geglu": ["hidden", "gate"], "gelu": ["x"], "apply_rope": ["q", "k"],
             "softmax": ["x"], "log_softmax": ["x"]}[op]
    if op in ACT_OPS or op in ROPE_OPS or op in SOFTMAX_OPS:
        return names
    return [k for k in names if t.get(k) is not None]


# ---- the GPU path through the public API ------------------------------------------------------

def _poison(shapes, dtype, device):
    """Leave NaN-filled blocks of these sizes in the caching allocator for the next outputs."""
    if device.type != "cuda":
        return
    blocks = [torch.full(s, float("nan"), dtype=dtype, device=device) for s in shapes]
    del blocks


def run_kf(kf, op: str, t: dict, v: dict) -> dict:
    """Outputs and gradients through kf.* and autograd."""
    names = grad_names(op, t)
    leaves = {k: t[k].detach().clone().requires_grad_(True) for k in names}
    a = {**t, **leaves}
    if op in ACT_OPS or op in SOFTMAX_OPS:
        return _run_kf_act(kf, op, t, v, a, leaves, names)
    if op in ROPE_OPS:
        return _run_kf_rope(kf, t, v, leaves)
    _poison([a["x"].shape] * 2 + [leaves[k].shape for k in names], a["x"].dtype, a["x"].device)
    eps = EPS[op]
    if op == "rms_norm":
        outs = {"y": kf.rms_norm(a["x"], a["weight"], eps)}
        grads_out = [(outs["y"], a["dy"])]
    elif op == "add_rms_norm":
        y, s = kf.add_rms_norm(a["x"], a["residual"], a["weight"], eps)
        outs = {"y": y, "s": s}
        grads_out = [(y, a["dy"]), (s, a["ds"])]
    elif op == "layer_norm":
        outs = {"y": kf.layer_norm(a["x"], a["weight"], a["bias"], eps)}
        grads_out = [(outs["y"], a["dy"])]
    else:
        outs = {"y": kf.ada_norm(a["x"], a["scale"], a["shift"], a["weight"], a["bias"], eps,
                                 kind=v["kind"])}
        grads_out = [(outs["y"], a["dy"])]
    for k, o in outs.items():
        want = a["x"]
        if o.shape != want.shape or o.dtype != want.dtype:
            raise AssertionError(f"{k} has shape {tuple(o.shape)} {o.dtype}, expected "
                                 f"{tuple(want.shape)} {want.dtype}")
    grads = torch.autograd.grad([o for o, _ in grads_out], [leaves[k] for k in names],
                                [g for _, g in grads_out])
    res = {k: o.detach() for k, o in outs.items()}
    for k, g in zip(names, grads):
        if g.shape != t[k].shape:
            raise AssertionError(f"d{k} has shape {tuple(g.shape)}, expected {tuple(t[k].shape)}")
        res["d" + k] = g
    return res


def _act_call(kf, op, a, v):
    if op in SOFTMAX_OPS:
        return getattr(kf, op)(a["x"])
    if op == "silu_and_mul":
        return kf.silu_and_mul(a["x"])
    if op == "swiglu":
        return kf.swiglu(a["gate"], a["up"])
    if op == "gelu_and_mul":
        return kf.gelu_and_mul(a["x"], approximate=v["approximate"], gate_first=v["gate_first"])
    if op == "geglu":
        return kf.geglu(a["hidden"], a["gate"], approximate=v["approximate"])
    return kf.gelu(a["x"], approximate=v["approximate"])


def _run_kf_act(kf, op, t, v, a, leaves, names):
    dy = a["dy"]
    _poison([dy.shape] + [leaves[k].shape for k in names], dy.dtype, dy.device)
    y = _act_call(kf, op, a, v)
    if y.shape != dy.shape or y.dtype != dy.dtype:
        raise AssertionError(f"y has shape {tuple(y.shape)} {y.dtype}, expected {tuple(dy.shape)} {dy.dtype}")
    grads = torch.autograd.grad([y], [leaves[k] for k in names], [dy])
    res = {"y": y.detach()}
    for k, g in zip(names, grads):
        if g.shape != t[k].shape:
            raise AssertionError(f"d{k} has shape {tuple(g.shape)}, expected {tuple(t[k].shape)}")
        res["d" + k] = g
    return res


def _rope_kwargs(t, v):
    # rotary_dim given explicitly (it must equal cos.shape[-1]): partial rotary when R < D
    return {"interleaved": v["interleaved"], "layout": v["layout"], "position_ids": t["position_ids"],
            "rotary_dim": t["cos"].shape[-1]}


def _run_kf_rope(kf, t, v, leaves):
    q, k = leaves["q"], leaves["k"]
    _poison([q.shape, k.shape] * 2, q.dtype, q.device)
    q_out, k_out = kf.apply_rope(q, k, t["cos"], t["sin"], **_rope_kwargs(t, v))
    for name, o, want in (("q_out", q_out, q), ("k_out", k_out, k)):
        if o.shape != want.shape or o.dtype != want.dtype:
            raise AssertionError(f"{name} has shape {tuple(o.shape)} {o.dtype}, expected "
                                 f"{tuple(want.shape)} {want.dtype}")
    dq, dk = torch.autograd.grad([q_out, k_out], [q, k], [t["dq_out"], t["dk_out"]])
    for name, g, want in (("dq", dq, q), ("dk", dk, k)):
        if g.shape != want.shape:
            raise AssertionError(f"{name} has shape {tuple(g.shape)}, expected {tuple(want.shape)}")
    # the in-place op on copies of q and k (same strides): its own kernel path (passthrough columns
    # are not rewritten)
    q_in, k_in = t["q"].clone(), t["k"].clone()
    kf.apply_rope(q_in, k_in, t["cos"], t["sin"], inplace=True, **_rope_kwargs(t, v))
    return {"q_out": q_out.detach(), "k_out": k_out.detach(), "dq": dq, "dk": dk,
            "q_inplace": q_in, "k_inplace": k_in}


# ---- oracle (a): the op's CPU implementation (C++ float64 reference) on float64 inputs ----------

def _f64(t: dict) -> dict:
    """Floating tensors as float64 on the CPU; integer ones (position_ids) keep their dtype."""
    return {k: (v.detach().to("cpu", torch.float64 if v.is_floating_point() else v.dtype)
                if isinstance(v, torch.Tensor) else v)
            for k, v in t.items()}


def _cpp_ref_act(op: str, a: dict, v: dict) -> dict:
    ops = torch.ops.kernelforge
    dy = a["dy"]
    if op in SOFTMAX_OPS:  # the backward takes the forward's output
        y = getattr(ops, op)(a["x"])
        return {"y": y, "dx": getattr(ops, f"{op}_backward")(dy, y)}
    if op == "silu_and_mul":
        return {"y": ops.silu_and_mul(a["x"]), "dx": ops.silu_and_mul_backward(dy, a["x"])}
    if op == "swiglu":
        dg, du = ops.swiglu_backward(dy, a["gate"], a["up"])
        return {"y": ops.swiglu(a["gate"], a["up"]), "dgate": dg, "dup": du}
    ap = v["approximate"]
    if op == "gelu_and_mul":
        gf = v["gate_first"]
        return {"y": ops.gelu_and_mul(a["x"], ap, gf), "dx": ops.gelu_and_mul_backward(dy, a["x"], ap, gf)}
    if op == "geglu":
        dh, dg = ops.geglu_backward(dy, a["hidden"], a["gate"], ap)
        return {"y": ops.geglu(a["hidden"], a["gate"], ap), "dhidden": dh, "dgate": dg}
    return {"y": ops.gelu(a["x"], ap), "dx": ops.gelu_backward(dy, a["x"], ap)}


def _cpp_ref_rope(a: dict, v: dict) -> dict:
    ops = torch.ops.kernelforge
    args = (a["cos"], a["sin"], a["position_ids"], v["interleaved"], {"bshd": 0, "bhsd": 1}[v["layout"]], 0)
    q_out, k_out = ops.apply_rope(a["q"], a["k"], *args)
    dq, dk = ops.apply_rope_backward(a["dq_out"], a["dk_out"], *args)
    return {"q_out": q_out, "k_out": k_out, "dq": dq, "dk": dk, "q_inplace": q_out, "k_inplace": k_out}


def run_cpp_ref(op: str, t: dict, v: dict) -> dict:
    ops = torch.ops.kernelforge
    a = _f64(t)
    if op in ACT_OPS or op in SOFTMAX_OPS:
        return _cpp_ref_act(op, a, v)
    if op in ROPE_OPS:
        return _cpp_ref_rope(a, v)
    eps = EPS[op]
    if op == "rms_norm":
        y = ops.rms_norm(a["x"], a["weight"], eps)
        dx, dw = ops.rms_norm_backward(a["dy"], a["x"], a["weight"], eps)
        res = {"y": y, "dx": dx, "dweight": dw}
    elif op == "add_rms_norm":
        y, s = ops.add_rms_norm(a["x"], a["residual"], a["weight"], eps)
        dx, dw = ops.add_rms_norm_backward(a["dy"], a["ds"], s, a["weight"], eps)
        res = {"y": y, "s": s, "dx": dx, "dresidual": dx, "dweight": dw}
    elif op == "layer_norm":
        y = ops.layer_norm(a["x"], a["weight"], a["bias"], eps)
        dx, dw, db = ops.layer_norm_backward(a["dy"], a["x"], a["weight"], a["bias"], eps)
        res = {"y": y, "dx": dx, "dweight": dw, "dbias": db}
    else:
        kind = 0 if v["kind"] == "rms" else 1
        y = ops.ada_norm(a["x"], a["scale"], a["shift"], a["weight"], a["bias"], eps, kind)
        dx, dsc, dsh, dw, db = ops.ada_norm_backward(a["dy"], a["x"], a["scale"], a["shift"],
                                                     a["weight"], a["bias"], eps, kind)
        res = {"y": y, "dx": dx, "dscale": dsc, "dshift": dsh, "dweight": dw, "dbias": db}
    return {k: r for k, r in res.items() if not (k in ("dweight", "dbias") and t.get(k[1:]) is None)}


# ---- oracle (b): float64 PyTorch formulas, autograd for the gradients ---------------------------

def _rms64(x, w, eps):
    y = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
    return y * w if w is not None else y


def _layer64(x, w, b, eps):
    mu = x.mean(-1, keepdim=True)
    d = x - mu
    y = d * torch.rsqrt(d.pow(2).mean(-1, keepdim=True) + eps)
    if w is not None:
        y = y * w
    if b is not None:
        y = y + b
    return y


def _torch_act(op: str, a: dict, v: dict) -> torch.Tensor:
    """The model libraries' formulas in float64 (F.silu / F.gelu; diffusers GEGLU chunk order)."""
    import torch.nn.functional as F  # noqa: PLC0415

    if op in SOFTMAX_OPS:
        return getattr(torch, op)(a["x"], -1)
    if op == "silu_and_mul":
        gate, up = a["x"].chunk(2, dim=-1)
        return F.silu(gate) * up
    if op == "swiglu":
        return F.silu(a["gate"]) * a["up"]
    if op == "gelu_and_mul":
        first, second = a["x"].chunk(2, dim=-1)
        if v["gate_first"]:
            return F.gelu(first, approximate=v["approximate"]) * second
        return first * F.gelu(second, approximate=v["approximate"])
    if op == "geglu":
        return a["hidden"] * F.gelu(a["gate"], approximate=v["approximate"])
    return F.gelu(a["x"], approximate=v["approximate"])


def _rope64(x, cos, sin, interleaved: bool, layout: str):
    """out[j] = x[j] cos[j] + rot(x)[j] sin[j] for j < R, columns R.. unchanged; rot: HF's rotate_half
    on x[..., :R] (cat(-x2, x1)), or the interleaved pairs (2i, 2i+1) -> (-x_{2i+1}, x_{2i}) of
    GPT-J / diffusers. cos/sin [B, S, R] or [S, R]; broadcast over the heads."""
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
    return torch.cat((xr * cos + rot * sin, x[..., R:]), dim=-1)


def run_torch_ref(op: str, t: dict, v: dict) -> dict:
    a = _f64(t)
    names = grad_names(op, t)
    for k in names:
        a[k].requires_grad_(True)
    if op in ACT_OPS or op in SOFTMAX_OPS:
        y = _torch_act(op, a, v)
        grads = torch.autograd.grad([y], [a[k] for k in names], [a["dy"]])
        return {"y": y.detach(), **{"d" + k: g for k, g in zip(names, grads)}}
    if op in ROPE_OPS:
        cos, sin = a["cos"], a["sin"]
        if a["position_ids"] is not None:  # the cache rows of each token: [B, S, R]
            cos, sin = cos[a["position_ids"]], sin[a["position_ids"]]
        q_out = _rope64(a["q"], cos, sin, v["interleaved"], v["layout"])
        k_out = _rope64(a["k"], cos, sin, v["interleaved"], v["layout"])
        dq, dk = torch.autograd.grad([q_out, k_out], [a["q"], a["k"]], [a["dq_out"], a["dk_out"]])
        return {"q_out": q_out.detach(), "k_out": k_out.detach(), "dq": dq, "dk": dk,
                "q_inplace": q_out.detach(), "k_inplace": k_out.detach()}
    eps = EPS[op]
    if op == "rms_norm":
        outs = {"y": _rms64(a["x"], a["weight"], eps)}
        pairs = [(outs["y"], a["dy"])]
    elif op == "add_rms_norm":
        s = a["x"] + a["residual"]
        outs = {"y": _rms64(s, a["weight"], eps), "s": s}
        pairs = [(outs["y"], a["dy"]), (s, a["ds"])]
    elif op == "layer_norm":
        outs = {"y": _layer64(a["x"], a["weight"], a["bias"], eps)}
        pairs = [(outs["y"], a["dy"])]
    else:
        norm = (_layer64(a["x"], a["weight"], a["bias"], eps) if v["kind"] == "layer"
                else _rms64(a["x"], a["weight"], eps))
        outs = {"y": norm * (1 + a["scale"]) + a["shift"]}
        pairs = [(outs["y"], a["dy"])]
    grads = torch.autograd.grad([o for o, _ in pairs], [a[k] for k in names], [g for _, g in pairs])
    res = {k: o.detach() for k, o in outs.items()}
    res.update({"d" + k: g for k, g in zip(names, grads)})
    return res


# ---- comparison --------------------------------------------------------------------------------

def errors(got: torch.Tensor, ref: torch.Tensor) -> tuple[float, float]:
    """(max|got - ref| / max(max|ref|, 1), relative L2); inf when got has NaN/Inf."""
    g = got.detach().to("cpu", torch.float64).flatten()
    r = ref.detach().to("cpu", torch.float64).flatten()
    if g.shape != r.shape:
        return math.inf, math.inf
    if g.numel() == 0:
        return 0.0, 0.0
    if not torch.isfinite(g).all():
        return math.inf, math.inf
    diff = g - r
    mx = diff.abs().max().item() / max(r.abs().max().item(), 1.0)
    # relative L2 with the same floor: rms error over max(rms of ref, 1) (near-zero refs, e.g. the
    # gradients of an N = 1 row, are judged on absolute error, as the inputs are O(1))
    l2 = diff.norm().item() / max(r.norm().item(), math.sqrt(r.numel()))
    return mx, l2


@dataclass
class Tally:
    fwd_err: float = 0.0
    bwd_err: float = 0.0
    worst_fwd: str = ""
    worst_bwd: str = ""
    cases: int = 0
    failures: list = field(default_factory=list)


def check_case(kf, op, shape, v, dtype, device, tally: Tally) -> None:
    label = f"{shape_label(op, shape)} {variant_label(v)}"
    tol_max, tol_l2 = TOL[dtype]
    tally.cases += 1
    try:
        t = make_inputs(op, shape, v, dtype, device)
        got = run_kf(kf, op, t, v)
        again = run_kf(kf, op, t, v)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        for k in got:
            if not torch.equal(got[k], again[k]) and torch.isfinite(got[k]).all():
                tally.failures.append(f"{label}: {k} differs between two identical runs (race or "
                                      "nondeterministic reduction)")
        refs = {"C++ ref": run_cpp_ref(op, t, v), "torch f64": run_torch_ref(op, t, v)}
    except Exception as e:  # noqa: BLE001  (an op that raises is a FAIL with its message)
        msg = str(e).strip().splitlines()[0] if str(e).strip() else ""
        tally.failures.append(f"{label}: raised {type(e).__name__}: {msg[:200]}")
        return
    for oracle, ref in refs.items():
        for k, r in ref.items():
            if k not in got:
                tally.failures.append(f"{label}: no {k} from kernelforge (oracle {oracle} has one)")
                continue
            mx, l2 = errors(got[k], r)
            bwd = k.startswith("d")
            if bwd and mx > tally.bwd_err:
                tally.bwd_err, tally.worst_bwd = mx, f"{label} {k}"
            if not bwd and mx > tally.fwd_err:
                tally.fwd_err, tally.worst_fwd = mx, f"{label} {k}"
            if not (mx <= tol_max and l2 <= tol_l2):
                tally.failures.append(f"{label}: {k} vs {oracle}: max_err {mx:.2e} (tol {tol_max:.0e}), "
                                      f"rel_l2 {l2:.2e} (tol {tol_l2:.0e})")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("ops", nargs="*", metavar="OP",
                   help=f"ops to check (default all): {' '.join(OPS)}; groups: norm, activation, rope, softmax")
    p.add_argument("--dtype", default="bf16,fp16,fp32",
                   help="comma list of bf16, fp16, fp32 (default all three)")
    p.add_argument("--seed", type=int, default=None, help="random seed (default: fresh each run)")
    p.add_argument("--device", default="cuda", help=argparse.SUPPRESS)  # cpu: smoke tests only


def main(args: argparse.Namespace) -> int:
    t0 = time.monotonic()
    groups = {"norm": NORM_OPS, "activation": ACT_OPS, "rope": ROPE_OPS, "softmax": SOFTMAX_OPS, "all": OPS}
    args.ops = [o for n in args.ops for o in groups.get(n, (n,))]
    bad = [o for o in args.ops if o not in OPS]
    dts = [d.strip() for d in args.dtype.split(",") if d.strip()]
    bad += [d for d in dts if d not in DTYPES]
    if bad or not dts:
        print(f"kforge check: unknown op/dtype {', '.join(bad) or '(none)'}; ops: {' '.join(OPS)}; "
              f"dtypes: {', '.join(DTYPES)}", file=sys.stderr)
        return 2
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        print("kforge check: no CUDA GPU is visible (torch.cuda.is_available() is False); the check "
              "runs the CUDA kernels against the float64 reference and needs one.", file=sys.stderr)
        return 2
    try:
        import kernelforge as kf  # noqa: PLC0415

        for name in OPS:
            getattr(torch.ops.kernelforge, name)
    except Exception as e:  # noqa: BLE001
        print(f"kforge check: the kernelforge ops are not loaded ({type(e).__name__}: {e}). Build the "
              "extension first (scripts/dev_build.sh copies it to python/kernelforge/).",
              file=sys.stderr)
        return 2
    seed = args.seed if args.seed is not None else int.from_bytes(os.urandom(4), "little")
    torch.manual_seed(seed)
    where = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    print(f"kforge check on {where} | torch {torch.__version__} | seed {seed} | "
          f"oracles: C++ float64 reference (CPU op) and float64 PyTorch formulas", flush=True)
    print(f"{'':6}{'op':<14}{'dtype':<6}{'cases':>6}  {'fwd max_err':>11}  {'bwd max_err':>11}  "
          f"{'tol':>7}  worst", flush=True)
    ops = list(dict.fromkeys(args.ops or OPS))
    any_fail = False
    for op in ops:
        for dt in dts:
            dtype = DTYPES[dt]
            tally = Tally()
            for shape in (ROPE_SHAPES if op in ROPE_OPS else SHAPES):
                for v in VARIANTS[op]:
                    check_case(kf, op, shape, v, dtype, device, tally)
            status = "FAIL" if tally.failures else "PASS"
            any_fail |= bool(tally.failures)
            worst = tally.worst_bwd if tally.bwd_err >= tally.fwd_err else tally.worst_fwd
            print(f"{status:<6}{op:<14}{dt:<6}{tally.cases:>6}  {tally.fwd_err:>11.2e}  "
                  f"{tally.bwd_err:>11.2e}  {TOL[dtype][0]:>7.0e}  {worst}", flush=True)
            for f in tally.failures[:8]:
                print(f"        {f}", flush=True)
            if len(tally.failures) > 8:
                print(f"        ... {len(tally.failures) - 8} more", flush=True)
    print(f"kforge check: {'FAIL' if any_fail else 'PASS'} ({time.monotonic() - t0:.1f} s, seed {seed})",
          flush=True)
    return 1 if any_fail else 0
