"""The norm family: rms_norm, add_rms_norm, layer_norm, ada_norm.

Shapes are (rows, hidden). ada_norm views x as [B, S, hidden] with B = ada_batch(rows) and a
[B, 1, hidden] scale/shift (the DiT AdaLN pattern).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ._spec import (OpSpec, check_out, f64, grads_of, kf, poison, randn)

EPS = {"rms_norm": 1e-6, "add_rms_norm": 1e-6, "layer_norm": 1e-5, "ada_norm": 1e-6}

# ---- float64 references ---------------------------------------------------------------------------
# Written from the model libraries' semantics. Inputs of any dtype; math in float64; the roundings the
# library applies happen in `dtype`. With dtype=float64 nothing is rounded and the function is
# differentiable: the gradient reference.


def _round(t: torch.Tensor, dtype) -> torch.Tensor:
    return t if dtype == f64 else t.to(dtype).to(f64)


def rms_norm_ref(x, weight, eps, dtype=f64):
    """HF LlamaRMSNorm: x * rsqrt(mean(x^2) + eps) in high precision, cast to the input dtype, then
    * weight."""
    x = x.to(f64)
    y = _round(x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps), dtype)
    if weight is not None:
        y = y * weight.to(f64)
    return y.to(dtype)


def add_rms_norm_ref(x, residual, weight, eps, dtype=f64):
    """(rms_norm(s), s) with s = x + residual rounded to the dtype (the new residual stream)."""
    s = _round(x.to(f64) + residual.to(f64), dtype)
    return rms_norm_ref(s, weight, eps, dtype), s.to(dtype)


def layer_norm_ref(x, weight, bias, eps, dtype=f64):
    """(x - mean) * rsqrt(var + eps) * weight + bias (biased variance), one rounding."""
    w = None if weight is None else weight.to(f64)
    b = None if bias is None else bias.to(f64)
    return F.layer_norm(x.to(f64), (x.shape[-1],), w, b, eps).to(dtype)


def ada_norm_ref(x, scale, shift, weight, bias, eps, kind, dtype=f64):
    """norm(x) * (1 + scale) + shift, norm = layer norm (kind "layer") or RMS norm (kind "rms") with
    optional weight and bias; all in float64, one rounding at the end."""
    x = x.to(f64)
    if kind == "layer":
        n = F.layer_norm(x, (x.shape[-1],), None, None, eps)
    else:
        n = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
    if weight is not None:
        n = n * weight.to(f64)
    if bias is not None:
        n = n + bias.to(f64)
    return (n * (1 + scale.to(f64)) + shift.to(f64)).to(dtype)


# ---- traffic and arithmetic -----------------------------------------------------------------------
# Bytes = (ROW_TENSORS * rows * hidden + PARAM_TENSORS * param_rows * hidden) * element size: every
# row tensor the op must read or write once, plus the parameters (param_rows = 1 for weight / bias,
# B for ada_norm's [B, 1, hidden] scale / shift).
ROW_TENSORS = {
    ("rms_norm", "fwd"): 2,  # read x, write y
    ("rms_norm", "fwdbwd"): 5,  # + read x, dy, write dx
    ("add_rms_norm", "fwd"): 4,  # read x, residual, write y, s
    ("add_rms_norm", "fwdbwd"): 7,  # + read dy, s, write dx (one dx serves x and residual)
    ("layer_norm", "fwd"): 2,
    ("layer_norm", "fwdbwd"): 5,
    ("ada_norm", "fwd"): 2,
    ("ada_norm", "fwdbwd"): 5,
}
PARAM_TENSORS = {
    ("rms_norm", "fwd"): 1,  # w
    ("rms_norm", "fwdbwd"): 3,  # w (fwd) + w (bwd) + dw
    ("add_rms_norm", "fwd"): 1,
    ("add_rms_norm", "fwdbwd"): 3,
    ("layer_norm", "fwd"): 2,  # w, b
    ("layer_norm", "fwdbwd"): 5,  # w, b (fwd) + w (bwd) + dw, db
    ("ada_norm", "fwd"): 2,  # scale, shift
    ("ada_norm", "fwdbwd"): 5,  # scale, shift (fwd) + scale (bwd) + dscale, dshift
}
# Nominal FLOPs per element of x (the formula's arithmetic in float32).
FLOPS_PER_ELT = {
    ("rms_norm", "fwd"): 4,  # x*x, sum, *rstd, *w
    ("rms_norm", "fwdbwd"): 11,  # + dy*w, *xhat, sum, fma, *rstd, dw fma
    ("add_rms_norm", "fwd"): 5,  # + the add
    ("add_rms_norm", "fwdbwd"): 12,
    ("layer_norm", "fwd"): 7,  # sum, -mean, sq, sum, *rstd, *w, +b
    ("layer_norm", "fwdbwd"): 17,
    ("ada_norm", "fwd"): 9,  # layer norm (5) + (1+scale), *, +shift
    ("ada_norm", "fwdbwd"): 21,
}


def ada_batch(rows: int) -> int:
    """ada_norm's bench views x as [B, S, hidden]: B = 4, S = rows / 4 (B = 1 when rows < 4 or rows % 4)."""
    return 4 if rows >= 4 and rows % 4 == 0 else 1


