"""The GEMM family: gemm (kernelforge.linear(x, w, bias, activation): y = act(x W^T + b), cuBLASLt with the
bias and the activation fused into the GEMM's epilogue; the backward two GEMMs with the bias gradient
fused into the weight gradient's).

Bench shapes are LinearShapes with a bias, written m{M}n{N}k{K}-bias[-relu|-gelu_tanh]: x [M, K],
w [N, K], bias [N], y [M, N]. The defaults: a Llama-3-8B / LTX-sized MLP up-projection with GELU at
4096 tokens (4096 -> 14336) and a 16384-token 4096 x 4096 projection, with and without GELU.

Compute-bound (``bound="compute"``): TFLOP/s of 2 M N K forward, 6 M N K forward + backward (dx and dW
are a GEMM each).

Peers: ``eager`` torch.nn.functional.linear then the activation (cuBLAS GEMM with the bias, then a
separate elementwise pass: what an unfused model runs), ``compile`` torch.compile of it (Inductor's
fusion of the epilogue), ``addmm_act`` torch._addmm_activation (torch's own cuBLASLt call with the
GELU / ReLU epilogue; activation shapes, forward only: it has no derivative).

Check shapes are (M, N, K): one row, odd sizes (N and K not multiples of 8), a long K, a 3-D x.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from ._spec import LinearShape, OpSpec, f64, kf, randn
from .linear import _check_run, _with_grads

# ---- float64 reference ----------------------------------------------------------------------------


def _act(y, act):
    if act == "relu":
        return y.relu()
    if act == "gelu_tanh":
        return F.gelu(y, approximate="tanh")
    return y


def gemm_ref(x, w, bias=None, act=""):
    """act(x w^T + bias) in float64."""
    y = x.to(f64) @ w.to(f64).t()
    return _act(y + bias.to(f64) if bias is not None else y, act)


# ---- bytes and FLOPs ------------------------------------------------------------------------------


def _bytes(shape: LinearShape, mode: str, elt: int) -> int:
    # x, w and the bias read, y written (informational: the op is compute-bound)
    fwd = (shape.m * shape.k + shape.n * shape.k + shape.n + shape.m * shape.n) * elt
    return fwd * 3 if mode == "fwdbwd" else fwd


def _flops(shape: LinearShape, mode: str) -> int:
    fwd = 2 * shape.m * shape.n * shape.k
    return 3 * fwd if mode == "fwdbwd" else fwd


# ---- bench ----------------------------------------------------------------------------------------


def _make(m, n, k, dtype, device, gen, lead=None):
    """x ~ N(0, 1) [M, K] (or [*lead, K]), w ~ N(0, 1 / K) (nn.Linear's scale), bias ~ N(0, 1), dy ~ N(0, 1)."""
    shape = lead if lead is not None else (m,)
    return {"x": randn(gen, device, dtype, *shape, k), "w": randn(gen, device, dtype, n, k, scale=1 / math.sqrt(max(k, 1))),
            "bias": randn(gen, device, dtype, n), "dy": randn(gen, device, dtype, *shape, n)}


def _inputs(shape: LinearShape, dtype, device, gen):
    if not shape.bias:
        raise ValueError(f"gemm bench shapes carry a bias (m{{M}}n{{N}}k{{K}}-bias[-act]), got {shape}")
    t = _make(shape.m, shape.n, shape.k, dtype, device, gen)
    t["act"] = shape.act
    return t


def _kf_run(t):
    return (kf().linear(t["x"], t["w"], t["bias"], activation=t["act"] or None),)


def _eager():
    """torch.nn.functional.linear (cuBLAS, bias in the GEMM), then the activation as its own pass."""
    return lambda t: (_act(F.linear(t["x"], t["w"], t["bias"]), t["act"]),)


def _addmm_act():
    """torch._addmm_activation: torch's cuBLASLt call with the GELU (tanh) / ReLU epilogue."""
    return lambda t: (torch._addmm_activation(t["bias"], t["x"], t["w"].t(), use_gelu=t["act"] == "gelu_tanh"),)


def _peer_applies(provider: str, shape) -> bool:
    return provider != "addmm_act" or bool(shape.act)


# Llama-3-8B / LTX-sized MLP up-projections with GELU, and a 16K-token 4096 x 4096 projection
SHAPES = (LinearShape(4096, 14336, 4096, True, "gelu_tanh"), LinearShape(16384, 4096, 4096, True, "gelu_tanh"),
          LinearShape(16384, 4096, 4096, True), LinearShape(4096, 4096, 14336, True))

# ---- kforge check ---------------------------------------------------------------------------------
# (M, N, K): one row, odd N / K (no 16-byte alignment), a long K, many rows
CHECK_SHAPES = ((1, 64, 64), (7, 129, 67), (33, 300, 256), (256, 512, 4104), (1000, 96, 40))
VARIANTS = ({}, {"act": "relu"}, {"act": "gelu_tanh"}, {"act": "gelu_tanh", "nobias": True})


def check_label(shape) -> str:
    return "m{}n{}k{}".format(*shape)


def _check_inputs(shape, v, dtype, device):
    m, n, k = shape
    t = _make(m, n, k, dtype, device, None)
    if v.get("nobias"):
        t["bias"] = None
    return t


def _cpp_reference(a, v):
    """The ops on float64 CPU tensors: the C++ reference through kf.linear's autograd."""
    return _with_grads(a, lambda a: kf().linear(a["x"], a["w"], a["bias"], activation=v.get("act") or "none"))


def _reference(a, v):
    return _with_grads(a, lambda a: gemm_ref(a["x"], a["w"], a["bias"], v.get("act", "")))


GEMM = OpSpec(
    name="gemm", family="gemm", shape_kind="linear",
    inputs=_inputs, run=_kf_run, grad_inputs=("x", "w", "bias"), grad_outputs=("dy",), outputs=("y",),
    row_bytes=_bytes, flops=_flops, shapes=SHAPES, eager=_eager,
    providers=("kernelforge", "eager", "compile", "addmm_act"), extra_peers={"addmm_act": _addmm_act},
    peer_applies=_peer_applies, peer_modes={"addmm_act": ("fwd",)}, modes=("fwd", "fwdbwd"), dtypes=(torch.bfloat16, torch.float16), bound="compute",
    check_shapes=CHECK_SHAPES, variants=VARIANTS, check_inputs=_check_inputs, check_run=_check_run,
    cpp_reference=_cpp_reference, reference=_reference, check_label=check_label, grad_tol_factor=2.0,
)

SPECS = (GEMM,)
