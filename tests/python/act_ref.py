"""Test harness of the activation family: the op variants the tests are driven by, their inputs and
calls. The float64 references live in kernelforge.specs.activation; tolerances are the one table of
kernelforge.specs (norm_ref.TOL / GRAD_TOL: the kernels compute in float32 and round once).
"""

from __future__ import annotations

import torch

from kernelforge.specs import activation as spec

f64 = torch.float64


# ---- the op variants under test, driven by one table -------------------------------------------------
# name -> (kind, approximate, gate_first). kind: split ops take x [..., 2I]; "two" ops take two
# tensors [..., I]; gelu takes x [..., N].
VARIANTS = {
    "silu_and_mul": ("silu_and_mul", None, True),
    "swiglu": ("swiglu", None, True),
    "gelu_and_mul_tanh": ("gelu_and_mul", "tanh", True),
    "gelu_and_mul_none": ("gelu_and_mul", "none", True),
    "gelu_and_mul_tanh_second": ("gelu_and_mul", "tanh", False),
    "gelu_and_mul_none_second": ("gelu_and_mul", "none", False),
    "geglu_none": ("geglu", "none", True),
    "geglu_tanh": ("geglu", "tanh", True),
    "gelu_none": ("gelu", "none", True),
    "gelu_tanh": ("gelu", "tanh", True),
}
OPS = list(VARIANTS)
# one variant per public op (the kernels of the other variants differ only in a constant or offset)
OPS_SHORT = ["silu_and_mul", "swiglu", "gelu_and_mul_none_second", "geglu_tanh", "gelu_none"]
SPLIT = {"silu_and_mul", "gelu_and_mul"}
TWO = {"swiglu": ("gate", "up"), "geglu": ("hidden", "gate")}


def kind(op):
    return VARIANTS[op][0]


def make_inputs(op, shape, dtype, device, scale=2.0):
    """Random inputs of `op` for an output of `shape` ([..., I]): x [..., 2I] for the split ops.
    N(0, scale^2) values (both tails of sigmoid / GELU), generated in float32 then cast."""
    k = kind(op)

    def rnd(s):
        return (torch.randn(s, device=device) * scale).to(dtype)

    if k in SPLIT:
        return {"x": rnd((*shape[:-1], 2 * shape[-1]))}
    if k in TWO:
        return {n: rnd(shape) for n in TWO[k]}
    return {"x": rnd(shape)}


def run_kf(kf, op, inp):
    k, ap, gf = VARIANTS[op]
    if k == "silu_and_mul":
        return kf.silu_and_mul(inp["x"])
    if k == "swiglu":
        return kf.swiglu(inp["gate"], inp["up"])
    if k == "gelu_and_mul":
        return kf.gelu_and_mul(inp["x"], approximate=ap, gate_first=gf)
    if k == "geglu":
        return kf.geglu(inp["hidden"], inp["gate"], approximate=ap)
    return kf.gelu(inp["x"], approximate=ap)


def run_ref(op, inp, dtype):
    """The float64 reference of kernelforge.specs.activation, rounded once to dtype."""
    k, ap, gf = VARIANTS[op]
    return spec.reference_call(k, inp, {"approximate": ap, "gate_first": gf}, dtype)


def out_shape(op, inp):
    x = inp.get("x", inp.get("gate"))
    if kind(op) in SPLIT:
        return (*x.shape[:-1], x.shape[-1] // 2)
    return tuple(x.shape)
