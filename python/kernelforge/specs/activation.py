"""The activation family: silu_and_mul, swiglu, gelu_and_mul, geglu, gelu.

Shapes are (rows, I) with I the output width: the fused gate/up ops (silu_and_mul, gelu_and_mul) read
x [rows, 2I]; swiglu and geglu read two [rows, I] tensors; gelu reads x [rows, I].
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ._spec import OpSpec, check_out, f64, grads_of, kf, poison, randn
from .norm import CHECK_SHAPES, SHAPES

# ---- float64 references ---------------------------------------------------------------------------
# Written from the model libraries' code. Math in float64, the result rounded once to `dtype` (the
# fused kernels' semantics; eager PyTorch also rounds act(gate) before the multiply, which the
# tolerance covers). With dtype=float64 they are differentiable: the gradient reference.


def silu_and_mul_ref(x, dtype=f64):
    """vLLM / kernels silu_and_mul, gate first: silu(x[..., :I]) * x[..., I:]. HF LlamaMLP:
    act_fn(gate_proj(x)) * up_proj(x)."""
    x = x.to(f64)
    i = x.shape[-1] // 2
    return (F.silu(x[..., :i]) * x[..., i:]).to(dtype)


def swiglu_ref(gate, up, dtype=f64):
    return (F.silu(gate.to(f64)) * up.to(f64)).to(dtype)


def gelu_and_mul_ref(x, approximate, gate_first, dtype=f64):
    """gate_first: vLLM gelu_and_mul / gelu_tanh_and_mul; else diffusers GEGLU:
    `hidden_states, gate = proj(x).chunk(2, dim=-1); return hidden_states * self.gelu(gate)`."""
    x = x.to(f64)
    first, second = x.chunk(2, dim=-1)
    if gate_first:
        return (F.gelu(first, approximate=approximate) * second).to(dtype)
    return (first * F.gelu(second, approximate=approximate)).to(dtype)


def geglu_ref(hidden, gate, approximate, dtype=f64):
    """diffusers GEGLU after the projection: hidden_states * F.gelu(gate)."""
    return (hidden.to(f64) * F.gelu(gate.to(f64), approximate=approximate)).to(dtype)


def gelu_ref(x, approximate, dtype=f64):
    return F.gelu(x.to(f64), approximate=approximate).to(dtype)


def reference_call(op: str, t: dict, v: dict, dtype=f64) -> torch.Tensor:
    """The reference of `op` with variant v ({"approximate", "gate_first"}) on inputs t."""
    if op == "silu_and_mul":
        return silu_and_mul_ref(t["x"], dtype)
    if op == "swiglu":
        return swiglu_ref(t["gate"], t["up"], dtype)
    if op == "gelu_and_mul":
        return gelu_and_mul_ref(t["x"], v["approximate"], v["gate_first"], dtype)
    if op == "geglu":
        return geglu_ref(t["hidden"], t["gate"], v["approximate"], dtype)
    return gelu_ref(t["x"], v["approximate"], dtype)


def kf_call(kfm, op: str, t: dict, v: dict) -> torch.Tensor:
    """kernelforge's `op` with variant v on inputs t."""
    if op == "silu_and_mul":
        return kfm.silu_and_mul(t["x"])
    if op == "swiglu":
        return kfm.swiglu(t["gate"], t["up"])
    if op == "gelu_and_mul":
        return kfm.gelu_and_mul(t["x"], approximate=v["approximate"], gate_first=v["gate_first"])
    if op == "geglu":
        return kfm.geglu(t["hidden"], t["gate"], approximate=v["approximate"])
    return kfm.gelu(t["x"], approximate=v["approximate"])


SPLIT_OPS = ("silu_and_mul", "gelu_and_mul")  # x [..., 2I] -> y [..., I]
INPUT_NAMES = {"silu_and_mul": ("x",), "swiglu": ("gate", "up"), "gelu_and_mul": ("x",),
               "geglu": ("hidden", "gate"), "gelu": ("x",)}

