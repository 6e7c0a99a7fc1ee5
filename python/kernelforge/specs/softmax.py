"""The softmax family: softmax, log_softmax over the last dimension. Shapes are (rows, N)."""

from __future__ import annotations

import torch

from ._spec import OpSpec, check_out, f64, grads_of, kf, poison, randn
from .norm import CHECK_SHAPES, SHAPES

OPS = ("softmax", "log_softmax")


# ---- float64 references ---------------------------------------------------------------------------


def softmax_ref(x, dim=-1, dtype=None):
    """torch.softmax in float64, rounded once to `dtype` (default: x's dtype)."""
    return torch.softmax(x.to(f64), dim).to(dtype or x.dtype)


def log_softmax_ref(x, dim=-1, dtype=None):
    """torch.log_softmax in float64, rounded once to `dtype` (default: x's dtype)."""
    return torch.log_softmax(x.to(f64), dim).to(dtype or x.dtype)


REFS = {"softmax": softmax_ref, "log_softmax": log_softmax_ref}

# ---- traffic and arithmetic -----------------------------------------------------------------------
# Bytes = ROW_TENSORS * rows * N * element size: fwd reads x, writes y; bwd reads dy, y, writes dx.
ROW_TENSORS = {"fwd": 2, "fwdbwd": 5}
FLOPS_PER_ELT = {
    ("softmax", "fwd"): 7,  # max, x-m, *log2e, ex2, sum, (x-m)*log2e ex2, *1/s
    ("softmax", "fwdbwd"): 11,  # + g*y sum, g-dot, *y
    ("log_softmax", "fwd"): 6,  # max, x-m, *log2e, ex2, sum, -log s
    ("log_softmax", "fwdbwd"): 10,  # + sum g, *log2e, ex2, fma
}


def _inputs(shape, dtype, device, gen):
    # logits of std 2 (exp(x - m) spans a few decades)
    rows, n = shape
    return {"x": randn(gen, device, dtype, rows, n, scale=2.0), "dy": randn(gen, device, dtype, rows, n)}


def _liger_softmax():
    """Liger's softmax autograd function (liger_kernel.ops.softmax; it has no log_softmax)."""
    try:
        from liger_kernel.ops.softmax import LigerSoftmaxFunction  # noqa: PLC0415
    except Exception:  # noqa: BLE001
        return None
    return lambda t: (LigerSoftmaxFunction.apply(t["x"]),)


# The default row shapes, plus 4096 rows of 128 K (256 KB bf16 rows: the cluster path on sm_90).
BENCH_SHAPES = SHAPES + ((4096, 131072),)


# ---- kforge check: checked like a one-input activation (x, dy -> y, dx) ---------------------------


def _check_inputs(shape, v, dtype, device):
    rows, n = shape
    return {"x": randn(None, device, dtype, rows, n, scale=2.0), "dy": randn(None, device, dtype, rows, n)}


def _check_run(op):
    def run(kfm, t, v):
        x = t["x"].detach().clone().requires_grad_(True)
        dy = t["dy"]
        poison([dy.shape, x.shape], dy.dtype, dy.device)
        y = getattr(kfm, op)(x)
        check_out("y", y, dy.shape, dy.dtype)
        return {"y": y.detach(), **grads_of([y], [dy], {"x": x}, ["x"], t)}
    return run


def _cpp_reference(op):
    def ref(a, v):  # the backward takes the forward's output
        ops = torch.ops.kernelforge
        y = getattr(ops, op)(a["x"])
        return {"y": y, "dx": getattr(ops, f"{op}_backward")(a["dy"], y)}
    return ref


def _reference(op):
    def ref(a, v):
        x = a["x"].requires_grad_(True)
        y = REFS[op](x)
        (dx,) = torch.autograd.grad([y], [x], [a["dy"]])
        return {"y": y.detach(), "dx": dx}
    return ref


def _spec(op: str) -> OpSpec:
    torch_op = getattr(torch, op)
    return OpSpec(
        name=op, family="softmax", shape_kind="rows",
        inputs=_inputs, run=lambda t: (getattr(kf(), op)(t["x"]),), grad_inputs=("x",),
        row_bytes=lambda shape, mode, elt: ROW_TENSORS[mode] * shape[0] * shape[1] * elt,
        flops=lambda shape, mode: FLOPS_PER_ELT[(op, mode)] * shape[0] * shape[1],
        shapes=BENCH_SHAPES,
        # the eager model code is torch.softmax itself: the torch_native peer (and compile's source)
        eager=lambda: (lambda t: (torch_op(t["x"], -1),)),
        torch_native=lambda: (lambda t: (torch_op(t["x"], -1),)),
        liger=_liger_softmax if op == "softmax" else None,
        providers=("kernelforge", "torch_native", "compile") + (("liger",) if op == "softmax" else ()),
        check_shapes=CHECK_SHAPES, check_inputs=_check_inputs, check_run=_check_run(op),
        cpp_reference=_cpp_reference(op), reference=_reference(op),
    )


SPECS = tuple(_spec(op) for op in OPS)
