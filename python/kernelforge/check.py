"""`kforge check`: every op (norm, activation, RoPE and the cross-entropy loss), forward and backward,
on the current GPU against float64 oracles.

For each op, dtype (bf16, fp16, fp32), shape (one row, N = 1, odd N, long rows, ...; RoPE: GQA, MQA,
decode, partial rotary, odd head_dim, many heads) and variant (with / without weight and bias; AdaLN
layer and rms kinds, three scale shapes; GELU erf / tanh, gate first / second; RoPE rotate-half /
interleaved, bshd / bhsd (contiguous or HF attention's view of [B, S, H, D] memory), cos/sin
[B, S, R] in q's dtype, [S, R] float32 or a float32 cache read through position_ids;
cross_entropy: vocabularies from 7 to 262144, mean / sum / none, label smoothing, z-loss, softcap,
every row ignored; fused_linear_cross_entropy: with / without bias, mean / sum / none (the
backward's recompute path), several chunks of tokens), on fresh random data:

  * the GPU result through the public API (kf.*, autograd for the gradients) is compared with
    (a) the op's own CPU implementation, the C++ float64 reference, run on the inputs upcast to
        float64, and
    (b) an independent float64 PyTorch formula (autograd for its gradients),
  * NaN/Inf never passes, except where the reference itself is NaN (the mean over all-ignored rows,
    0 / 0 as in PyTorch): there the result must be NaN too, at the same positions; the allocator
    is pre-filled with NaN blocks of the outputs' sizes before each GPU call (best effort: an
    output element the kernel forgets then shows up as NaN),
  * the GPU forward and backward are run twice and must be bit-identical (fixed reduction order);
  * apply_rope also runs in place (inplace=True) on copies of q and k, checked like its outputs;
  * cross_entropy: loss (in the logits' dtype), lse and the logits' gradient; oracle (b) is the
    logsumexp formula of cross_entropy.h, itself checked against F.cross_entropy where PyTorch has
    the options (no z-loss, no softcap); fused_linear_cross_entropy: loss (float32; the logits are
    rounded to the dtype by the GEMM) and the gradients of hidden, weight and bias, oracle (b) the
    same formula on float64 hidden @ weight.T + bias. The loss gradient is scaled so that the
    gradients are O(1) (see _ce_inputs).

Error = max|got - ref| / max(max|ref|, 1), plus the relative L2 error (same floor of 1); PASS needs both under the
dtype's tolerance against both oracles (fused_linear_cross_entropy's gradients, GEMMs over the
logits' gradient rounded to the dtype, the weight gradient also accumulated over chunks: twice it).
Prints one PASS/FAIL line per op and dtype; exit status 1 if anything FAILs, 2 without a GPU or
without the extension.
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
CE_OPS = ("cross_entropy", "fused_linear_cross_entropy")
OPS = NORM_OPS + ACT_OPS + ROPE_OPS + SOFTMAX_OPS + CE_OPS
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
# cross_entropy (T, V): one row of 7 classes, a vocab that is no multiple of the vector width, just over
# 2^14, a Llama-2 batch, Llama-3's and Gemma's vocabularies on few rows (long rows: many segments)
CE_SHAPES = ((1, 7), (7, 4099), (3, 16385), (64, 32000), (2, 128256), (1, 262144))
# fused_linear_cross_entropy (T, H, V): odd sizes, a few hundred tokens (several GEMM tiles), one token
FLCE_SHAPES = ((13, 64, 1031), (300, 128, 5000), (1, 32, 77))
IGNORE_INDEX = -100  # rows 2, 7, 12, ... of every cross-entropy case are ignored (a one-row call keeps its row)
REDUCTIONS = {"none": 0, "mean": 1, "sum": 2}  # the ops' int reduction

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
    # reduction and options; scale: the logits' standard deviation (default 3; x20 with the softcap so
    # that tanh saturates); ignore "all": every target is ignore_index (the mean is NaN, 0 / 0, as in
    # PyTorch: compared as NaN, see errors())
    "cross_entropy": (
        {"reduction": "mean"},
        {"reduction": "sum", "label_smoothing": 0.1},
        {"reduction": "none", "z_loss_scale": 1e-4},
        {"reduction": "mean", "softcap": 30.0, "scale": 20.0},
        {"reduction": "mean", "ignore": "all"},
    ),
    # bias or not; "none" takes the backward op's path (the chunks are recomputed for the per-row loss
    # gradient; with a softcap as Gemma 2's patched loss, logits x10 only: the GEMM rounds them to the
    # dtype, an absolute error that grows with them); chunk_tokens 7 forces several chunks (the weight
    # gradient accumulated over them); 0 = chosen by the op (one chunk at these sizes)
    "fused_linear_cross_entropy": (
        {"reduction": "mean", "bias": False},
        {"reduction": "sum", "bias": True, "label_smoothing": 0.1},
        {"reduction": "none", "bias": True, "softcap": 30.0, "scale": 10.0},
        {"reduction": "mean", "bias": False, "chunk_tokens": 7, "z_loss_scale": 1e-4},
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
    if "reduction" in v:  # the cross-entropy family
        parts.append(v["reduction"])
        for key, short in (("label_smoothing", "ls"), ("z_loss_scale", "z"), ("softcap", "softcap"),
                           ("chunk_tokens", "chunk")):
            if v.get(key):
                parts.append(f"{short}={v[key]:g}")
        if v.get("ignore") == "all":
            parts.append("all_ignored")
    return "+".join(parts) if parts else "plain"


def shape_label(op: str, shape: tuple) -> str:
    """ROWSxN; apply_rope b{B}s{S}h{Hq}/{Hk}d{D} as in the bench, plus r{R} for partial rotary."""
    if op in ROPE_OPS:
        B, S, Hq, Hk, D, R = shape
        return f"b{B}s{S}h{Hq}/{Hk}d{D}" + (f"r{R}" if R != D else "")
    if op == "fused_linear_cross_entropy":
        T, H, V = shape
        return f"t{T}h{H}v{V}"
    return f"{shape[0]}x{shape[1]}"


# ---- inputs ----------------------------------------------------------------------------------

def make_inputs(op: str, shape: tuple, v: dict, dtype, device) -> dict:
    """Fresh random inputs in `dtype` (never zeros), on `device`."""

    def rnd(*shape, scale=1.0, offset=0.0):
        return (torch.randn(*shape, device=device) * scale + offset).to(dtype)

    if op in ROPE_OPS:
        return _rope_inputs(shape, v, dtype, device, rnd)
    if op in CE_OPS:
        return _ce_inputs(op, shape, v, dtype, device, rnd)
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


def _ce_inputs(op: str, shape: tuple, v: dict, dtype, device, rnd) -> dict:
    """Logits (cross_entropy) or hidden, weight and bias (fused_linear_cross_entropy), int64 targets with
    ignored rows, and the loss gradient dloss (in the loss's dtype: the logits' for cross_entropy,
    float32 for the fused op).

    dloss: N(0, 1) per row for "none"; for "mean" and "sum" a scalar in [0.5, 1.5), times the number
    of valid rows for "mean". The gradient of a mean is otherwise ~1 / rows per row, and errors are
    floored at 1 (errors()): scaled, the gradients are O(1) as for the other ops and a wrong gradient
    cannot pass as "small"."""
    T, V = shape[0], shape[-1]
    scale = v.get("scale", 3.0)
    target = torch.randint(0, V, (T,))
    if v.get("ignore") == "all":
        target.fill_(IGNORE_INDEX)
    else:
        target[2::5] = IGNORE_INDEX
    valid = int((target != IGNORE_INDEX).sum())
    t = {"target": target.to(device)}
    if op == "cross_entropy":
        t["logits"] = rnd(T, V, scale=scale)
        loss_dtype = dtype
    else:
        H = shape[1]
        # logits = hidden @ weight.T (+ bias) with standard deviation ~scale
        t["hidden"] = rnd(T, H)
        t["weight"] = rnd(V, H, scale=scale / math.sqrt(H))
        t["bias"] = rnd(V) if v.get("bias") else None
        loss_dtype = torch.float32
    if v["reduction"] == "none":
        dloss = torch.randn(T)
    else:
        dloss = (torch.rand(()) + 0.5) * (max(valid, 1) if v["reduction"] == "mean" else 1)
    t["dloss"] = dloss.to(device=device, dtype=loss_dtype)
    return t


def _ce_grad_names(op: str, t: dict) -> list[str]:
    if op == "cross_entropy":
        return ["logits"]
    return [k for k in ("hidden", "weight", "bias") if t.get(k) is not None]


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
    if op in CE_OPS:
        return _run_kf_ce(kf, op, t, v)
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


def _ce_kwargs(v: dict) -> dict:
    """The Python API's keyword arguments of a cross-entropy variant."""
    return {"ignore_index": IGNORE_INDEX, "label_smoothing": v.get("label_smoothing", 0.0),
            "reduction": v["reduction"], "z_loss_scale": v.get("z_loss_scale", 0.0), "softcap": v.get("softcap")}


