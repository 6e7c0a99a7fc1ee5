"""The diagonal_matmul family: diag(a) @ b, i.e. ``a.unsqueeze(-1) * b`` (row scaling).

Shapes are (rows, N) (b [rows, N], a [rows]) or BatchedRowsShape b{B}m{M}n{N}[-bcast] (b [B, M, N],
a [B, M] per row, or [M] broadcast over the batch with -bcast).
"""

from __future__ import annotations

import torch

from ._spec import BatchedRowsShape, OpSpec, check_out, f64, grads_of, kf, poison, randn


def dims(shape) -> tuple[tuple, tuple]:
    """(b's shape, a's shape) of a bench / check shape."""
    if isinstance(shape, BatchedRowsShape):
        return (shape.b, shape.m, shape.n), ((shape.m,) if shape.bcast else (shape.b, shape.m))
    rows, n = shape
    return (rows, n), (rows,)


def reference(a, b, dtype=f64):
    """torch's own formula in float64, the result rounded once to `dtype`."""
    return (a.to(f64).unsqueeze(-1) * b.to(f64)).to(dtype)


# ---- traffic and arithmetic -----------------------------------------------------------------------
# Minimum bytes: fwd reads b and a, writes y (2 row tensors + a); the backward reads dy, b and a and
# writes db and da (3 row tensors + 2 a-sized), so fwd+bwd moves 5 row tensors + 3 a-sized tensors.
ROW_TENSORS = {"fwd": 2, "fwdbwd": 5}
A_TENSORS = {"fwd": 1, "fwdbwd": 3}
FLOPS_PER_ELT = {"fwd": 1, "fwdbwd": 4}  # a*b; + a*dy and the fma of dy*b


def row_bytes(shape, mode, elt):
    (b_shape, a_shape) = dims(shape)
    return (ROW_TENSORS[mode] * _numel(b_shape) + A_TENSORS[mode] * _numel(a_shape)) * elt


def flops(shape, mode):
    return FLOPS_PER_ELT[mode] * _numel(dims(shape)[0])


def _numel(s):
    n = 1
    for d in s:
        n *= d
    return n


# ---- bench ----------------------------------------------------------------------------------------


def _inputs(shape, dtype, device, gen):
    b_shape, a_shape = dims(shape)
    return {"a": randn(gen, device, dtype, *a_shape), "b": randn(gen, device, dtype, *b_shape),
            "dy": randn(gen, device, dtype, *b_shape)}


def _eager():
    """The code a model runs: ``a.unsqueeze(-1) * b`` (Flash-Kernels' diagonal_matmul semantics)."""
    return lambda t: (t["a"].unsqueeze(-1) * t["b"],)


# The square and tall matrices, a batch of them with per-row and broadcast scales, and an odd width
# (rows start at every 2-byte offset: the scalar-head path).
SHAPES = ((4096, 4096), (16384, 4096), BatchedRowsShape(8, 2048, 2048), BatchedRowsShape(8, 2048, 2048, True),
          (4097, 1023))

# ---- kforge check ---------------------------------------------------------------------------------
# One shape per code path: one element, decode rows, a prime width, odd widths (scalar head and
# tail), several rows per block (N = 64), a long row (the backward's team loops), batched per-row and
# broadcast scales.
CHECK_SHAPES = ((1, 1), (7, 127), (19, 4097), (4097, 1023), (1000, 64), (1, 65537),
                BatchedRowsShape(4, 7, 130), BatchedRowsShape(3, 5, 1023, True), BatchedRowsShape(16, 64, 256, True))


def _check_inputs(shape, v, dtype, device):
    b_shape, a_shape = dims(shape)
    return {"a": randn(None, device, dtype, *a_shape), "b": randn(None, device, dtype, *b_shape),
            "dy": randn(None, device, dtype, *b_shape)}


def _check_run(kfm, t, v):
    leaves = {k: t[k].detach().clone().requires_grad_(True) for k in ("a", "b")}
    dy = t["dy"]
    poison([dy.shape, leaves["a"].shape, leaves["b"].shape], dy.dtype, dy.device)
    y = kfm.diagonal_matmul(leaves["a"], leaves["b"])
    check_out("y", y, dy.shape, dy.dtype)
    return {"y": y.detach(), **grads_of([y], [dy], leaves, ["a", "b"], t)}


def _cpp_reference(t, v):
    ops = torch.ops.kernelforge
    da, db = ops.diagonal_matmul_backward(t["dy"], t["a"], t["b"])
    return {"y": ops.diagonal_matmul(t["a"], t["b"]), "da": da, "db": db}


def _reference(t, v):
    for k in ("a", "b"):
        t[k].requires_grad_(True)
    y = reference(t["a"], t["b"])
    da, db = torch.autograd.grad([y], [t["a"], t["b"]], [t["dy"]])
    return {"y": y.detach(), "da": da, "db": db}


SPECS = (OpSpec(
    name="diagonal_matmul", family="diagonal_matmul", shape_kind="rows",
    inputs=_inputs, run=lambda t: (kf().diagonal_matmul(t["a"], t["b"]),), grad_inputs=("a", "b"),
    row_bytes=row_bytes, flops=flops, shapes=SHAPES,
    eager=_eager, providers=("kernelforge", "eager", "compile"),
    check_shapes=CHECK_SHAPES, check_inputs=_check_inputs, check_run=_check_run,
    cpp_reference=_cpp_reference, reference=_reference,
),)
