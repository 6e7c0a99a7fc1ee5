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

bmm (kernelforge.bmm: torch.bmm's a [B, M, K] @ b [B, K, N], one strided-batched cuBLASLt call; the
backward is two more): bench shapes are BmmShapes, b{B}m{M}n{N}k{K}, TFLOP/s of 2 B M N K forward, 6 B M
N K forward + backward, against torch.bmm (cuBLAS) and its torch.compile. Check shapes are (B, M, N, K),
b given as [B, K, N] or as a transposed [B, N, K] (passed without a copy).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from ._spec import BmmShape, LinearShape, OpSpec, check_out, f64, grads_of, kf, poison, randn
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


# ---- bmm ------------------------------------------------------------------------------------------


def _bmm_bytes(shape: BmmShape, mode: str, elt: int) -> int:
    # a and b read, the product written (informational: the op is compute-bound)
    fwd = shape.b * (shape.m * shape.k + shape.k * shape.n + shape.m * shape.n) * elt
    return fwd * 3 if mode == "fwdbwd" else fwd


def _bmm_flops(shape: BmmShape, mode: str) -> int:
    fwd = 2 * shape.b * shape.m * shape.n * shape.k
    return 3 * fwd if mode == "fwdbwd" else fwd


def _bmm_make(b, m, n, k, dtype, device, gen, transposed_b=False):
    """a ~ N(0, 1) [B, M, K], b ~ N(0, 1 / K) [B, K, N] (or a transposed [B, N, K]), dy ~ N(0, 1) [B, M, N]."""
    scale = 1 / math.sqrt(max(k, 1))
    bb = (randn(gen, device, dtype, b, n, k, scale=scale).transpose(1, 2) if transposed_b
          else randn(gen, device, dtype, b, k, n, scale=scale))
    return {"a": randn(gen, device, dtype, b, m, k), "b": bb, "dy": randn(gen, device, dtype, b, m, n)}


def _bmm_inputs(shape: BmmShape, dtype, device, gen):
    return _bmm_make(shape.b, shape.m, shape.n, shape.k, dtype, device, gen)


def _bmm_eager():
    """torch.bmm (cuBLAS)."""
    return lambda t: (torch.bmm(t["a"], t["b"]),)


# an 8 x 4096^3 batch, attention-score-like products (small K) and a mid-size batch
BMM_SHAPES = (BmmShape(8, 4096, 4096, 4096), BmmShape(64, 1024, 1024, 128), BmmShape(16, 2048, 512, 2048))
# (B, M, N, K): one element, odd sizes (N and K not multiples of 8), a long K
BMM_CHECK_SHAPES = ((1, 1, 1, 1), (3, 7, 129, 67), (2, 33, 40, 256), (5, 64, 8, 1000))
BMM_VARIANTS = ({}, {"transposed_b": True})


def _bmm_check_inputs(shape, v, dtype, device):
    return _bmm_make(*shape, dtype, device, None, transposed_b=v.get("transposed_b", False))


def _bmm_grads(t, y_of):
    """y = y_of(a, b) with a and b as leaves, and their gradients for t["dy"]."""
    leaves = {k: t[k].detach().clone().requires_grad_(True) for k in ("a", "b")}
    y = y_of(leaves["a"], leaves["b"])
    return y, {"y": y.detach(), **grads_of([y], [t["dy"]], leaves, ["a", "b"], t)}


def _bmm_check_run(kfm, t, v):
    shape = (t["a"].shape[0], t["a"].shape[1], t["b"].shape[2])
    poison([shape], t["a"].dtype, t["a"].device)
    y, res = _bmm_grads(t, kfm.bmm)
    check_out("y", y, shape, t["a"].dtype)
    return res


def _bmm_cpp_reference(a, v):
    """kf.bmm on float64 CPU tensors: the C++ reference and its autograd."""
    return _bmm_grads(a, kf().bmm)[1]


def _bmm_reference(a, v):
    return _bmm_grads(a, lambda x, y: x.to(f64) @ y.to(f64))[1]


BMM = OpSpec(
    name="bmm", family="gemm", shape_kind="bmm",
    inputs=_bmm_inputs, run=lambda t: (kf().bmm(t["a"], t["b"]),), grad_inputs=("a", "b"), grad_outputs=("dy",),
    outputs=("y",), row_bytes=_bmm_bytes, flops=_bmm_flops, shapes=BMM_SHAPES, eager=_bmm_eager,
    providers=("kernelforge", "eager", "compile"), modes=("fwd", "fwdbwd"), dtypes=(torch.bfloat16, torch.float16),
    bound="compute", check_shapes=BMM_CHECK_SHAPES, variants=BMM_VARIANTS, check_inputs=_bmm_check_inputs,
    check_run=_bmm_check_run, cpp_reference=_bmm_cpp_reference, reference=_bmm_reference,
    check_label=lambda shape: "b{}m{}n{}k{}".format(*shape), grad_tol_factor=2.0,
)

SPECS = (GEMM, BMM)