def _check_out(name: str, o: torch.Tensor, shape: tuple, dtype) -> None:
    if tuple(o.shape) != tuple(shape) or o.dtype != dtype:
        raise AssertionError(f"{name} has shape {tuple(o.shape)} {o.dtype}, expected {tuple(shape)} {dtype}")


def _run_kf_ce(kf, op: str, t: dict, v: dict) -> dict:
    """cross_entropy: loss (the logits' dtype), lse (float32, return_lse=True) and dlogits;
    fused_linear_cross_entropy: loss (float32) and the gradients of hidden, weight and bias."""
    names = _ce_grad_names(op, t)
    leaves = {k: t[k].detach().clone().requires_grad_(True) for k in names}
    target, dloss = t["target"], t["dloss"]
    T = target.shape[0]
    loss_shape = (T,) if v["reduction"] == "none" else ()
    if op == "cross_entropy":
        x = leaves["logits"]
        _poison([x.shape], x.dtype, x.device)
        _poison([(T,), (T,), (), ()], torch.float32, x.device)
        loss, lse = kf.cross_entropy(x, target, return_lse=True, **_ce_kwargs(v))
        _check_out("loss", loss, loss_shape, x.dtype)
        _check_out("lse", lse, (T,), torch.float32)
        (dx,) = torch.autograd.grad([loss], [x], [dloss])
        _check_out("dlogits", dx, x.shape, x.dtype)
        return {"loss": loss.detach(), "lse": lse, "dlogits": dx}
    h = leaves["hidden"]
    _poison([leaves[k].shape for k in names], h.dtype, h.device)
    _poison([(T,), (T,), ()], torch.float32, h.device)
    loss = kf.fused_linear_cross_entropy(h, leaves["weight"], target, leaves.get("bias"),
                                         chunk_tokens=v.get("chunk_tokens", 0), **_ce_kwargs(v))
    _check_out("loss", loss, loss_shape, torch.float32)
    grads = torch.autograd.grad([loss], [leaves[k] for k in names], [dloss])
    res = {"loss": loss.detach()}
    for k, g in zip(names, grads):
        _check_out("d" + k, g, t[k].shape, t[k].dtype)
        res["d" + k] = g
    return res


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