# The variant each bench op runs: gelu_and_mul is diffusers' GEGLU on the fused projection (exact
# GELU, gate second); geglu the tanh GeGLU (like-for-like with Liger's, which only has tanh); gelu is
# F.gelu's default (exact).
BENCH_VARIANT = {"silu_and_mul": {}, "swiglu": {}, "gelu_and_mul": {"approximate": "none", "gate_first": False},
                 "geglu": {"approximate": "tanh"}, "gelu": {"approximate": "none"}}

# ---- traffic and arithmetic -----------------------------------------------------------------------
# Bytes = ROW_TENSORS * rows * I * element size: the gated forward reads gate and up and writes y (3);
# the backward reads gate, up, dy and writes dgate, dup (fwd+bwd 3 + 5); gelu fwd 2, bwd 3 (x, dy, dx).
ROW_TENSORS = {"fwd": 3, "fwdbwd": 8}
GELU_ROW_TENSORS = {"fwd": 2, "fwdbwd": 5}
# Nominal FLOPs per output element (erf counted as ~14 ops of its polynomial).
FLOPS_PER_ELT = {
    ("silu_and_mul", "fwd"): 6,  # -a, exp, 1+, rcp, a*s, *up
    ("silu_and_mul", "fwdbwd"): 17,  # + sigmoid (4), 1-s, fma, *s, g*up*s', g*silu
    ("swiglu", "fwd"): 6,
    ("swiglu", "fwdbwd"): 17,
    ("gelu_and_mul", "fwd"): 18,  # erf, +1, *0.5, *a, *hidden
    ("gelu_and_mul", "fwdbwd"): 42,
    ("geglu", "fwd"): 10,  # a^2, fma, *a, sigmoid (4), *a, *hidden
    ("geglu", "fwdbwd"): 26,
    ("gelu", "fwd"): 17,
    ("gelu", "fwdbwd"): 40,
}


def _bytes(op):
    table = GELU_ROW_TENSORS if op == "gelu" else ROW_TENSORS
    return lambda shape, mode, elt: table[mode] * shape[0] * shape[1] * elt


def _flops(op):
    return lambda shape, mode: FLOPS_PER_ELT[(op, mode)] * shape[0] * shape[1]


# ---- bench ----------------------------------------------------------------------------------------


def _inputs(op):
    def inputs(shape, dtype, device, gen):
        rows, i = shape
        if op in SPLIT_OPS:
            t = {"x": randn(gen, device, dtype, rows, 2 * i)}
        else:
            t = {name: randn(gen, device, dtype, rows, i) for name in INPUT_NAMES[op]}
        t["dy"] = randn(gen, device, dtype, rows, i)
        return t
    return inputs


def _kf_run(op):
    v = BENCH_VARIANT[op]
    return lambda t: (kf_call(kf(), op, t, v),)


def _eager(op):
    """The model libraries' code: vLLM SiluAndMul.forward_native (silu_and_mul), HF LlamaMLP
    (swiglu), diffusers GEGLU.forward after the projection (gelu_and_mul: chunk, gate second; geglu:
    approximate="tanh"), F.gelu."""
    v = BENCH_VARIANT[op]

    def silu_and_mul(t):
        x = t["x"]
        d = x.shape[-1] // 2
        return (F.silu(x[..., :d]) * x[..., d:],)

    def gelu_and_mul(t):
        hidden, gate = t["x"].chunk(2, dim=-1)
        return (hidden * F.gelu(gate, approximate=v.get("approximate", "none")),)

    fns = {"silu_and_mul": silu_and_mul,
           "swiglu": lambda t: (F.silu(t["gate"]) * t["up"],),
           "gelu_and_mul": gelu_and_mul,
           "geglu": lambda t: (t["hidden"] * F.gelu(t["gate"], approximate=v.get("approximate", "none")),),
           "gelu": lambda t: (F.gelu(t["x"]),)}
    return lambda: fns[op]


