"""The linear family: linear (nn.Linear's y = x W^T + bias) for the few rows of a decode step.

Bench shapes are LinearShapes, written m{M}n{N}k{K}[-bias]: x [M, K], w [N, K] (nn.Linear's weight),
bias [N] with -bias, y [M, N]. The defaults are Llama-3-8B's decode projections (q / o 4096 x 4096,
gate / up 14336 x 4096, down 4096 x 14336, the fused qkv 6144 x 4096) at 1 .. 16 tokens and
Llama-3.2-1B's LM head (128256 x 2048).

linear at M <= 16 rows is memory-bound (``bound="memory"``): the minimum traffic is the weight read
once, N * K elements, plus x read and y written, M * (K + N), plus the bias, N; GB/s against copy@size
(a copy of the same bytes, measured although the rows are few: the weight is megabytes). FLOPs
(informational): 2 * M * N * K.

Peers: ``cublas`` torch.nn.functional.linear on the same tensors (cuBLAS / cuBLASLt: what nn.Linear
runs), ``compile`` torch.compile of it (Inductor may pick its own GEMM template or a GEMV). Forward only:
the backward is torch's GEMMs (kf.linear's autograd), not this family's work; kforge check still checks
the gradients of x, w and bias through it.

Check shapes are (M, N, K): one row, odd N and K (K not a multiple of 8: no 16-byte loads), K past a
split, a long N, M = 16 (the kernel's most rows) and one M > 16 (kf.linear's cuBLAS route on CUDA).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from ._spec import LinearShape, OpSpec, check_out, f64, grads_of, kf, poison, randn

# ---- float64 reference ----------------------------------------------------------------------------


def linear_ref(x, w, bias=None):
    """y = x w^T + bias in float64 (x [..., K], w [N, K], bias [N])."""
    y = x.to(f64) @ w.to(f64).t()
    return y + bias.to(f64) if bias is not None else y


# ---- bytes and FLOPs ------------------------------------------------------------------------------


def _bytes(shape: LinearShape, mode: str, elt: int) -> int:
    # the weight once, x read, y written, the bias
    return (shape.n * shape.k + shape.m * (shape.k + shape.n) + (shape.n if shape.bias else 0)) * elt


def _flops(shape: LinearShape, mode: str) -> int:
    return 2 * shape.m * shape.n * shape.k


# ---- bench ----------------------------------------------------------------------------------------


def _make(m, n, k, bias, dtype, device, gen):
    """x ~ N(0, 1) [M, K], w ~ N(0, 1 / K) [N, K] (nn.Linear's scale: y of std ~1), bias ~ N(0, 1) [N]."""
    return {"x": randn(gen, device, dtype, m, k), "w": randn(gen, device, dtype, n, k, scale=1 / math.sqrt(max(k, 1))),
            "bias": randn(gen, device, dtype, n) if bias else None}


def _inputs(shape: LinearShape, dtype, device, gen):
    return _make(shape.m, shape.n, shape.k, shape.bias, dtype, device, gen)


def _kf_run(t):
    return (kf().linear(t["x"], t["w"], t["bias"]),)


def _cublas():
    """torch.nn.functional.linear: nn.Linear's forward (cuBLAS / cuBLASLt on CUDA)."""
    return lambda t: (F.linear(t["x"], t["w"], t["bias"]),)


# Llama-3-8B's decode projections at 1 .. 16 tokens (q / o, gate / up, down, fused qkv) and
# Llama-3.2-1B's LM head
SHAPES = (LinearShape(1, 4096, 4096), LinearShape(16, 14336, 4096), LinearShape(1, 14336, 4096),
          LinearShape(4, 4096, 4096), LinearShape(16, 4096, 14336), LinearShape(1, 128256, 2048),
          LinearShape(8, 6144, 4096))

# ---- kforge check ---------------------------------------------------------------------------------
# (M, N, K): one row and column, odd N / K (K % 8 != 0: scalar loads), K = 4104 and 5000 past a
# 4096-column split, an LM-head-long N, 16 rows (the kernel's most), 33 rows (cuBLAS on CUDA)
CHECK_SHAPES = ((1, 1, 64), (1, 4096, 4096), (7, 127, 5000), (3, 1000, 4104), (16, 14336, 1024), (2, 32000, 512),
                (16, 256, 7), (33, 300, 256))
VARIANTS = ({}, {"bias": True})


def check_label(shape) -> str:
    return "m{}n{}k{}".format(*shape)


def _check_inputs(shape, v, dtype, device):
    m, n, k = shape
    t = _make(m, n, k, v.get("bias", False), dtype, device, None)
    t["dy"] = randn(None, device, dtype, m, n)
    return t


def _names(t) -> list[str]:
    return [k for k in ("x", "w", "bias") if t[k] is not None]


def _check_run(kfm, t, v):
    """y and the gradients of x, w (and bias) through kf.linear's autograd (with the variant's activation,
    if any: the gemm spec's variants)."""
    names = _names(t)
    leaves = {k: t[k].detach().clone().requires_grad_(True) for k in names}
    x = leaves["x"]
    shape = (x.shape[0], t["w"].shape[0])
    poison([shape], x.dtype, x.device)
    act = {"activation": v["act"]} if "act" in v else {}
    y = kfm.linear(x, leaves["w"], leaves.get("bias"), **act)
    check_out("y", y, shape, x.dtype)
    return {"y": y.detach(), **grads_of([y], [t["dy"]], leaves, names, t)}


def _with_grads(a, y_of):
    """y = y_of(a) with a's x, w (and bias) as leaves, and their gradients for a["dy"]: the float64 oracles."""
    names = _names(a)
    for k in names:
        a[k].requires_grad_(True)
    y = y_of(a)
    return {"y": y.detach(), **grads_of([y], [a["dy"]], a, names, a)}


def _cpp_reference(a, v):
    """The op on float64 CPU tensors: the C++ reference, and its autograd (torch's GEMMs in float64)."""
    return _with_grads(a, lambda a: torch.ops.kernelforge.linear(a["x"], a["w"], a["bias"]))


def _reference(a, v):
    return _with_grads(a, lambda a: linear_ref(a["x"], a["w"], a["bias"]))


LINEAR = OpSpec(
    name="linear", family="linear", shape_kind="linear",
    inputs=_inputs, run=_kf_run, grad_inputs=(), grad_outputs=(), outputs=("y",),
    row_bytes=_bytes, flops=_flops, shapes=SHAPES, eager=_cublas,
    providers=("kernelforge", "cublas", "compile"), extra_peers={"cublas": _cublas},
    modes=("fwd",), dtypes=(torch.bfloat16, torch.float16), bound="memory",
    check_shapes=CHECK_SHAPES, variants=VARIANTS, check_inputs=_check_inputs, check_run=_check_run,
    cpp_reference=_cpp_reference, reference=_reference, check_label=check_label,
)

SPECS = (LINEAR,)
