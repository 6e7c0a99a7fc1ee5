"""`kforge bench`: time the ops of kernelforge against the peers, in one run.

Every case is (op, mode, shape, dtype, provider). Providers:

    kernelforge   kf.rms_norm / kf.add_rms_norm / kf.layer_norm / kf.ada_norm, the activations
                  kf.silu_and_mul / kf.swiglu / kf.gelu_and_mul / kf.geglu / kf.gelu, and
                  kf.apply_rope(q, k, cos, sin, layout="bhsd")
    eager         the code the model libraries run (HF LlamaRMSNorm.forward math, residual add + that,
                  plain fp32 layer-norm math, the diffusers AdaLN pattern; F.silu(gate) * up (HF
                  LlamaMLP), vLLM's native silu_and_mul, the diffusers GEGLU forward; transformers'
                  Llama apply_rotary_pos_emb)
    torch_native  a fused PyTorch op where one exists (F.rms_norm, F.layer_norm, F.gelu)
    compile       torch.compile(eager, dynamic=False), warmed up
    liger         Liger-Kernel's Triton kernels, when `liger_kernel` imports (none for ada_norm,
                  gelu_and_mul and gelu)

Ops: every norm op, the activations and apply_rope; `kforge bench` with no op list runs the norm
ops, silu_and_mul and geglu (one per activation kernel family with a Liger peer, to keep
scripts/gpu_run.sh inside its 10 minutes) and apply_rope; name ops, or `--ops
all|norm|activation|rope`, for the rest. Shapes are ROWSxHIDDEN with HIDDEN = the output width (I
for the gated ops, whose fused input is [ROWS, 2I]); apply_rope's are written like the anchors,
b{batch}s{seq}h{q heads}/{kv heads}d{head dim}, e.g. b4s4096h32/8d128: q and k as HF Llama attention
hands them over ([B, H, S, D] views of [B, S, H, D] memory), cos/sin [B, S, D] in q's dtype.

Modes: fwd, fwdbwd (forward + backward: grads of x, weight, bias / residual / scale, shift; of q and
k), and for decode-sized rows (rows <= 64; apply_rope: batch * seq tokens <= 64) fwd_graph
(CUDA-graph replay of 100 calls, divided) and fwd_call (wall clock around ~1000 eager calls + one
sync, divided: the host path included).

Bytes are the minimum traffic (see notes/bench.md); GB/s is also given as a percentage of the
device-to-device copy bandwidth measured in the same run. One CSV for the run, one PNG per op, a
summary table at the end. Each peer's output (and gradients) is checked against kernelforge's
before it is timed; a peer that raises is reported and recorded with a NaN time.
"""
from __future__ import annotations

import argparse
import csv
import math
import os
import re
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from typing import Callable, NamedTuple

import torch
import torch.nn.functional as F

NORM_OPS = ("rms_norm", "add_rms_norm", "layer_norm", "ada_norm")
ACT_OPS = ("silu_and_mul", "swiglu", "gelu_and_mul", "geglu", "gelu")
ROPE_OPS = ("apply_rope",)
SOFTMAX_OPS = ("softmax", "log_softmax")
LOSS_OPS = ("cross_entropy", "fused_linear_cross_entropy")
OPS = NORM_OPS + ACT_OPS + ROPE_OPS + SOFTMAX_OPS + LOSS_OPS
# No op list: every norm op, plus one activation op per kernel family that has a Liger peer (silu
# gated; gelu-tanh gated), then apply_rope. All five activation ops add ~2 min to the GPU script,
# over its budget.
DEFAULT_OPS = NORM_OPS + ("silu_and_mul", "geglu") + ROPE_OPS
OP_GROUPS = {"all": OPS, "norm": NORM_OPS, "activation": ACT_OPS, "rope": ROPE_OPS}
OP_GROUPS["softmax"] = SOFTMAX_OPS
OP_GROUPS["loss"] = LOSS_OPS
MODES = ("fwd", "fwdbwd", "fwd_graph", "fwd_call")
PROVIDERS = ("kernelforge", "eager", "torch_native", "compile", "liger")
PEERS = PROVIDERS[1:]
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}

DECODE_MAX_ROWS = 64  # rows at or under this also get fwd_graph and fwd_call
DEFAULT_SHAPES = ((16384, 2048), (16384, 4096), (16384, 8192), (1, 4096), (64, 4096))
LONG_ROW_SHAPES = ((4096, 65536), (2048, 131072))
LONG_ROW_OPS = ("rms_norm", "layer_norm")
# softmax acceptance: 4096 rows of 128 K (256 KB bf16 rows: the cluster path on sm_90)
SOFTMAX_LONG_ROW_SHAPES = ((4096, 131072),)
# cross_entropy: tokens x vocab (Llama 3's 128256, Llama 2 / Mistral's 32000), the issue's shapes


class FlceShape(NamedTuple):
    """fused_linear_cross_entropy case: tokens x hidden x vocab, written t{T}h{H}v{V}."""
    t: int
    h: int
    v: int

    def __str__(self) -> str:
        return f"t{self.t}h{self.h}v{self.v}"


CE_SHAPES = ((4096, 128256), (8192, 32000))
FLCE_SHAPES = (FlceShape(8192, 4096, 128256),)
FLCE_SHAPE_RE = re.compile(r"t(\d+)h(\d+)v(\d+)")


class RopeShape(NamedTuple):
    """An apply_rope shape, written like the anchors: b{batch}s{seq}h{q heads}/{kv heads}d{head dim}.
    q [B, Hq, S, D] and k [B, Hk, S, D] (views of [B, S, H, D] memory), cos/sin [B, S, D]."""

    b: int
    s: int
    hq: int
    hk: int
    d: int

    def __str__(self) -> str:
        return f"b{self.b}s{self.s}h{self.hq}/{self.hk}d{self.d}"


# The issue's acceptance shapes (the anchors' rope_fwd rows: Llama-3-8B heads, 16k tokens), then two
# decode steps (1 and 64 tokens: fwd_graph and fwd_call too, like the decode-sized norm rows).
ROPE_SHAPES = (RopeShape(4, 4096, 32, 8, 128), RopeShape(1, 16384, 32, 8, 128),
               RopeShape(1, 1, 32, 8, 128), RopeShape(64, 1, 32, 8, 128))
ROPE_SHAPE_RE = re.compile(r"b(\d+)s(\d+)h(\d+)/(\d+)d(\d+)")

EPS = {"rms_norm": 1e-6, "add_rms_norm": 1e-6, "layer_norm": 1e-5, "ada_norm": 1e-6}

# Which providers exist for each op (mirrors shared/anchors: no fused PyTorch op for the
# residual-add norm or AdaLN; no Liger kernel for AdaLN-with-LayerNorm).
OP_PROVIDERS = {
    "rms_norm": ("kernelforge", "eager", "torch_native", "compile", "liger"),
    "add_rms_norm": ("kernelforge", "eager", "compile", "liger"),
    "layer_norm": ("kernelforge", "eager", "torch_native", "compile", "liger"),
    "ada_norm": ("kernelforge", "eager", "compile"),
    # activations: Liger has a fused gate-up SwiGLU, a two-tensor SwiGLU and a two-tensor tanh GeGLU
    "silu_and_mul": ("kernelforge", "eager", "compile", "liger"),
    "swiglu": ("kernelforge", "eager", "compile", "liger"),
    "gelu_and_mul": ("kernelforge", "eager", "compile"),
    "geglu": ("kernelforge", "eager", "compile", "liger"),
    "gelu": ("kernelforge", "torch_native", "compile"),  # the eager model code is F.gelu itself
    # RoPE: no fused PyTorch op; Liger has the HF rotate-half RoPE (liger_rotary_pos_emb)
    "apply_rope": ("kernelforge", "eager", "compile", "liger"),
    # softmax: the eager model code is torch.softmax itself (= torch_native); Liger has softmax only
    "softmax": ("kernelforge", "torch_native", "compile", "liger"),
    "log_softmax": ("kernelforge", "torch_native", "compile"),
    # loss: eager = the HF causal-LM loss path (F.cross_entropy of the logits upcast to float32, after
    # the lm_head GEMM for the fused op); Liger's cross-entropy and fused linear cross-entropy
    "cross_entropy": ("kernelforge", "eager", "compile", "liger"),
    "fused_linear_cross_entropy": ("kernelforge", "eager", "compile", "liger"),
}
# The activation variant each bench op runs (approximate, gate_first): gelu_and_mul is diffusers'
# GEGLU on the fused projection (exact GELU, gate second); geglu the tanh GeGLU (like-for-like
# with Liger's, which only has tanh); gelu is F.gelu's default (exact).
GELU_AND_MUL_ARGS = {"approximate": "none", "gate_first": False}
GEGLU_APPROX = "tanh"