def _liger(op):
    """Liger's SwiGLU / GeGLU autograd functions (liger_kernel.ops). Their backward writes the gradients
    into the saved gate/up buffers (Liger's design): the inputs of later timed calls then hold gradient
    values, which changes no timing; each mode's correctness check runs first."""
    def factory():
        try:
            from liger_kernel.ops import geglu as lg  # noqa: PLC0415
            from liger_kernel.ops import swiglu as ls  # noqa: PLC0415
        except Exception:  # noqa: BLE001
            return None
        if op == "silu_and_mul" and hasattr(ls, "LigerFusedGateUpSiLUMulFunction"):
            return lambda t: (ls.LigerFusedGateUpSiLUMulFunction.apply(t["x"]),)  # gate first, no copies
        if op == "swiglu":
            return lambda t: (ls.LigerSiLUMulFunction.apply(t["gate"], t["up"]),)
        if op == "geglu":  # gelu_tanh(a) * b with a = gate, b = hidden
            return lambda t: (lg.LigerGELUMulFunction.apply(t["gate"], t["hidden"]),)
        return None
    return factory if op in ("silu_and_mul", "swiglu", "geglu") else None


# ---- kforge check ---------------------------------------------------------------------------------
VARIANTS = {
    "silu_and_mul": ({},),
    "swiglu": ({},),
    "gelu_and_mul": tuple({"approximate": a, "gate_first": g} for a in ("tanh", "none") for g in (True, False)),
    "geglu": ({"approximate": "none"}, {"approximate": "tanh"}),
    "gelu": ({"approximate": "none"}, {"approximate": "tanh"}),
}


def _check_inputs(op):
    """Inputs N(0, 2^2) (both tails of sigmoid / GELU); n = the output width I."""
    def inputs(shape, v, dtype, device):
        rows, n = shape
        if op in SPLIT_OPS:
            t = {"x": randn(None, device, dtype, rows, 2 * n, scale=2.0)}
        else:
            t = {name: randn(None, device, dtype, rows, n, scale=2.0) for name in INPUT_NAMES[op]}
        t["dy"] = randn(None, device, dtype, rows, n)
        return t
    return inputs


def _check_run(op):
    def run(kfm, t, v):
        names = list(INPUT_NAMES[op])
        leaves = {k: t[k].detach().clone().requires_grad_(True) for k in names}
        dy = t["dy"]
        poison([dy.shape] + [leaves[k].shape for k in names], dy.dtype, dy.device)
        y = kf_call(kfm, op, {**t, **leaves}, v)
        check_out("y", y, dy.shape, dy.dtype)
        return {"y": y.detach(), **grads_of([y], [dy], leaves, names, t)}
    return run


def _cpp_reference(op):
    def ref(a, v):
        ops = torch.ops.kernelforge
        dy = a["dy"]
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
    return ref


def _reference(op):
    def ref(a, v):
        names = list(INPUT_NAMES[op])
        for k in names:
            a[k].requires_grad_(True)
        y = reference_call(op, a, v)
        grads = torch.autograd.grad([y], [a[k] for k in names], [a["dy"]])
        return {"y": y.detach(), **{"d" + k: g for k, g in zip(names, grads)}}
    return ref


def _spec(op: str) -> OpSpec:
    providers = {"silu_and_mul": ("kernelforge", "eager", "compile", "liger"),
                 "swiglu": ("kernelforge", "eager", "compile", "liger"),
                 "gelu_and_mul": ("kernelforge", "eager", "compile"),
                 "geglu": ("kernelforge", "eager", "compile", "liger"),
                 # the eager model code is F.gelu itself: the torch_native peer
                 "gelu": ("kernelforge", "torch_native", "compile")}[op]
    return OpSpec(
        name=op, family="activation", shape_kind="rows",
        inputs=_inputs(op), run=_kf_run(op), grad_inputs=INPUT_NAMES[op],
        row_bytes=_bytes(op), flops=_flops(op), shapes=SHAPES,
        eager=_eager(op), torch_native=_eager(op) if op == "gelu" else None, liger=_liger(op),
        providers=providers,
        check_shapes=CHECK_SHAPES, variants=VARIANTS[op], check_inputs=_check_inputs(op),
        check_run=_check_run(op), cpp_reference=_cpp_reference(op), reference=_reference(op),
        extra={"bench_variant": BENCH_VARIANT[op]},
    )


SPECS = tuple(_spec(op) for op in ("silu_and_mul", "swiglu", "gelu_and_mul", "geglu", "gelu"))