def _cpp_ref_ce(op: str, a: dict, v: dict) -> dict:
    """The ops on float64 CPU tensors (the reference computes in double; its row losses and lse pass
    through float32, well inside fp32's tolerance)."""
    ops = torch.ops.kernelforge
    opts = (IGNORE_INDEX, v.get("label_smoothing", 0.0), v.get("z_loss_scale", 0.0), v.get("softcap") or 0.0)
    red = REDUCTIONS[v["reduction"]]
    if op == "cross_entropy":
        loss, lse, valid = ops.cross_entropy(a["logits"], a["target"], *opts, red)
        dx = ops.cross_entropy_backward(a["dloss"], a["logits"], a["target"], lse, valid, *opts, red)
        return {"loss": loss, "lse": lse, "dlogits": dx}
    h, w, tg, b = a["hidden"], a["weight"], a["target"], a["bias"]
    has_bias = b is not None
    chunk = v.get("chunk_tokens", 0)
    # mean / sum: the gradients for a loss gradient of 1, computed with the loss; "none": the backward op
    loss, lse, dh, dw, db = ops.fused_linear_cross_entropy_forward(h, w, tg, b, *opts, red, chunk, True, True,
                                                                   has_bias)
    if red == 0:
        dh, dw, db = ops.fused_linear_cross_entropy_backward(a["dloss"], h, w, tg, b, lse, *opts, chunk, True, True,
                                                             has_bias)
    else:
        dh, dw, db = dh * a["dloss"], dw * a["dloss"], db * a["dloss"]
    res = {"loss": loss, "dhidden": dh, "dweight": dw}
    if has_bias:
        res["dbias"] = db
    return res


