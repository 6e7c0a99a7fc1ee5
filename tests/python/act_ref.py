"""float64 PyTorch references for the activation family, written from the model libraries' code, and
the op table the activation tests are driven by. Tolerances: norm_ref's table (TOL / GRAD_TOL, one
per dtype: the kernels compute in float32 and round once, well inside it).

References take tensors of any dtype, compute in float64 and round the result once to ``dtype`` (the
fused kernels' semantics; eager PyTorch also rounds act(gate) before the multiply, which the
tolerance covers). With ``dtype=torch.float64`` they are differentiable: the gradient reference.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

f64 = torch.float64


def silu_and_mul(x, dtype):
    """vLLM / kernels ``silu_and_mul``: gate first. HF LlamaMLP: act_fn(gate_proj(x)) * up_proj(x)."""
    x = x.to(f64)
    i = x.shape[-1] // 2
    return (F.silu(x[..., :i]) * x[..., i:]).to(dtype)


def swiglu(gate, up, dtype):
    return (F.silu(gate.to(f64)) * up.to(f64)).to(dtype)


def gelu_and_mul(x, approximate, gate_first, dtype):
    """gate_first: vLLM ``gelu_and_mul`` / ``gelu_tanh_and_mul``; else diffusers GEGLU:
    ``hidden_states, gate = proj(x).chunk(2, dim=-1); return hidden_states * self.gelu(gate)``."""
    x = x.to(f64)
    first, second = x.chunk(2, dim=-1)
    if gate_first:
        return (F.gelu(first, approximate=approximate) * second).to(dtype)
    return (first * F.gelu(second, approximate=approximate)).to(dtype)


def geglu(hidden, gate, approximate, dtype):
    """diffusers GEGLU after the projection: ``hidden_states * F.gelu(gate)``."""
    return (hidden.to(f64) * F.gelu(gate.to(f64), approximate=approximate)).to(dtype)


def gelu(x, approximate, dtype):
    return F.gelu(x.to(f64), approximate=approximate).to(dtype)


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
    k, ap, gf = VARIANTS[op]
    if k == "silu_and_mul":
        return silu_and_mul(inp["x"], dtype)
    if k == "swiglu":
        return swiglu(inp["gate"], inp["up"], dtype)
    if k == "gelu_and_mul":
        return gelu_and_mul(inp["x"], ap, gf, dtype)
    if k == "geglu":
        return geglu(inp["hidden"], inp["gate"], ap, dtype)
    return gelu(inp["x"], ap, dtype)


def out_shape(op, inp):
    x = inp.get("x", inp.get("gate"))
    if kind(op) in SPLIT:
        return (*x.shape[:-1], x.shape[-1] // 2)
    return tuple(x.shape)