def _bytes(op):
    def row_bytes(shape, mode, elt):
        rows, hidden = shape
        param_rows = ada_batch(rows) if op == "ada_norm" else 1
        return (ROW_TENSORS[(op, mode)] * rows * hidden + PARAM_TENSORS[(op, mode)] * param_rows * hidden) * elt
    return row_bytes


def _flops(op):
    return lambda shape, mode: FLOPS_PER_ELT[(op, mode)] * shape[0] * shape[1]


# ---- bench: inputs, kernelforge, peers ------------------------------------------------------------


def _inputs(op):
    def inputs(shape, dtype, device, gen):
        rows, hidden = shape
        t = {}
        if op == "ada_norm":
            b = ada_batch(rows)
            t["x"] = randn(gen, device, dtype, b, rows // b, hidden)
            t["scale"] = randn(gen, device, dtype, b, 1, hidden, scale=0.1)
            t["shift"] = randn(gen, device, dtype, b, 1, hidden, scale=0.1)
        else:
            t["x"] = randn(gen, device, dtype, rows, hidden)
            t["weight"] = randn(gen, device, dtype, hidden, scale=0.1, offset=1.0)
            if op == "layer_norm":
                t["bias"] = randn(gen, device, dtype, hidden, scale=0.1)
            if op == "add_rms_norm":
                t["residual"] = randn(gen, device, dtype, rows, hidden)
        t["dy"] = randn(gen, device, dtype, *t["x"].shape)
        return t
    return inputs


def _kf_run(op):
    eps = EPS[op]
    if op == "rms_norm":
        return lambda t: (kf().rms_norm(t["x"], t["weight"], eps),)
    if op == "add_rms_norm":
        return lambda t: tuple(kf().add_rms_norm(t["x"], t["residual"], t["weight"], eps))
    if op == "layer_norm":
        return lambda t: (kf().layer_norm(t["x"], t["weight"], t["bias"], eps),)
    return lambda t: (kf().ada_norm(t["x"], t["scale"], t["shift"], None, None, eps, kind="layer"),)


def _hf_rms(x, w, eps):
    # transformers LlamaRMSNorm.forward, verbatim math
    h = x.float()
    v = h.pow(2).mean(-1, keepdim=True)
    h = h * torch.rsqrt(v + eps)
    return w * h.to(x.dtype)


def _fp32_layer(x, w, b, eps):
    # plain fp32 layer-norm math (F.layer_norm's semantics, written out as unfused ops)
    h = x.float()
    mu = h.mean(-1, keepdim=True)
    d = h - mu
    var = d.pow(2).mean(-1, keepdim=True)
    return (d * torch.rsqrt(var + eps) * w.float() + b.float()).to(x.dtype)


def _eager(op):
    eps = EPS[op]
    if op == "rms_norm":
        return lambda: (lambda t: (_hf_rms(t["x"], t["weight"], eps),))
    if op == "add_rms_norm":
        def add_rms(t):
            s = t["x"] + t["residual"]
            return _hf_rms(s, t["weight"], eps), s
        return lambda: add_rms
    if op == "layer_norm":
        return lambda: (lambda t: (_fp32_layer(t["x"], t["weight"], t["bias"], eps),))

    def ada(t):  # diffusers AdaLayerNorm pattern (elementwise_affine=False, eps=1e-6)
        x = t["x"]
        return (F.layer_norm(x, (x.shape[-1],), eps=eps) * (1 + t["scale"]) + t["shift"],)
    return lambda: ada


def _native(op):
    eps = EPS[op]
    if op == "rms_norm":
        return lambda: (lambda t: (F.rms_norm(t["x"], (t["x"].shape[-1],), t["weight"], eps),))
    if op == "layer_norm":
        return lambda: (lambda t: (F.layer_norm(t["x"], (t["x"].shape[-1],), t["weight"], t["bias"], eps),))
    return None


def _liger(op):
    """Liger's functional norms (in_place=False: with True, Liger writes dx into dy, and the timing
    loop reuses dy). None for ada_norm (no AdaLN-with-LayerNorm kernel)."""
    eps = EPS[op]

    def factory():
        try:
            from liger_kernel.transformers import functional as lf  # noqa: PLC0415
        except Exception:  # noqa: BLE001  (not installed, or its import fails: no liger peer)
            return None
        if op == "rms_norm":
            return lambda t: (lf.liger_rms_norm(t["x"], t["weight"], eps, casting_mode="llama", in_place=False),)
        if op == "add_rms_norm":
            return lambda t: tuple(lf.liger_fused_add_rms_norm(t["x"], t["residual"], t["weight"], eps,
                                                               casting_mode="llama", in_place=False))
        return lambda t: (lf.liger_layer_norm(t["x"], t["weight"], t["bias"], eps),)
    return None if op == "ada_norm" else factory


# The default bench shapes: three training batches of 16384 rows, a decode step and a decode batch;
# rms_norm and layer_norm also time long rows (64 K and 128 K elements).
SHAPES = ((16384, 2048), (16384, 4096), (16384, 8192), (1, 4096), (64, 4096))
LONG_ROW_SHAPES = ((4096, 65536), (2048, 131072))
# `kforge bench --sweep`: hidden sizes 1024..16384 in steps of 512 plus the model sizes that are no
# multiple of 512 (gpt-oss 2880, Llama-2 MLP 11008), at 4096 and 16384 rows.
SWEEP_ROWS = (4096, 16384)
MODEL_HIDDEN = (2880, 3584, 5120, 6144, 7168, 10240, 11008, 13824, 14336)
SWEEP_HIDDEN = tuple(sorted(set(range(1024, 16384 + 1, 512)) | set(MODEL_HIDDEN)))
SWEEP_SHAPES = tuple((r, h) for r in SWEEP_ROWS for h in SWEEP_HIDDEN)


# ---- kforge check ---------------------------------------------------------------------------------
# One shape per code path: a single row, N = 1, odd N, N no multiple of the vector width, a mid-size
# batch, and long rows that do not fit one pass of registers.
CHECK_SHAPES = ((1, 4096), (3, 1), (7, 1000), (19, 4097), (128, 2048), (2, 65536), (1, 131072))
# Which optional tensors are present (ada_norm: also the kind and the scale / shift shape).
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
}
GRAD_NAMES = {"rms_norm": ["x", "weight"], "add_rms_norm": ["x", "residual", "weight"],
              "layer_norm": ["x", "weight", "bias"], "ada_norm": ["x", "scale", "shift", "weight", "bias"]}