def run_cpp_ref(op: str, t: dict, v: dict) -> dict:
    ops = torch.ops.kernelforge
    a = _f64(t)
    if op in ACT_OPS or op in SOFTMAX_OPS:
        return _cpp_ref_act(op, a, v)
    if op in ROPE_OPS:
        return _cpp_ref_rope(a, v)
    if op in CE_OPS:
        return _cpp_ref_ce(op, a, v)
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


def _ce64(x: torch.Tensor, target: torch.Tensor, v: dict) -> tuple[torch.Tensor, torch.Tensor]:
    """(loss, lse) of cross_entropy.h's formula on float64 logits x [T, V], written from scratch:
    z = softcap * tanh(x / softcap) (or x), lse = logsumexp(z), per valid row
    lse - (1 - eps) z_t - (eps / V) sum_j z_j + z_loss * lse^2, 0 for an ignored row; the mean divides
    by the number of valid rows (0 / 0 = NaN when there is none)."""
    cap = v.get("softcap")
    eps = v.get("label_smoothing", 0.0)
    z = cap * torch.tanh(x / cap) if cap else x
    lse = torch.logsumexp(z, dim=-1)
    valid = target != IGNORE_INDEX
    safe = torch.where(valid, target, torch.zeros_like(target))
    z_t = z.gather(-1, safe.unsqueeze(-1)).squeeze(-1)
    row = lse - (1 - eps) * z_t - (eps / x.shape[-1]) * z.sum(-1) + v.get("z_loss_scale", 0.0) * lse * lse
    row = torch.where(valid, row, torch.zeros_like(row))
    if v["reduction"] == "none":
        return row, lse
    if v["reduction"] == "sum":
        return row.sum(), lse
    return row.sum() / valid.sum(), lse


def _check_against_torch_ce(loss: torch.Tensor, x: torch.Tensor, target: torch.Tensor, v: dict) -> None:
    """The formula is F.cross_entropy where PyTorch has the options (no z-loss, no softcap)."""
    import torch.nn.functional as F  # noqa: PLC0415

    if v.get("z_loss_scale") or v.get("softcap"):
        return
    with torch.no_grad():
        want = F.cross_entropy(x, target, ignore_index=IGNORE_INDEX, reduction=v["reduction"],
                               label_smoothing=v.get("label_smoothing", 0.0))
    if not torch.allclose(loss.detach(), want, rtol=1e-9, atol=1e-9, equal_nan=True):
        raise AssertionError("the float64 oracle differs from F.cross_entropy (oracle bug)")


def _run_torch_ref_ce(op: str, a: dict, v: dict) -> dict:
    names = _ce_grad_names(op, a)
    for k in names:
        a[k].requires_grad_(True)
    if op == "cross_entropy":
        x = a["logits"]
    else:  # the logits in float64, then the same formula
        x = a["hidden"] @ a["weight"].t()
        if a["bias"] is not None:
            x = x + a["bias"]
    loss, lse = _ce64(x, a["target"], v)
    _check_against_torch_ce(loss, x, a["target"], v)
    grads = torch.autograd.grad([loss], [a[k] for k in names], [a["dloss"]])
    res = {"loss": loss.detach(), **{"d" + k: g for k, g in zip(names, grads)}}
    if op == "cross_entropy":
        res["lse"] = lse.detach()
    return res


