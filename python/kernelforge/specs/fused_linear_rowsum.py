"""The fused_linear_rowsum family: fused_linear_rowsum(x, w, bias) = F.linear(x, w, bias).sum(-1).

Bench shapes are LinearShapes m{T}n{O}k{K}-bias (nn.Linear's naming: x [T, K], w [O, K], bias [O],
y [T]); the bench always passes a bias (its gradient is part of fwdbwd). The defaults: a Llama-sized
square projection at 16384 tokens, a wider-batch 2048 one, an MLP up projection (O = 14336), one
token, and an odd shape (T 4097, K 1023, O 513: no 16-byte accesses).

Memory-bound (``bound="memory"``): the minimum traffic of the forward is x, W and the bias read once
and y written, (T K + O K + O + T) elements; the backward reads x and dy and writes dx, dW and db,
(2 T K + T + O K + O) elements; fwdbwd counts both. GB/s against copy@size (a copy of the same bytes).
FLOPs (informational): forward 2 T K + O K (the dot products and the column sums), backward 3 T K.

Peers: ``eager`` F.linear(x, w, bias).sum(-1) (the [T, O] product on cuBLAS, then a reduction; its
backward: dW = dyᵀ-broadcast GEMM), ``compile`` torch.compile of it.

Check shapes are (T, K, O): ones, odd and prime sizes, one row and a long weight, K past 4096, many
row chunks of x (4097) and of W, K = 65537 rows; variants with and without a bias; gradients of x, w
and bias.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from ._spec import LinearShape, OpSpec, check_out, f64, grads_of, kf, poison, randn
from .linear import _names, _with_grads

# ---- float64 reference ----------------------------------------------------------------------------


def fused_linear_rowsum_ref(x, w, bias=None):
    """F.linear(x, w, bias).sum(-1) in float64: the definition, with the [..., O] product."""
    z = x.to(f64) @ w.to(f64).t()
    if bias is not None:
        z = z + bias.to(f64)
    return z.sum(-1)


# ---- bytes and FLOPs ------------------------------------------------------------------------------


def _bytes(shape: LinearShape, mode: str, elt: int) -> int:
    t, o, k = shape.m, shape.n, shape.k
    fwd = t * k + o * k + o + t  # read x, W, bias; write y
    bwd = 2 * t * k + t + o * k + o  # read x, dy; write dx, dW, db
    return (fwd + (bwd if mode == "fwdbwd" else 0)) * elt


def _flops(shape: LinearShape, mode: str) -> int:
    t, o, k = shape.m, shape.n, shape.k
    return 2 * t * k + o * k + (3 * t * k if mode == "fwdbwd" else 0)


# ---- bench ----------------------------------------------------------------------------------------


def _make(t, k, o, bias, dtype, device, gen):
    """x ~ N(0, 1) [T, K], w ~ N(0, 1 / K) [O, K] (nn.Linear's scale), bias ~ N(0, 1) [O], dy ~ N(0, 1) [T]."""
    return {"x": randn(gen, device, dtype, t, k),
            "w": randn(gen, device, dtype, o, k, scale=1 / math.sqrt(max(k, 1))),
            "bias": randn(gen, device, dtype, o) if bias else None,
            "dy": randn(gen, device, dtype, t)}


def _inputs(shape: LinearShape, dtype, device, gen):
    return _make(shape.m, shape.k, shape.n, True, dtype, device, gen)


def _kf_run(t):
    return (kf().fused_linear_rowsum(t["x"], t["w"], t["bias"]),)


def _eager():
    """The code the module replaces: the linear layer's output, then its row sums."""
    return lambda t: (F.linear(t["x"], t["w"], t["bias"]).sum(-1),)


SHAPES = (LinearShape(16384, 4096, 4096, True), LinearShape(65536, 2048, 2048, True),
          LinearShape(4096, 14336, 4096, True), LinearShape(1, 4096, 4096, True), LinearShape(4097, 513, 1023, True))

# ---- kforge check ---------------------------------------------------------------------------------
# (T, K, O)
CHECK_SHAPES = ((1, 1, 1), (7, 127, 5), (1, 4096, 4096), (3, 4097, 7), (257, 520, 300), (1100, 256, 17),
                (4097, 1023, 513), (2, 65537, 2))
VARIANTS = ({}, {"bias": True})


def check_label(shape) -> str:
    return "t{}k{}o{}".format(*shape)


def _check_inputs(shape, v, dtype, device):
    t, k, o = shape
    return _make(t, k, o, v.get("bias", False), dtype, device, None)


def _check_run(kfm, t, v):
    """y and the gradients of x, w (and bias) through kf.fused_linear_rowsum's autograd."""
    names = _names(t)
    leaves = {k: t[k].detach().clone().requires_grad_(True) for k in names}
    x = leaves["x"]
    poison([(x.shape[0],), tuple(x.shape), tuple(t["w"].shape)], x.dtype, x.device)
    y = kfm.fused_linear_rowsum(x, leaves["w"], leaves.get("bias"))
    check_out("y", y, (x.shape[0],), x.dtype)
    return {"y": y.detach(), **grads_of([y], [t["dy"]], leaves, names, t)}


def _cpp_reference(a, v):
    """The op on float64 CPU tensors: the C++ reference, forward and backward (through its autograd)."""
    return _with_grads(a, lambda a: torch.ops.kernelforge.fused_linear_rowsum(a["x"], a["w"], a["bias"]))


def _reference(a, v):
    return _with_grads(a, lambda a: fused_linear_rowsum_ref(a["x"], a["w"], a["bias"]))


FUSED_LINEAR_ROWSUM = OpSpec(
    name="fused_linear_rowsum", family="fused_linear_rowsum", shape_kind="linear",
    inputs=_inputs, run=_kf_run, grad_inputs=("x", "w", "bias"), outputs=("y",),
    row_bytes=_bytes, flops=_flops, shapes=SHAPES, eager=_eager,
    providers=("kernelforge", "eager", "compile"), bound="memory",
    check_shapes=CHECK_SHAPES, variants=VARIANTS, check_inputs=_check_inputs, check_run=_check_run,
    cpp_reference=_cpp_reference, reference=_reference, check_label=check_label,
)

SPECS = (FUSED_LINEAR_ROWSUM,)