def _grad_names(op, t):
    return [k for k in GRAD_NAMES[op] if t.get(k) is not None]


def _check_inputs(op):
    def inputs(shape, v, dtype, device):
        rows, n = shape
        t = {"weight": None, "bias": None}
        if op == "ada_norm":
            b = 2 if rows >= 2 and rows % 2 == 0 else 1
            s = rows // b
            t["x"] = randn(None, device, dtype, b, s, n)
            mshape = {"N": (n,), "B1N": (b, 1, n), "BSN": (b, s, n)}[v["mod"]]
            t["scale"] = randn(None, device, dtype, *mshape, scale=0.5)
            t["shift"] = randn(None, device, dtype, *mshape, scale=0.5)
        else:
            t["x"] = randn(None, device, dtype, rows, n)
        if op == "add_rms_norm":
            t["residual"] = randn(None, device, dtype, rows, n)
        if v.get("weight"):
            t["weight"] = randn(None, device, dtype, n, scale=0.5, offset=1.0)
        if v.get("bias"):
            t["bias"] = randn(None, device, dtype, n, scale=0.5)
        t["dy"] = randn(None, device, dtype, *t["x"].shape)
        if op == "add_rms_norm":
            t["ds"] = randn(None, device, dtype, rows, n)  # gradient into s = x + residual from later layers
        return t
    return inputs


def _check_run(op):
    """Outputs and gradients through kf.* and autograd, outputs from NaN-poisoned blocks."""
    def run(kfm, t, v):
        names = _grad_names(op, t)
        leaves = {k: t[k].detach().clone().requires_grad_(True) for k in names}
        a = {**t, **leaves}
        x = a["x"]
        poison([x.shape] * 2 + [leaves[k].shape for k in names], x.dtype, x.device)
        eps = EPS[op]
        if op == "rms_norm":
            outs = {"y": kfm.rms_norm(x, a["weight"], eps)}
            pairs = [(outs["y"], a["dy"])]
        elif op == "add_rms_norm":
            y, s = kfm.add_rms_norm(x, a["residual"], a["weight"], eps)
            outs = {"y": y, "s": s}
            pairs = [(y, a["dy"]), (s, a["ds"])]
        elif op == "layer_norm":
            outs = {"y": kfm.layer_norm(x, a["weight"], a["bias"], eps)}
            pairs = [(outs["y"], a["dy"])]
        else:
            outs = {"y": kfm.ada_norm(x, a["scale"], a["shift"], a["weight"], a["bias"], eps, kind=v["kind"])}
            pairs = [(outs["y"], a["dy"])]
        for k, o in outs.items():
            check_out(k, o, x.shape, x.dtype)
        res = {k: o.detach() for k, o in outs.items()}
        res.update(grads_of([o for o, _ in pairs], [g for _, g in pairs], leaves, names, t))
        return res
    return run