def run_torch_ref(op: str, t: dict, v: dict) -> dict:
    a = _f64(t)
    if op in CE_OPS:
        return _run_torch_ref_ce(op, a, v)
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
    """(max|got - ref| / max(max|ref|, 1), relative L2); inf when got has NaN/Inf.

    The one exception to "NaN never passes": where the reference itself is NaN (the mean cross-entropy
    over rows that are all ignored is 0 / 0, as in PyTorch), got must be NaN at exactly those positions
    (else inf) and the other elements are compared as usual."""
    g = got.detach().to("cpu", torch.float64).flatten()
    r = ref.detach().to("cpu", torch.float64).flatten()
    if g.shape != r.shape:
        return math.inf, math.inf
    ref_nan = torch.isnan(r)
    if ref_nan.any():
        if not torch.equal(torch.isnan(g), ref_nan):
            return math.inf, math.inf
        g, r = g[~ref_nan], r[~ref_nan]
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


def tolerance(op: str, k: str, dtype) -> tuple[float, float]:
    """TOL[dtype], except fused_linear_cross_entropy's gradients, about twice the gradient tolerance:
    each is a GEMM over the logits' gradient rounded to the dtype (two roundings, and the sum over the
    vocabulary cancels: the softmax gradient of a row sums to zero, so the rounding errors of its terms
    are large against the result; bf16, 1 token x hidden 32 x vocab 77: rel_l2 up to ~1e-2), and the
    weight gradient is also accumulated in the dtype over the chunks of tokens (one rounding per chunk,
    chunk_tokens=7 gives up to 43)."""
    tol_max, tol_l2 = TOL[dtype]
    if op == "fused_linear_cross_entropy" and k.startswith("d"):
        return 2 * tol_max, 2 * tol_l2
    return tol_max, tol_l2


def op_shapes(op: str) -> tuple:
    if op in ROPE_OPS:
        return ROPE_SHAPES
    if op == "cross_entropy":
        return CE_SHAPES
    if op == "fused_linear_cross_entropy":
        return FLCE_SHAPES
    return SHAPES


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
            tol_max, tol_l2 = tolerance(op, k, dtype)
            if r.numel() < 16:  # an L2 average over a few elements is their max error: judged by tol_max
                tol_l2 = tol_max
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
                   help=f"ops to check (default all): {' '.join(OPS)}; groups: norm, activation, rope, softmax, loss")
    p.add_argument("--dtype", default="bf16,fp16,fp32",
                   help="comma list of bf16, fp16, fp32 (default all three)")
    p.add_argument("--seed", type=int, default=None, help="random seed (default: fresh each run)")
    p.add_argument("--device", default="cuda", help=argparse.SUPPRESS)  # cpu: smoke tests only


def main(args: argparse.Namespace) -> int:
    t0 = time.monotonic()
    groups = {"norm": NORM_OPS, "activation": ACT_OPS, "rope": ROPE_OPS, "softmax": SOFTMAX_OPS, "loss": CE_OPS, "all": OPS}
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
    print(f"{'':6}{'op':<27}{'dtype':<6}{'cases':>6}  {'fwd max_err':>11}  {'bwd max_err':>11}  "
          f"{'tol':>7}  worst", flush=True)
    ops = list(dict.fromkeys(args.ops or OPS))
    any_fail = False
    for op in ops:
        for dt in dts:
            dtype = DTYPES[dt]
            tally = Tally()
            for shape in op_shapes(op):
                for v in VARIANTS[op]:
                    check_case(kf, op, shape, v, dtype, device, tally)
            status = "FAIL" if tally.failures else "PASS"
            any_fail |= bool(tally.failures)
            worst = tally.worst_bwd if tally.bwd_err >= tally.fwd_err else tally.worst_fwd
            print(f"{status:<6}{op:<27}{dt:<6}{tally.cases:>6}  {tally.fwd_err:>11.2e}  "
                  f"{tally.bwd_err:>11.2e}  {TOL[dtype][0]:>7.0e}  {worst}", flush=True)
            for f in tally.failures[:8]:
                print(f"        {f}", flush=True)
            if len(tally.failures) > 8:
                print(f"        ... {len(tally.failures) - 8} more", flush=True)
    print(f"kforge check: {'FAIL' if any_fail else 'PASS'} ({time.monotonic() - t0:.1f} s, seed {seed})",
          flush=True)
    return 1 if any_fail else 0