# ---- traffic and arithmetic ------------------------------------------------------------------
# Big terms, in units of M*N elements: every row tensor the op must read or write once.
ROW_TENSORS = {
    ("rms_norm", "fwd"): 2,        # read x, write y
    ("rms_norm", "fwdbwd"): 5,     # + read x, dy, write dx
    ("add_rms_norm", "fwd"): 4,    # read x, residual, write y, s
    ("add_rms_norm", "fwdbwd"): 7,  # + read dy, s, write dx (one dx serves x and residual)
    ("layer_norm", "fwd"): 2,
    ("layer_norm", "fwdbwd"): 5,
    ("ada_norm", "fwd"): 2,
    ("ada_norm", "fwdbwd"): 5,
    # activations, in units of M*I (I = the output width): gated fwd reads gate and up, writes y;
    # bwd reads gate, up, dy and writes dgate, dup (fwd+bwd 3 + 5); gelu fwd 2, bwd 3 (x, dy, dx)
    ("silu_and_mul", "fwd"): 3,
    ("silu_and_mul", "fwdbwd"): 8,
    ("swiglu", "fwd"): 3,
    ("swiglu", "fwdbwd"): 8,
    ("gelu_and_mul", "fwd"): 3,
    ("gelu_and_mul", "fwdbwd"): 8,
    ("geglu", "fwd"): 3,
    ("geglu", "fwdbwd"): 8,
    ("gelu", "fwd"): 2,
    ("gelu", "fwdbwd"): 5,
    # apply_rope, in units of |q| + |k| = B*S*(Hq + Hk)*D: fwd reads q, k and writes q_out, k_out;
    # bwd reads dq_out, dk_out and writes dq, dk (the rotation is linear: it needs no q or k)
    ("apply_rope", "fwd"): 2,
    ("apply_rope", "fwdbwd"): 4,
    # softmax: fwd reads x, writes y; bwd reads dy, y, writes dx (fwd+bwd 5 passes)
    ("softmax", "fwd"): 2,
    ("softmax", "fwdbwd"): 5,
    ("log_softmax", "fwd"): 2,
    ("log_softmax", "fwdbwd"): 5,
    # cross_entropy, in units of T*V logits: fwd reads them once; fwd+bwd reads them twice and writes
    # the gradient once (the anchors' count)
    ("cross_entropy", "fwd"): 1,
    ("cross_entropy", "fwdbwd"): 3,
    # fused_linear_cross_entropy, in units of T*H + V*H (hidden and weight): read once (fwd); read
    # twice and both gradients written (fwd+bwd). Its speed is in TFLOP/s (GEMM-bound).
    ("fused_linear_cross_entropy", "fwd"): 1,
    ("fused_linear_cross_entropy", "fwdbwd"): 3,
}
# Small terms, in units of `param_rows * N` elements (param_rows = 1 for weight/bias, B for the
# [B, 1, N] scale/shift): fwd reads the parameters, bwd reads what dx needs and writes the grads.
# apply_rope: in units of B*S*D (one of cos/sin [B, S, D]). The anchors' rope_fwd rows count q and k
# only: for the same time our GB/s is (Hq + Hk + 1) / (Hq + Hk) of theirs (1.025x at 32/8 heads).
PARAM_TENSORS = {
    ("rms_norm", "fwd"): 1,        # w
    ("rms_norm", "fwdbwd"): 3,     # w (fwd) + w (bwd) + dw
    ("add_rms_norm", "fwd"): 1,
    ("add_rms_norm", "fwdbwd"): 3,
    ("layer_norm", "fwd"): 2,      # w, b
    ("layer_norm", "fwdbwd"): 5,   # w, b (fwd) + w (bwd) + dw, db
    ("ada_norm", "fwd"): 2,        # scale, shift
    ("ada_norm", "fwdbwd"): 5,     # scale, shift (fwd) + scale (bwd) + dscale, dshift
    **{(op, m): 0 for op in ACT_OPS for m in ("fwd", "fwdbwd")},  # no parameters
    ("apply_rope", "fwd"): 2,      # cos, sin
    ("apply_rope", "fwdbwd"): 4,   # cos, sin (fwd) + cos, sin (bwd)
    **{(op, m): 0 for op in SOFTMAX_OPS + LOSS_OPS for m in ("fwd", "fwdbwd")},  # no parameters
}
# Nominal floating-point operations per element of x (the formula's arithmetic, fp32); apply_rope
# per element of q and k.
FLOPS_PER_ELT = {
    ("rms_norm", "fwd"): 4,        # x*x, sum, *rstd, *w
    ("rms_norm", "fwdbwd"): 11,    # + dy*w, *xhat, sum, fma, *rstd, dw fma
    ("add_rms_norm", "fwd"): 5,    # + the add
    ("add_rms_norm", "fwdbwd"): 12,
    ("layer_norm", "fwd"): 7,      # sum, -mean, sq, sum, *rstd, *w, +b
    ("layer_norm", "fwdbwd"): 17,
    ("ada_norm", "fwd"): 9,        # layer norm (5) + (1+scale), *, +shift
    ("ada_norm", "fwdbwd"): 21,
    # activations, per output element (nominal; erf counted as ~14 ops of its polynomial)
    ("silu_and_mul", "fwd"): 6,    # -a, exp, 1+, rcp, a*s, *up
    ("silu_and_mul", "fwdbwd"): 17,  # + sigmoid (4), 1-s, fma, *s, g*up*s', g*silu
    ("swiglu", "fwd"): 6,
    ("swiglu", "fwdbwd"): 17,
    ("gelu_and_mul", "fwd"): 18,   # erf, +1, *0.5, *a, *hidden
    ("gelu_and_mul", "fwdbwd"): 42,
    ("geglu", "fwd"): 10,          # a^2, fma, *a, sigmoid (4), *a, *hidden
    ("geglu", "fwdbwd"): 26,
    ("gelu", "fwd"): 17,
    ("gelu", "fwdbwd"): 40,
    ("apply_rope", "fwd"): 3,      # x*cos + rot(x)*sin: 2 mul, 1 add (rot is a sign and a swap)
    ("apply_rope", "fwdbwd"): 6,   # + the transposed rotation of the gradient
    ("softmax", "fwd"): 7,         # max, x-m, *log2e, ex2, sum, (x-m)*log2e ex2, *1/s
    ("softmax", "fwdbwd"): 11,     # + g*y sum, g-dot, *y
    ("log_softmax", "fwd"): 6,     # max, x-m, *log2e, ex2, sum, -log s
    ("log_softmax", "fwdbwd"): 10,  # + sum g, *log2e, ex2, fma
    ("cross_entropy", "fwd"): 5,   # max, *log2e, sub, ex2, sum
    ("cross_entropy", "fwdbwd"): 10,  # + fma, ex2, *g, -eps/V, target select
}


def base_mode(mode: str) -> str:
    return "fwdbwd" if mode == "fwdbwd" else "fwd"


def ada_batch(rows: int) -> int:
    """ada_norm views x as [B, S, D]: B = 4, S = rows / 4 (B = 1 when rows < 4 or rows % 4)."""
    return 4 if rows >= 4 and rows % 4 == 0 else 1


def shape_label(dims: tuple) -> str:
    """How a case's shape is written: ROWSxHIDDEN, or a RopeShape's b..s..h../..d.. form."""
    return str(dims) if isinstance(dims, (RopeShape, FlceShape)) else f"{dims[0]}x{dims[1]}"


def case_rows(dims: tuple) -> int:
    """Rows of a case (apply_rope: tokens, B*S); the decode-sized modes go up to DECODE_MAX_ROWS."""
    if isinstance(dims, FlceShape):
        return dims.t
    return dims.b * dims.s if isinstance(dims, RopeShape) else dims[0]


def tensor_elements(op: str, dims: tuple) -> tuple[int, int]:
    """(elements of the ROW_TENSORS unit, elements of the PARAM_TENSORS unit): rows*hidden and
    param_rows*hidden; apply_rope |q| + |k| = B*S*(Hq + Hk)*D and one of cos/sin, B*S*D."""
    if op in ROPE_OPS:
        b, s, hq, hk, d = dims
        return b * s * (hq + hk) * d, b * s * d
    if op == "fused_linear_cross_entropy":
        return (dims.t + dims.v) * dims.h, 0
    rows, hidden = dims
    param_rows = ada_batch(rows) if op == "ada_norm" else 1
    return rows * hidden, param_rows * hidden