def _cpp_reference(op):
    """The ops on float64 CPU tensors: the C++ float64 reference."""
    def ref(a, v):
        ops = torch.ops.kernelforge
        eps = EPS[op]
        if op == "rms_norm":
            dx, dw = ops.rms_norm_backward(a["dy"], a["x"], a["weight"], eps)
            res = {"y": ops.rms_norm(a["x"], a["weight"], eps), "dx": dx, "dweight": dw}
        elif op == "add_rms_norm":
            y, s = ops.add_rms_norm(a["x"], a["residual"], a["weight"], eps)
            dx, dw = ops.add_rms_norm_backward(a["dy"], a["ds"], s, a["weight"], eps)
            res = {"y": y, "s": s, "dx": dx, "dresidual": dx, "dweight": dw}
        elif op == "layer_norm":
            dx, dw, db = ops.layer_norm_backward(a["dy"], a["x"], a["weight"], a["bias"], eps)
            res = {"y": ops.layer_norm(a["x"], a["weight"], a["bias"], eps), "dx": dx, "dweight": dw, "dbias": db}
        else:
            kind = v["kind"]
            y = ops.ada_norm(a["x"], a["scale"], a["shift"], a["weight"], a["bias"], eps, kind)
            dx, dsc, dsh, dw, db = ops.ada_norm_backward(a["dy"], a["x"], a["scale"], a["shift"],
                                                         a["weight"], a["bias"], eps, kind)
            res = {"y": y, "dx": dx, "dscale": dsc, "dshift": dsh, "dweight": dw, "dbias": db}
        return {k: r for k, r in res.items() if not (k in ("dweight", "dbias") and a.get(k[1:]) is None)}
    return ref


def _reference(op):
    """The float64 references above, autograd for the gradients."""
    def ref(a, v):
        names = _grad_names(op, a)
        for k in names:
            a[k].requires_grad_(True)
        eps = EPS[op]
        if op == "rms_norm":
            outs = {"y": rms_norm_ref(a["x"], a["weight"], eps)}
            pairs = [(outs["y"], a["dy"])]
        elif op == "add_rms_norm":
            y, s = add_rms_norm_ref(a["x"], a["residual"], a["weight"], eps)
            outs = {"y": y, "s": s}
            pairs = [(y, a["dy"]), (s, a["ds"])]
        elif op == "layer_norm":
            outs = {"y": layer_norm_ref(a["x"], a["weight"], a["bias"], eps)}
            pairs = [(outs["y"], a["dy"])]
        else:
            outs = {"y": ada_norm_ref(a["x"], a["scale"], a["shift"], a["weight"], a["bias"], eps, v["kind"])}
            pairs = [(outs["y"], a["dy"])]
        grads = torch.autograd.grad([o for o, _ in pairs], [a[k] for k in names], [g for _, g in pairs])
        return {**{k: o.detach() for k, o in outs.items()}, **{"d" + k: g for k, g in zip(names, grads)}}
    return ref


def _spec(op: str) -> OpSpec:
    providers = {"rms_norm": ("kernelforge", "eager", "torch_native", "compile", "liger"),
                 "add_rms_norm": ("kernelforge", "eager", "compile", "liger"),  # no fused PyTorch op
                 "layer_norm": ("kernelforge", "eager", "torch_native", "compile", "liger"),
                 "ada_norm": ("kernelforge", "eager", "compile")}[op]
    long_rows = LONG_ROW_SHAPES if op in ("rms_norm", "layer_norm") else ()
    return OpSpec(
        name=op, family="norm", shape_kind="rows",
        inputs=_inputs(op), run=_kf_run(op),
        grad_inputs={"rms_norm": ("x", "weight"), "add_rms_norm": ("x", "residual", "weight"),
                     "layer_norm": ("x", "weight", "bias"), "ada_norm": ("x", "scale", "shift")}[op],
        outputs=("y", "s") if op == "add_rms_norm" else ("y",),
        row_bytes=_bytes(op), flops=_flops(op),
        shapes=SHAPES + long_rows, sweep_shapes=SWEEP_SHAPES,
        eager=_eager(op), torch_native=_native(op), liger=_liger(op), providers=providers,
        check_shapes=CHECK_SHAPES, variants=VARIANTS[op], check_inputs=_check_inputs(op),
        check_run=_check_run(op), cpp_reference=_cpp_reference(op), reference=_reference(op),
        extra={"eps": EPS[op]},
    )


SPECS = tuple(_spec(op) for op in ("rms_norm", "add_rms_norm", "layer_norm", "ada_norm"))