def traffic_bytes(op: str, mode: str, dims: tuple, elt: int) -> int:
    m = base_mode(mode)
    big, small = tensor_elements(op, dims)
    return (ROW_TENSORS[(op, m)] * big + PARAM_TENSORS[(op, m)] * small) * elt


def flop_count(op: str, mode: str, dims: tuple) -> int:
    if op == "fused_linear_cross_entropy":  # GEMMs of 2*T*H*V: logits (fwd); + dhidden, dweight (bwd)
        return 2 * dims.t * dims.h * dims.v * (3 if base_mode(mode) == "fwdbwd" else 1)
    return FLOPS_PER_ELT[(op, base_mode(mode))] * tensor_elements(op, dims)[0]


# ---- the providers ---------------------------------------------------------------------------
# Each provider is fn(t: dict of tensors) -> tuple of outputs; outputs[0] is y (what backward
# starts from); add_rms_norm also returns s = x + residual; apply_rope returns (q_out, k_out).

def _eager_rms(x, w, eps):
    # transformers LlamaRMSNorm.forward, verbatim math
    h = x.float()
    v = h.pow(2).mean(-1, keepdim=True)
    h = h * torch.rsqrt(v + eps)
    return w * h.to(x.dtype)


def _eager_layer(x, w, b, eps):
    # plain fp32 layer-norm math (F.layer_norm's semantics, written out as unfused ops)
    h = x.float()
    mu = h.mean(-1, keepdim=True)
    d = h - mu
    var = d.pow(2).mean(-1, keepdim=True)
    return (d * torch.rsqrt(var + eps) * w.float() + b.float()).to(x.dtype)


def eager_rms_norm(t):
    return (_eager_rms(t["x"], t["weight"], EPS["rms_norm"]),)


def eager_add_rms_norm(t):
    s = t["x"] + t["residual"]
    return (_eager_rms(s, t["weight"], EPS["add_rms_norm"]), s)


def eager_layer_norm(t):
    return (_eager_layer(t["x"], t["weight"], t["bias"], EPS["layer_norm"]),)


def eager_ada_norm(t):
    # diffusers AdaLayerNorm pattern (elementwise_affine=False, eps=1e-6)
    x = t["x"]
    return (F.layer_norm(x, (x.shape[-1],), eps=EPS["ada_norm"]) * (1 + t["scale"]) + t["shift"],)


def eager_silu_and_mul(t):
    # vLLM SiluAndMul.forward_native
    x = t["x"]
    d = x.shape[-1] // 2
    return (F.silu(x[..., :d]) * x[..., d:],)


def eager_swiglu(t):
    # transformers LlamaMLP: act_fn(gate_proj(x)) * up_proj(x)
    return (F.silu(t["gate"]) * t["up"],)


def eager_gelu_and_mul(t):
    # diffusers GEGLU.forward after the projection: hidden_states, gate = x.chunk(2, dim=-1)
    hidden, gate = t["x"].chunk(2, dim=-1)
    return (hidden * F.gelu(gate, approximate=GELU_AND_MUL_ARGS["approximate"]),)


def eager_geglu(t):
    # diffusers GEGLU(approximate="tanh"): hidden_states * self.gelu(gate)
    return (t["hidden"] * F.gelu(t["gate"], approximate=GEGLU_APPROX),)


def eager_gelu(t):
    return (F.gelu(t["x"]),)


EAGER = {
    "rms_norm": eager_rms_norm,
    "add_rms_norm": eager_add_rms_norm,
    "layer_norm": eager_layer_norm,
    "ada_norm": eager_ada_norm,
    "silu_and_mul": eager_silu_and_mul,
    "swiglu": eager_swiglu,
    "gelu_and_mul": eager_gelu_and_mul,
    "geglu": eager_geglu,
    "gelu": eager_gelu,
    "cross_entropy": lambda t: (F.cross_entropy(t["logits"].float(), t["target"]),),
    "fused_linear_cross_entropy": lambda t: (F.cross_entropy((t["hidden"] @ t["weight"].t()).float(), t["target"]),),
    "softmax": lambda t: (torch.softmax(t["x"], -1),),
    "log_softmax": lambda t: (torch.log_softmax(t["x"], -1),),
}


def native_rms_norm(t):
    x = t["x"]
    return (F.rms_norm(x, (x.shape[-1],), t["weight"], EPS["rms_norm"]),)


def native_layer_norm(t):
    x = t["x"]
    return (F.layer_norm(x, (x.shape[-1],), t["weight"], t["bias"], EPS["layer_norm"]),)


def hf_apply_rope() -> Callable:
    """transformers' Llama apply_rotary_pos_emb, as LlamaAttention.forward calls it (unsqueeze_dim=1:
    q, k [B, H, S, D], cos/sin [B, S, D]). Imported when the provider is made: transformers is no
    dependency of the bench; without it this peer (and compile) fails, the run goes on."""
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb  # noqa: PLC0415

    def eager_apply_rope(t):
        return apply_rotary_pos_emb(t["q"], t["k"], t["cos"], t["sin"])

    return eager_apply_rope


def eager_provider(op: str) -> Callable:
    return hf_apply_rope() if op in ROPE_OPS else EAGER[op]


NATIVE = {"rms_norm": native_rms_norm, "layer_norm": native_layer_norm, "gelu": eager_gelu}
NATIVE.update({op: EAGER[op] for op in SOFTMAX_OPS})  # torch.softmax / log_softmax


def _kf():
    import kernelforge as kf  # noqa: PLC0415  (lazy: the CLI must start without the extension)

    return kf


def kf_provider(op: str) -> Callable:
    kf = _kf()
    eps = EPS.get(op)  # norm ops only
    if op == "cross_entropy":
        return lambda t: (kf.cross_entropy(t["logits"], t["target"]),)
    if op == "fused_linear_cross_entropy":
        return lambda t: (kf.fused_linear_cross_entropy(t["hidden"], t["weight"], t["target"]),)
    if op == "rms_norm":
        return lambda t: (kf.rms_norm(t["x"], t["weight"], eps),)
    if op == "add_rms_norm":
        return lambda t: tuple(kf.add_rms_norm(t["x"], t["residual"], t["weight"], eps))
    if op == "layer_norm":
        return lambda t: (kf.layer_norm(t["x"], t["weight"], t["bias"], eps),)
    if op == "ada_norm":
        return lambda t: (kf.ada_norm(t["x"], t["scale"], t["shift"], None, None, eps, kind="layer"),)
    if op == "silu_and_mul":
        return lambda t: (kf.silu_and_mul(t["x"]),)
    if op == "swiglu":
        return lambda t: (kf.swiglu(t["gate"], t["up"]),)
    if op == "gelu_and_mul":
        return lambda t: (kf.gelu_and_mul(t["x"], **GELU_AND_MUL_ARGS),)
    if op == "geglu":
        return lambda t: (kf.geglu(t["hidden"], t["gate"], approximate=GEGLU_APPROX),)
    if op in SOFTMAX_OPS:
        return lambda t: (getattr(kf, op)(t["x"]),)
    if op == "apply_rope":  # HF's strided [B, H, S, D] views as they are (any strides, last one 1)
        return lambda t: kf.apply_rope(t["q"], t["k"], t["cos"], t["sin"], layout="bhsd")
    return lambda t: (kf.gelu(t["x"]),)


def liger_activation(op: str) -> Callable | None:
    """Liger's SwiGLU / GeGLU autograd functions (liger_kernel.ops). Their backward writes the
    gradients into the saved gate/up buffers (Liger's design): the inputs of later timed calls then
    hold gradient values, which changes no timing; each mode's correctness check runs first."""
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


def liger_rope() -> Callable | None:
    """Liger's liger_rotary_pos_emb (what its HF Llama patch installs; its dispatcher picks the Triton
    kernel, or on sm_90+ with cutlass.cute importable a CuTe DSL one). The Triton kernel works in
    place on HF's [B, H, S, D] views of [B, S, H, D] memory: its transpose back is contiguous, so its
    .contiguous() copies nothing and the kernel overwrites q and k (in the backward, dq_out and
    dk_out, laid out the same way). Later timed calls then run on rotated values, which changes no
    timing; each mode's correctness check runs first, and Liger runs last of the providers."""
    try:
        from liger_kernel.transformers.rope import liger_rotary_pos_emb  # noqa: PLC0415
    except Exception:  # noqa: BLE001
        return None
    return lambda t: liger_rotary_pos_emb(t["q"], t["k"], t["cos"], t["sin"])


def liger_softmax(op: str) -> Callable | None:
    """Liger's softmax autograd function (liger_kernel.ops.softmax; it has no log_softmax)."""
    try:
        from liger_kernel.ops.softmax import LigerSoftmaxFunction  # noqa: PLC0415
    except Exception:  # noqa: BLE001
        return None
    return (lambda t: (LigerSoftmaxFunction.apply(t["x"]),)) if op == "softmax" else None


def liger_loss(op: str) -> Callable | None:
    """Liger's cross-entropy / fused linear cross-entropy (liger_kernel.transformers.functional). Its
    cross-entropy computes the gradient in the forward and stores it in the logits buffer (Liger's
    design): later timed calls then run on gradient values, which changes no timing; each mode's
    correctness check runs first, and Liger runs last of the providers."""
    try:
        from liger_kernel.transformers import functional as lf  # noqa: PLC0415
    except Exception:  # noqa: BLE001
        return None
    if op == "cross_entropy":
        return lambda t: (lf.liger_cross_entropy(t["logits"], t["target"]),)
    return lambda t: (lf.liger_fused_linear_cross_entropy(t["hidden"], t["weight"], t["target"]),)


def liger_provider(op: str) -> Callable | None:
    if op in LOSS_OPS:
        return liger_loss(op)
    if op in SOFTMAX_OPS:
        return liger_softmax(op)
    if op in ACT_OPS:
        return liger_activation(op)
    if op in ROPE_OPS:
        return liger_rope()
    try:
        from liger_kernel.transformers import functional as lf  # noqa: PLC0415
    except Exception:  # noqa: BLE001  (not installed, or its import fails: no liger peer)
        return None
    eps = EPS[op]
    # in_place=False: with True, Liger writes dx into dy, and the timing loop reuses dy.
    if op == "rms_norm":
        return lambda t: (lf.liger_rms_norm(t["x"], t["weight"], eps, casting_mode="llama",
                                            in_place=False),)
    if op == "add_rms_norm":
        return lambda t: tuple(lf.liger_fused_add_rms_norm(t["x"], t["residual"], t["weight"], eps,
                                                           casting_mode="llama", in_place=False))
    if op == "layer_norm":
        return lambda t: (lf.liger_layer_norm(t["x"], t["weight"], t["bias"], eps),)
    return None


def liger_available() -> bool:
    return liger_provider("rms_norm") is not None


def make_provider(name: str, op: str) -> Callable | None:
    if name == "kernelforge":
        return kf_provider(op)
    if name == "eager":
        return eager_provider(op)
    if name == "torch_native":
        return NATIVE.get(op)
    if name == "compile":
        return torch.compile(eager_provider(op), dynamic=False)
    if name == "liger":
        return liger_provider(op)
    raise ValueError(f"unknown provider {name!r}")


# ---- inputs --------------------------------------------------------------------------------

GRAD_INPUTS = {
    "rms_norm": ("x", "weight"),
    "add_rms_norm": ("x", "residual", "weight"),
    "layer_norm": ("x", "weight", "bias"),
    "ada_norm": ("x", "scale", "shift"),
    "silu_and_mul": ("x",),
    "swiglu": ("gate", "up"),
    "gelu_and_mul": ("x",),
    "geglu": ("hidden", "gate"),
    "gelu": ("x",),
    "apply_rope": ("q", "k"),
    "softmax": ("x",),
    "cross_entropy": ("logits",),
    "fused_linear_cross_entropy": ("hidden", "weight"),
    "log_softmax": ("x",),
}


def hf_rope_tables(position_ids: torch.Tensor, d: int, dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin [B, S, D] in `dtype` for position_ids [B, S], as transformers' LlamaRotaryEmbedding
    computes them (rope_theta 10000, no scaling): angles in float32, emb = cat(freqs, freqs) (the
    rotate-half pairing's duplicated halves), cos/sin in float32, then cast to q's dtype."""
    inv_freq = 1.0 / 10000.0 ** (torch.arange(0, d, 2, device=position_ids.device, dtype=torch.float32) / d)
    freqs = position_ids.float()[..., None] * inv_freq
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos().to(dtype), emb.sin().to(dtype)


def make_inputs(op: str, dims: tuple, dtype, device, seed: int = 0) -> dict:
    """Fresh random inputs (never zeros) for one case, plus dy (apply_rope: dq_out, dk_out) for the
    backward."""
    g = torch.Generator(device=device).manual_seed(seed)

    def rnd(*shape, scale=1.0, offset=0.0):
        v = torch.randn(*shape, generator=g, device=device, dtype=torch.float32)
        return (v * scale + offset).to(dtype)

    t: dict = {}
    if op in ROPE_OPS:
        b, s, hq, hk, d = dims
        # HF Llama attention: q_proj(x).view(B, S, H, D).transpose(1, 2), a [B, H, S, D] view of
        # [B, S, H, D] memory; the gradients from attention are laid out the same way.
        for name, heads in (("q", hq), ("k", hk), ("dq_out", hq), ("dk_out", hk)):
            t[name] = rnd(b, s, heads, d).transpose(1, 2)
        # each sequence of the batch starts at a random position < 4096 (a decode step is then not
        # at position 0, where sin = 0 and the rotation is the identity)
        start = torch.randint(0, 4096, (b, 1), generator=g, device=device)
        t["cos"], t["sin"] = hf_rope_tables(start + torch.arange(s, device=device), d, dtype)
        return t
    if op in LOSS_OPS:  # targets: uniform classes, every 20th token ignored (-100); dy = 1 (a loss)
        tokens, vocab = (dims.t, dims.v) if isinstance(dims, FlceShape) else dims
        if op == "cross_entropy":
            t["logits"] = rnd(tokens, vocab, scale=2.0)
        else:  # hidden ~ N(0, 1), weight ~ N(0, 1/H): logits of std ~1
            t["hidden"] = rnd(tokens, dims.h)
            t["weight"] = rnd(vocab, dims.h, scale=dims.h ** -0.5)
        t["target"] = torch.randint(0, vocab, (tokens,), generator=g, device=device)
        t["target"][::20] = -100
        t["dy"] = torch.ones((), device=device)
        return t
    rows, hidden = dims
    if op in SOFTMAX_OPS:  # logits of std 2 (exp(x - m) spans a few decades)
        t["x"] = rnd(rows, hidden, scale=2.0)
        t["dy"] = rnd(rows, hidden)
        return t
    if op in ACT_OPS:  # hidden = I, the output width; the fused ops read [rows, 2I]
        if op in ("silu_and_mul", "gelu_and_mul"):
            t["x"] = rnd(rows, 2 * hidden)
        else:
            for name in GRAD_INPUTS[op]:
                t[name] = rnd(rows, hidden)
        t["dy"] = rnd(rows, hidden)
        return t
    if op == "ada_norm":
        b = ada_batch(rows)
        t["x"] = rnd(b, rows // b, hidden)
        t["scale"] = rnd(b, 1, hidden, scale=0.1)
        t["shift"] = rnd(b, 1, hidden, scale=0.1)
    else:
        t["x"] = rnd(rows, hidden)
        t["weight"] = rnd(hidden, scale=0.1, offset=1.0)
        if op == "layer_norm":
            t["bias"] = rnd(hidden, scale=0.1)
        if op == "add_rms_norm":
            t["residual"] = rnd(rows, hidden)
    t["dy"] = rnd(*t["x"].shape)
    return t


# ---- timing ----------------------------------------------------------------------------------

@dataclass
class Budget:
    warm_ms: float = 25.0
    rep_ms: float = 100.0
    min_reps: int = 10
    max_reps: int = 1000
    graph_calls: int = 100
    graph_replays: int = 20
    call_loop: int = 1000
    call_repeats: int = 5


QUICK = Budget(warm_ms=2.0, rep_ms=5.0, min_reps=3, max_reps=20, graph_calls=20, graph_replays=3,
               call_loop=100, call_repeats=2)


HEAD_START_CYCLES = 1_000_000  # GPU clock cycles of torch.cuda._sleep before each timed run
HEAD_START_MS = 0.5            # about that (H100 ~1.75-1.98 GHz), for the repetition budget


class Timer:
    """Median device time of fn, L2 flushed before every run (CUDA events), or wall clock on CPU."""

    def __init__(self, device: torch.device, budget: Budget):
        self.device = device
        self.cuda = device.type == "cuda"
        self.budget = budget
        self.flush_buf = None
        if self.cuda:
            l2 = getattr(torch.cuda.get_device_properties(device), "L2_cache_size", 0) or (64 << 20)
            self.flush_buf = torch.empty(max(2 * l2, 64 << 20) // 4, dtype=torch.int32, device=device)

    def sync(self):
        if self.cuda:
            torch.cuda.synchronize(self.device)

    def _estimate_ms(self, fn, pre) -> float:
        self.sync()
        t0 = time.perf_counter()
        n = 0
        while True:
            pre()
            fn()
            n += 1
            self.sync()
            el = (time.perf_counter() - t0) * 1e3
            if el > 2.0 or n >= 3:
                return el / n

    def median_ms(self, fn: Callable, pre: Callable = lambda: None, flush: bool = True) -> float:
        b = self.budget
        est = max(self._estimate_ms(fn, pre), 1e-3)
        n_warm = int(min(max(b.warm_ms / est, 1), 200))
        n_rep = int(min(max(b.rep_ms / (est + (HEAD_START_MS if self.cuda else 0.0)), b.min_reps), b.max_reps))
        for _ in range(n_warm):
            pre()
            fn()
        if not self.cuda:
            times = []
            for _ in range(n_rep):
                pre()
                t0 = time.perf_counter()
                fn()
                times.append((time.perf_counter() - t0) * 1e3)
            return statistics.median(times)
        starts = [torch.cuda.Event(enable_timing=True) for _ in range(n_rep)]
        ends = [torch.cuda.Event(enable_timing=True) for _ in range(n_rep)]
        for i in range(n_rep):
            pre()
            if flush:
                self.flush_buf.zero_()
            # A GPU-side wait before the start event, so that the host is ahead of the GPU when the
            # timed work begins: the interval then holds GPU time only (the host time of a call is
            # what fwd_call measures). Without it, short steps whose host path outlasts the flush
            # (forward + autograd backward: ~150 µs) measured host gaps, up to 30 % between runs.
            torch.cuda._sleep(HEAD_START_CYCLES)
            starts[i].record()
            fn()
            ends[i].record()
        self.sync()
        return statistics.median(s.elapsed_time(e) for s, e in zip(starts, ends))

    def graph_ms(self, fn: Callable) -> float:
        """Capture graph_calls calls in one CUDA graph; median replay time / calls."""
        if not self.cuda:
            raise RuntimeError("CUDA graphs need a CUDA device")
        b = self.budget
        side = torch.cuda.Stream(self.device)
        side.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(side):
            for _ in range(3):
                fn()
        torch.cuda.current_stream(self.device).wait_stream(side)
        self.sync()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for _ in range(b.graph_calls):
                fn()
        graph.replay()
        self.sync()
        starts = [torch.cuda.Event(enable_timing=True) for _ in range(b.graph_replays)]
        ends = [torch.cuda.Event(enable_timing=True) for _ in range(b.graph_replays)]
        for s, e in zip(starts, ends):
            s.record()
            graph.replay()
            e.record()
        self.sync()
        ms = statistics.median(s.elapsed_time(e) for s, e in zip(starts, ends)) / b.graph_calls
        del graph
        return ms

    def call_ms(self, fn: Callable) -> float:
        """Eager per-call time with the host path: wall clock around a loop of calls, one sync."""
        b = self.budget
        for _ in range(10):
            fn()
        self.sync()
        times = []
        for _ in range(b.call_repeats):
            t0 = time.perf_counter()
            for _ in range(b.call_loop):
                fn()
            self.sync()
            times.append((time.perf_counter() - t0) * 1e3 / b.call_loop)
        return statistics.median(times)


def measure_copy_at(nbytes: int, timer: "Timer") -> float:
    """GB/s of dst.copy_(src) moving `nbytes` (half read, half written), timed by `timer` like the
    ops (L2 flushed, GPU head start, median): the speed of light at that size, fixed costs included
    (launch, ramp-up, and the write-back of the dirty lines the zero-fill flush leaves in L2)."""
    src = torch.randint(0, 256, (nbytes // 2,), dtype=torch.uint8, device=timer.device)
    dst = torch.empty_like(src)
    ms = timer.median_ms(lambda: dst.copy_(src))
    del src, dst
    return 2 * (nbytes // 2) / (ms * 1e-3) / 1e9


def measure_copy_gbps(device: torch.device, nbytes: int = 1 << 30, reps: int = 20) -> float:
    """Device-to-device copy of a 1 GiB buffer, bytes read + written over the median time."""
    if device.type != "cuda":
        return float("nan")
    src = torch.randint(0, 256, (nbytes,), dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    for _ in range(3):
        dst.copy_(src)
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    for s, e in zip(starts, ends):
        s.record()
        dst.copy_(src)
        e.record()
    torch.cuda.synchronize(device)
    ms = statistics.median(s.elapsed_time(e) for s, e in zip(starts, ends))
    del src, dst
    torch.cuda.empty_cache()
    return 2 * nbytes / (ms * 1e-3) / 1e9


# ---- correctness of the peers ------------------------------------------------------------------

CHECK_TOL = {torch.float32: 1e-4, torch.float16: 5e-3, torch.bfloat16: 2e-2}  # relative L2 error


def rel_l2(a: torch.Tensor, b: torch.Tensor) -> float:
    a = a.detach().double().flatten()
    b = b.detach().double().flatten()
    if not torch.isfinite(a).all():
        return float("inf")
    den = b.norm().item()
    return (a - b).norm().item() / (den if den > 0 else 1.0)


def run_once(fn, t, op, mode):
    """Outputs (and, for fwdbwd, the grads of GRAD_INPUTS) of one call, detached copies."""
    names = GRAD_INPUTS[op]
    if mode == "fwdbwd":
        for n in names:
            t[n].grad = None
        outs = fn(t)
        if op in ROPE_OPS:
            torch.autograd.backward(outs, (t["dq_out"], t["dk_out"]))
        else:
            outs[0].backward(t["dy"])
        res = [o.detach().clone() for o in outs] + [t[n].grad.clone() for n in names]
        for n in names:
            t[n].grad = None
        return res
    with torch.no_grad():
        return [o.detach().clone() for o in fn(t)]


def result_names(op, mode):
    outs = {"add_rms_norm": ["y", "s"], "apply_rope": ["q_out", "k_out"]}.get(op, ["y"])
    return outs + ([f"d{n}" for n in GRAD_INPUTS[op]] if mode == "fwdbwd" else [])


# ---- the run ---------------------------------------------------------------------------------

CSV_FIELDS = ("op", "mode", "shape", "dtype", "provider", "ms_median", "gbps", "tflops",
              "pct_of_copy_bw", "speedup_vs_best_peer", "gpu", "torch_version", "commit",
              "copy_same_bytes_gbps", "pct_of_copy_same_bytes", "peak_extra_mib")


@dataclass
class Result:
    op: str
    mode: str
    dims: tuple  # (rows, hidden), or a RopeShape for apply_rope
    dtype: str
    provider: str
    ms: float
    note: str = ""
    peak_mib: float = float("nan")  # loss ops: peak memory of one call above inputs and outputs

    @property
    def shape(self) -> str:
        return shape_label(self.dims)


@dataclass
class RunInfo:
    gpu: str
    torch_version: str
    commit: str
    copy_gbps: float
    problems: list = field(default_factory=list)
    # GB/s of a device-to-device copy moving the same bytes as one measurement, timed by the same
    # Timer (flush, head start): the ceiling at that size, fixed costs included (see notes/bench.md).
    copy_at: dict = field(default_factory=dict)


def git_commit() -> str:
    env = os.environ.get("KF_COMMIT")
    if env:
        return env
    here = os.path.dirname(os.path.realpath(__file__))
    try:
        sha = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=here, capture_output=True,
                             text=True, timeout=10)
        if sha.returncode != 0:
            return ""
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=here,
                               capture_output=True, text=True, timeout=10)
        return sha.stdout.strip() + ("-dirty" if dirty.stdout.strip() else "")
    except (OSError, subprocess.SubprocessError):
        return ""


def parse_shapes(text: str) -> list[tuple]:
    """ROWSxHIDDEN items give (rows, hidden); b{B}s{S}h{Hq}/{Hk}d{D} items a RopeShape."""
    shapes: list[tuple] = []
    for item in text.split(","):
        item = item.strip().lower()
        if not item:
            continue
        m = FLCE_SHAPE_RE.fullmatch(item)
        if m:
            fs = FlceShape(*(int(v) for v in m.groups()))
            if min(fs) == 0:
                raise argparse.ArgumentTypeError(f"shape {item!r}: sizes must be > 0")
            shapes.append(fs)
            continue
        m = ROPE_SHAPE_RE.fullmatch(item)
        if m:
            rs = RopeShape(*(int(v) for v in m.groups()))
            if min(rs) == 0 or rs.d % 2:
                raise argparse.ArgumentTypeError(f"shape {item!r}: sizes must be > 0 and the head dim "
                                                 "even (RoPE rotates pairs of columns)")
            shapes.append(rs)
            continue
        parts = item.split("x")
        if len(parts) != 2 or not all(p.isdigit() and int(p) > 0 for p in parts):
            raise argparse.ArgumentTypeError(f"shape {item!r} is not ROWSxHIDDEN, e.g. 16384x4096, nor "
                                             "b{B}s{S}h{Hq}/{Hk}d{D} (apply_rope), e.g. b4s4096h32/8d128")
        shapes.append((int(parts[0]), int(parts[1])))
    if not shapes:
        raise argparse.ArgumentTypeError("--shapes is empty")
    return shapes


def _csv_list(allowed, what):
    def parse(text):
        items = [s.strip() for s in text.split(",") if s.strip()]
        bad = [s for s in items if s not in allowed]
        if bad or not items:
            raise argparse.ArgumentTypeError(
                f"unknown {what} {', '.join(bad) or '(none)'}; choose from {', '.join(allowed)}")
        return items
    return parse


def default_shapes(op: str) -> list[tuple]:
    if op == "cross_entropy":
        return list(CE_SHAPES)
    if op == "fused_linear_cross_entropy":
        return list(FLCE_SHAPES)
    if op in ROPE_OPS:
        return list(ROPE_SHAPES)
    if op in SOFTMAX_OPS:
        return list(DEFAULT_SHAPES) + list(SOFTMAX_LONG_ROW_SHAPES)
    return list(DEFAULT_SHAPES) + (list(LONG_ROW_SHAPES) if op in LONG_ROW_OPS else [])


def op_shapes(op: str, shapes: list | None) -> list[tuple]:
    """The op's shapes: those of its kind in --shapes (RopeShapes for apply_rope, ROWSxHIDDEN for
    the others), or its defaults when --shapes is not given."""
    if shapes is None:
        return default_shapes(op)
    def kind(sh):
        return "rope" if isinstance(sh, RopeShape) else "flce" if isinstance(sh, FlceShape) else "rows"

    want = "rope" if op in ROPE_OPS else "flce" if op == "fused_linear_cross_entropy" else "rows"
    return [sh for sh in shapes if kind(sh) == want]


def plan_cases(args) -> list[tuple[str, tuple, str]]:
    """Family by family (norm, then activation, then rope: a run cut short by --max-seconds loses
    rope cases first, then activation cases, and the norm plan is what it was before the other
    families existed), shape-major within a family: every op at the first shape, then the next
    shape, ... so that a cut run has covered all of a family's ops at the leading shapes (summary
    and plots regroup by op)."""
    cases = []
    for family in (NORM_OPS, ACT_OPS, ROPE_OPS, SOFTMAX_OPS, LOSS_OPS):
        ops = [op for op in args.ops if op in family]
        shapes: list = []
        for op in ops:
            for sh in op_shapes(op, args.shapes):
                if sh not in shapes:
                    shapes.append(sh)
        for dims in shapes:
            for op in ops:
                if dims in op_shapes(op, args.shapes):
                    for dt in args.dtype:
                        cases.append((op, dims, dt))
    return cases


def op_order(groups: list[list[Result]], ops) -> list[list[Result]]:
    """Groups regrouped by op (stable: shapes keep their run order)."""
    return sorted((g for g in groups if g), key=lambda g: list(ops).index(g[0].op))


def modes_for(rows: int, modes) -> list[str]:
    return [m for m in modes if m in ("fwd", "fwdbwd") or rows <= DECODE_MAX_ROWS]


def fmt_ms(ms: float) -> str:
    return "nan" if not math.isfinite(ms) else f"{ms:.5f}"


def derived(res: Result, elt: int, copy_gbps: float, best_peer_ms: float, copy_at: dict | None = None) -> dict:
    ok = math.isfinite(res.ms) and res.ms > 0
    nbytes = traffic_bytes(res.op, res.mode, res.dims, elt)
    gbps = nbytes / (res.ms * 1e-3) / 1e9 if ok else float("nan")
    tflops = flop_count(res.op, res.mode, res.dims) / (res.ms * 1e-3) / 1e12 if ok else float("nan")
    pct = 100.0 * gbps / copy_gbps if ok and math.isfinite(copy_gbps) else float("nan")
    speed = best_peer_ms / res.ms if ok and math.isfinite(best_peer_ms) else float("nan")
    size_copy = (copy_at or {}).get(nbytes, float("nan")) if res.mode in ("fwd", "fwdbwd") else float("nan")
    pct_size = 100.0 * gbps / size_copy if ok and math.isfinite(size_copy) else float("nan")
    return {"gbps": gbps, "tflops": tflops, "pct": pct, "speedup": speed, "size_copy": size_copy,
            "pct_size": pct_size}


def _num(v: float, digits: int) -> str:
    return f"{v:.{digits}f}" if math.isfinite(v) else ""


def best_peer(results: list[Result]) -> tuple[str, float]:
    peers = [r for r in results if r.provider != "kernelforge" and math.isfinite(r.ms)]
    if not peers:
        return "", float("nan")
    b = min(peers, key=lambda r: r.ms)
    return b.provider, b.ms


class CsvSink:
    """Writes one group of rows (same op/mode/shape/dtype) at a time, so a killed run keeps them."""

    def __init__(self, path: str, info: RunInfo):
        self.path = path
        self.info = info
        self.f = open(path, "w", newline="")
        self.w = csv.writer(self.f)
        self.w.writerow(CSV_FIELDS)
        self.f.flush()

    def write_group(self, group: list[Result], elt: int):
        _, peer_ms = best_peer(group)
        for r in group:
            d = derived(r, elt, self.info.copy_gbps, peer_ms, self.info.copy_at)
            self.w.writerow([r.op, r.mode, r.shape, r.dtype, r.provider, fmt_ms(r.ms),
                             _num(d["gbps"], 1), _num(d["tflops"], 3), _num(d["pct"], 1),
                             _num(d["speedup"], 3), self.info.gpu, self.info.torch_version,
                             self.info.commit, _num(d["size_copy"], 1), _num(d["pct_size"], 1),
                             _num(r.peak_mib, 1)])
        self.f.flush()

    def close(self):
        self.f.close()


def run_case(op, dims, dt, args, timer, info, providers, log) -> list[list[Result]]:
    """All modes and providers of one (op, shape, dtype); returns one list of results per mode."""
    dtype = DTYPES[dt]
    device = timer.device
    elt = torch.empty((), dtype=dtype).element_size()
    torch._dynamo.reset()  # fresh compile caches: every shape compiles for itself (dynamic=False)
    t = make_inputs(op, dims, dtype, device)
    fns: dict = {}
    for name in providers:
        try:
            fn = make_provider(name, op)
        except Exception as e:  # noqa: BLE001
            fn = e
        if fn is not None:
            fns[name] = fn
    groups = []
    for mode in modes_for(case_rows(dims), args.modes):
        bmode = base_mode(mode)
        for n in GRAD_INPUTS[op]:
            t[n].requires_grad_(bmode == "fwdbwd")
        ref = None
        group = []
        for name, fn in fns.items():
            note = ""
            ms = peak = float("nan")
            try:
                if isinstance(fn, Exception):
                    raise fn
                # correctness against kernelforge (kernelforge itself runs first)
                if mode in ("fwd", "fwdbwd"):
                    got = run_once(fn, t, op, bmode)
                    if name == "kernelforge":
                        ref = got
                    elif ref is not None:
                        tol = CHECK_TOL[dtype]
                        errs = [rel_l2(a, b) for a, b in zip(got, ref)]
                        worst = max(range(len(errs)), key=lambda i: errs[i])
                        if errs[worst] > tol:
                            note = (f"MISMATCH vs kernelforge: {result_names(op, bmode)[worst]} "
                                    f"rel_l2={errs[worst]:.2e} > {tol:.0e}")
                ms = time_one(fn, t, op, mode, timer)
                if op in LOSS_OPS and mode in ("fwd", "fwdbwd") and device.type == "cuda":
                    peak = peak_extra_mib(fn, t, op, mode, device)
            except Exception as e:  # noqa: BLE001  (a failing provider is recorded, not fatal)
                msg = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
                note = f"FAILED: {type(e).__name__}: {msg[:160]}"
                if device.type == "cuda":
                    torch.cuda.synchronize(device)
            res = Result(op, mode, dims, dt, name, ms, note, peak if op in LOSS_OPS else float("nan"))
            group.append(res)
            if note:
                info.problems.append(((op, res.shape, dt, name, note), mode))
            log(res, elt, info)
        for n in GRAD_INPUTS[op]:
            t[n].requires_grad_(False)
            t[n].grad = None
        groups.append(group)
    del t, fns
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return groups


def peak_extra_mib(fn, t, op, mode, device) -> float:
    """Peak memory of one call, in MiB, above what existed before it (the inputs) and what it leaves
    (its outputs; for fwdbwd the gradients of GRAD_INPUTS): the memory cost of the op itself, e.g.
    the [tokens, vocab] logits and their gradient of an eager loss."""
    names = GRAD_INPUTS[op]
    for n in names:
        t[n].grad = None
    torch.cuda.synchronize(device)
    torch.cuda.reset_peak_memory_stats(device)
    base = torch.cuda.memory_allocated(device)
    if mode == "fwdbwd":
        outs = fn(t)
        outs[0].backward(t["dy"])
        kept = [t[n].grad for n in names] + [o for o in outs]
    else:
        with torch.no_grad():
            kept = list(fn(t))
    torch.cuda.synchronize(device)
    extra = torch.cuda.max_memory_allocated(device) - base - sum(k.numel() * k.element_size() for k in kept)
    for n in names:
        t[n].grad = None
    return extra / 2**20


def time_one(fn, t, op, mode, timer: Timer) -> float:
    if mode == "fwdbwd":
        names = GRAD_INPUTS[op]

        def pre():
            for n in names:
                t[n].grad = None

        if op in ROPE_OPS:  # both outputs carry a gradient
            grads = (t["dq_out"], t["dk_out"])

            def step():
                torch.autograd.backward(fn(t), grads)
        else:
            dy = t["dy"]

            def step():
                fn(t)[0].backward(dy)

        return timer.median_ms(step, pre)
    with torch.no_grad():
        if mode == "fwd":
            return timer.median_ms(lambda: fn(t))
        if mode == "fwd_graph":
            return timer.graph_ms(lambda: fn(t))
        if mode == "fwd_call":
            return timer.call_ms(lambda: fn(t))
    raise ValueError(mode)


# ---- output: summary table and plots ---------------------------------------------------------

def merge_problems(problems: list) -> list[str]:
    """One line per (op, shape, dtype, provider, note), listing the modes it happened in."""
    merged: dict = {}
    for p in problems:
        if isinstance(p, tuple):
            merged.setdefault(p[0], []).append(p[1])
        else:
            merged.setdefault((p,), [])
    out = []
    for key, modes in merged.items():
        if len(key) == 1:
            out.append(key[0])
        else:
            op, shape, dt, name, note = key
            out.append(f"{op} {shape} {dt} {name} [{','.join(modes)}]: {note}")
    return out


def summary_lines(groups: list[list[Result]], info: RunInfo) -> list[str]:
    head = (f"{'op':<13} {'mode':<9} {'shape':<17} {'dtype':<5} {'kf us':>9} {'kf GB/s':>8} "
            f"{'%copy':>6} {'best peer':<13} {'peer us':>9} {'peer GB/s':>9} {'speedup':>8} "
            f"{'copy@size':>9} {'%':>5}")
    lines = [head, "-" * len(head)]
    for group in groups:
        if not group:
            continue
        r0 = group[0]
        elt = torch.empty((), dtype=DTYPES[r0.dtype]).element_size()
        peer_name, peer_ms = best_peer(group)
        kf = next((r for r in group if r.provider == "kernelforge"), None)
        kf_ms = kf.ms if kf else float("nan")
        nan = float("nan")
        kfd = (derived(kf, elt, info.copy_gbps, peer_ms, info.copy_at) if kf else
               {"gbps": nan, "pct": nan, "speedup": nan, "size_copy": nan, "pct_size": nan})
        peer_gbps = (traffic_bytes(r0.op, r0.mode, r0.dims, elt) / (peer_ms * 1e-3) / 1e9
                     if math.isfinite(peer_ms) else float("nan"))

        def f(v, d):
            return f"{v:.{d}f}" if math.isfinite(v) else "-"

        lines.append(f"{r0.op:<13} {r0.mode:<9} {r0.shape:<17} {r0.dtype:<5} {f(kf_ms * 1e3, 2):>9} "
                     f"{f(kfd['gbps'], 0):>8} {f(kfd['pct'], 1):>6} {peer_name or '-':<13} "
                     f"{f(peer_ms * 1e3, 2):>9} {f(peer_gbps, 0):>9} "
                     f"{(f(kfd['speedup'], 2) + 'x') if math.isfinite(kfd['speedup']) else '-':>8} "
                     f"{f(kfd['size_copy'], 0):>9} {f(kfd['pct_size'], 1):>5}")
    return lines


def memory_lines(groups: list[list[Result]]) -> list[str]:
    """Loss ops: peak memory above inputs and outputs per provider, and kernelforge's share of eager's."""
    lines = []
    for group in groups:
        if not group or group[0].op not in LOSS_OPS or group[0].mode not in ("fwd", "fwdbwd"):
            continue
        r0 = group[0]
        by = {r.provider: r.peak_mib for r in group if math.isfinite(r.peak_mib)}
        if not by:
            continue
        share = (f" (kernelforge = {100 * by['kernelforge'] / by['eager']:.1f}% of eager)"
                 if by.get("kernelforge") is not None and by.get("eager") else "")
        lines.append(f"{r0.op} {r0.mode} {r0.shape} {r0.dtype}: "
                     + ", ".join(f"{k} {v:.0f} MiB" for k, v in by.items()) + share)
    return (["", "peak memory above inputs and outputs (one call):"] + lines) if lines else []


PROVIDER_COLORS = {"kernelforge": "#d62728", "eager": "#7f7f7f", "torch_native": "#1f77b4",
                   "compile": "#2ca02c", "liger": "#ff7f0e"}


def plot_op(op: str, groups: list[list[Result]], info: RunInfo, path: str) -> None:
    import matplotlib  # noqa: PLC0415

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    groups = [g for g in groups if g and g[0].op == op]
    modes = [m for m in MODES if any(g[0].mode == m for g in groups)]
    if not modes:
        return
    n_shapes = max(sum(1 for g in groups if g[0].mode == m) for m in modes)
    fig, axes = plt.subplots(len(modes), 1, figsize=(max(8.0, 1.5 * n_shapes + 4), 3.6 * len(modes)),
                             squeeze=False)
    for ax, mode in zip(axes[:, 0], modes):
        mg = [g for g in groups if g[0].mode == mode]
        labels = [f"{g[0].shape}\n{g[0].dtype}" for g in mg]
        provs = [p for p in PROVIDERS if any(r.provider == p for g in mg for r in g)]
        width = 0.8 / max(len(provs), 1)
        vals_all = []
        for j, p in enumerate(provs):
            xs, vals = [], []
            for i, g in enumerate(mg):
                r = next((r for r in g if r.provider == p), None)
                if r is None:
                    continue
                elt = torch.empty((), dtype=DTYPES[r.dtype]).element_size()
                v = derived(r, elt, info.copy_gbps, float("nan"))["gbps"]
                xs.append(i - 0.4 + width * (j + 0.5))
                vals.append(v if math.isfinite(v) else 0.0)
                if math.isfinite(v):
                    vals_all.append(v)
            ax.bar(xs, vals, width, label=p, color=PROVIDER_COLORS.get(p))
            for x, v in zip(xs, vals):
                if v == 0.0:  # failed or not run: mark the empty slot
                    ax.text(x, 0.01, "x", transform=ax.get_xaxis_transform(), ha="center",
                            va="bottom", fontsize=8, color=PROVIDER_COLORS.get(p))
        if math.isfinite(info.copy_gbps):
            ax.axhline(info.copy_gbps, color="k", linestyle="--", linewidth=1,
                       label=f"D2D copy {info.copy_gbps:.0f} GB/s")
            vals_all.append(info.copy_gbps)
        pos = [v for v in vals_all if v > 0]
        if pos and max(pos) / min(pos) > 50:
            ax.set_yscale("log")
        ax.set_xticks(range(len(mg)))
        ax.set_xticklabels(labels, fontsize=8)
        ax.set_ylabel("GB/s (minimum traffic)")
        ax.set_title(f"{op} {mode}", fontsize=10)
        ax.legend(fontsize=7, ncol=3, loc="upper left", bbox_to_anchor=(1.0, 1.0))
        ax.grid(axis="y", alpha=0.3)
    fig.suptitle(f"kernelforge {op} on {info.gpu} (torch {info.torch_version}, {info.commit or 'no commit'})",
                 fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


# ---- CLI -------------------------------------------------------------------------------------

def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("ops", nargs="*", metavar="OP",
                   help=f"ops to time: {' '.join(OPS)}, or a group: {' '.join(OP_GROUPS)} (default: "
                        f"{' '.join(DEFAULT_OPS)})")
    p.add_argument("--ops", dest="ops_list", default=None,
                   help="the same as a comma list, e.g. --ops activation or --ops rms_norm,swiglu")
    p.add_argument("--shapes", type=parse_shapes, default=None,
                   help="ROWSxHIDDEN list, e.g. 16384x4096,1x4096 (default: 16384x{2048,4096,8192}, "
                        "{1,64}x4096, and 4096x65536, 2048x131072 for rms_norm and layer_norm); "
                        "apply_rope takes b{B}s{S}h{Hq}/{Hk}d{D} items (default: b4s4096h32/8d128, "
                        "b1s16384h32/8d128, b1s1h32/8d128, b64s1h32/8d128); each op runs the items "
                        "of its kind")
    p.add_argument("--dtype", type=_csv_list(tuple(DTYPES), "dtype"), default=["bf16"],
                   help="bf16 | fp16 | fp32 (comma list allowed; default bf16)")
    p.add_argument("--providers", type=_csv_list(PROVIDERS, "provider"), default=list(PROVIDERS),
                   help=f"comma list of {','.join(PROVIDERS)} (kernelforge always runs: it is the "
                        "reference for the peers' check and the speedup)")
    p.add_argument("--modes", type=_csv_list(MODES, "mode"), default=list(MODES),
                   help=f"comma list of {','.join(MODES)} (fwd_graph, fwd_call only for rows <= "
                        f"{DECODE_MAX_ROWS}; apply_rope: batch * seq tokens)")
    p.add_argument("--out", default="bench_out", help="output folder (default bench_out)")
    p.add_argument("--quick", action="store_true", help="few repetitions (smoke tests)")
    p.add_argument("--max-seconds", type=float, default=0.0,
                   help="soft time budget: no new case starts after it (outputs still written)")
    p.add_argument("--device", default="cuda", help=argparse.SUPPRESS)  # cpu: smoke tests only


def main(args: argparse.Namespace) -> int:
    t_start = time.monotonic()
    named = list(args.ops) + [o.strip() for o in (getattr(args, "ops_list", None) or "").split(",") if o.strip()]
    bad = [o for o in named if o not in OPS and o not in OP_GROUPS]
    if bad:
        print(f"kforge bench: unknown op {', '.join(bad)}; choose from {' '.join(OPS)} or a group "
              f"({' '.join(OP_GROUPS)})", file=sys.stderr)
        return 2
    expanded = [o for n in named for o in OP_GROUPS.get(n, (n,))]
    args.ops = list(dict.fromkeys(expanded or DEFAULT_OPS))
    device = torch.device(args.device)
    if device.type == "cuda" and device.index is None and torch.cuda.is_available():
        device = torch.device("cuda", torch.cuda.current_device())
    if device.type == "cuda" and not torch.cuda.is_available():
        print("kforge bench: no CUDA GPU is visible (torch.cuda.is_available() is False); "
              "the benchmark times CUDA kernels and needs one.", file=sys.stderr)
        return 2
    try:
        _kf()
        getattr(torch.ops.kernelforge, "rms_norm")
    except Exception as e:  # noqa: BLE001
        print(f"kforge bench: the kernelforge ops are not loaded ({type(e).__name__}: {e}). Build the "
              "extension first (scripts/dev_build.sh copies it to python/kernelforge/).",
              file=sys.stderr)
        return 2

    providers = ["kernelforge"] + [p for p in args.providers if p != "kernelforge"]
    if "liger" in providers and not liger_available():
        print("note: liger_kernel is not importable: no liger peer in this run", flush=True)
        providers.remove("liger")
    budget = QUICK if args.quick else Budget()
    cfg = torch._dynamo.config
    for name in ("recompile_limit", "cache_size_limit", "accumulated_recompile_limit",
                 "accumulated_cache_size_limit"):
        if hasattr(cfg, name):
            setattr(cfg, name, max(getattr(cfg, name), 256))

    if device.type == "cuda":
        torch.cuda.set_device(device)
        gpu = torch.cuda.get_device_name(device)
    else:
        gpu = "cpu"
    info = RunInfo(gpu=gpu, torch_version=torch.__version__, commit=git_commit(),
                   copy_gbps=measure_copy_gbps(device))
    timer = Timer(device, budget)
    os.makedirs(args.out, exist_ok=True)
    csv_path = os.path.join(args.out, "bench.csv")
    sink = CsvSink(csv_path, info)
    cases = plan_cases(args)
    unplanned = [op for op in args.ops if not any(c[0] == op for c in cases)]
    if unplanned:
        print(f"note: --shapes has no shape for {', '.join(unplanned)} (ROWSxHIDDEN for the norm and "
              "activation ops, b{B}s{S}h{Hq}/{Hk}d{D} for apply_rope): not run", flush=True)
    n_meas = sum(len(modes_for(case_rows(dims), args.modes))
                 * len([p for p in providers if p in OP_PROVIDERS[op]]) for op, dims, _ in cases)
    print(f"kforge bench on {gpu} | torch {info.torch_version} | commit {info.commit or '-'} | "
          f"D2D copy {info.copy_gbps:.0f} GB/s | {len(cases)} cases, {n_meas} measurements | "
          f"providers {','.join(providers)}", flush=True)
    counter = [0]

    def log(res: Result, elt: int, info: RunInfo):
        counter[0] += 1
        d = derived(res, elt, info.copy_gbps, float("nan"))
        gb = f"{d['gbps']:8.1f} GB/s {d['pct']:5.1f}%" if math.isfinite(d["gbps"]) else f"{'-':>8} GB/s {'-':>5} "
        us = f"{res.ms * 1e3:10.2f} us" if math.isfinite(res.ms) else f"{'nan':>10} us"
        print(f"[{counter[0]:>4}/{n_meas}] {res.op:<12} {res.mode:<9} {res.shape:<17} {res.dtype:<4} "
              f"{res.provider:<12} {us} {gb} {res.note}", flush=True)

    all_groups: list[list[Result]] = []
    skipped = 0
    for op, dims, dt in cases:
        if args.max_seconds and time.monotonic() - t_start > args.max_seconds:
            skipped += 1
            continue
        ops_providers = [p for p in providers if p in OP_PROVIDERS[op]]
        if device.type == "cuda":
            elt = torch.empty((), dtype=DTYPES[dt]).element_size()
            for m in ("fwd", "fwdbwd"):
                nbytes = traffic_bytes(op, m, dims, elt)
                if m in args.modes and case_rows(dims) > DECODE_MAX_ROWS and nbytes not in info.copy_at:
                    try:
                        info.copy_at[nbytes] = measure_copy_at(nbytes, timer)
                    except torch.OutOfMemoryError:
                        torch.cuda.empty_cache()
        try:
            groups = run_case(op, dims, dt, args, timer, info, ops_providers, log)
        except Exception as e:  # noqa: BLE001  (e.g. inputs out of memory: skip the case, go on)
            msg = str(e).strip().splitlines()[0] if str(e).strip() else ""
            info.problems.append(f"{op} {shape_label(dims)} {dt}: case skipped: {type(e).__name__}: {msg[:200]}")
            print(f"!! {op} {shape_label(dims)} {dt}: case skipped: {type(e).__name__}: {msg[:200]}", flush=True)
            if device.type == "cuda":
                torch.cuda.empty_cache()
            continue
        elt = torch.empty((), dtype=DTYPES[dt]).element_size()
        for g in groups:
            sink.write_group(g, elt)
        all_groups.extend(groups)
    sink.close()
    if skipped:
        info.problems.append(f"time budget --max-seconds {args.max_seconds:.0f} reached: "
                             f"{skipped} case(s) not run")

    pngs = []
    for op in args.ops:
        path = os.path.join(args.out, f"{op}.png")
        try:
            plot_op(op, all_groups, info, path)
            if os.path.exists(path):
                pngs.append(path)
        except Exception as e:  # noqa: BLE001  (a plot must not lose the CSV and the summary)
            info.problems.append(f"plot {op}: {type(e).__name__}: {e}")

    lines = [f"kforge bench summary: {gpu}, torch {info.torch_version}, commit {info.commit or '-'}, "
             f"D2D copy {info.copy_gbps:.0f} GB/s; speedup = best peer time / kernelforge time; "
             "copy@size = GB/s of a copy of the same bytes timed the same way, % = kernelforge's share of it", ""]
    lines += summary_lines(op_order(all_groups, args.ops), info)
    lines += memory_lines(op_order(all_groups, args.ops))
    if info.problems:
        lines += ["", "problems:"] + [f"  {p}" for p in merge_problems(info.problems)]
    lines += ["", f"csv: {csv_path}", f"png: {', '.join(pngs) or '-'}",
              f"wall: {time.monotonic() - t_start:.0f} s"]
    text = "\n".join(lines)
    with open(os.path.join(args.out, "summary.txt"), "w") as f:
        f.write(text + "\n")
    print("\n" + text, flush=True)
    return 0
