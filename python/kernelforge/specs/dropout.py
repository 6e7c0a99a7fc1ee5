"""The dropout family: dropout and dropout_add (residual + dropout(x)), shapes (rows, hidden).

The masks are random, so peers cannot be compared bit for bit with kernelforge (independent streams:
the bench skips that comparison, `stochastic=True`); `kforge check` instead gives kernelforge and the
C++ float64 reference one generator state, so both draw the same (seed, offset) and the same mask,
and the PyTorch float64 formula takes that mask.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ._spec import OpSpec, check_out, f64, grads_of, kf, poison, randn

P = 0.1  # the bench's drop probability (transformer training's usual value)
SHAPES = ((16384, 4096), (4096, 14336), (4097, 1023), (1, 4096), (64, 4096))
CHECK_SHAPES = ((1, 1), (1, 7), (7, 4099), (3, 4096), (19, 1021), (128, 2048), (1, 65537))
VARIANTS = tuple({"p": p} for p in (0.0, 0.1, 0.5, 0.9, 1.0))
INPUT_NAMES = {"dropout": ("x",), "dropout_add": ("x", "residual")}

# ---- traffic ----------------------------------------------------------------------------------------
# dropout reads x and writes y (2 tensors), its backward reads dy and writes dx (fwd+bwd 4); dropout_add
# also reads residual (3), and its residual gradient is dy itself (fwd+bwd 3 + 2). No mask is stored:
# the backward regenerates it from 16 bytes of (seed, offset).
ROW_TENSORS = {("dropout", "fwd"): 2, ("dropout", "fwdbwd"): 4, ("dropout_add", "fwd"): 3,
               ("dropout_add", "fwdbwd"): 5}


def _bytes(op):
    return lambda shape, mode, elt: ROW_TENSORS[(op, mode)] * shape[0] * shape[1] * elt


def _flops(op):
    per = 1 if op == "dropout" else 2  # the scale (and the add) per element; the Philox is integer work
    return lambda shape, mode: per * (2 if mode == "fwdbwd" else 1) * shape[0] * shape[1]


# ---- bench ------------------------------------------------------------------------------------------
def _inputs(op):
    def inputs(shape, dtype, device, gen):
        t = {name: randn(gen, device, dtype, *shape) for name in INPUT_NAMES[op]}
        t["dy"] = randn(gen, device, dtype, *shape)
        return t
    return inputs


def _kf_run(op):
    if op == "dropout":
        return lambda t: (kf().dropout(t["x"], P),)
    return lambda t: (kf().dropout_add(t["x"], t["residual"], P),)


def _eager(op):
    """F.dropout; the pre-norm block's ``residual + dropout(attn_out)`` (HF GPT-2 / ViT / BERT)."""
    fns = {"dropout": lambda t: (F.dropout(t["x"], P),),
           "dropout_add": lambda t: (t["residual"] + F.dropout(t["x"], P),)}
    return lambda: fns[op]


# ---- kforge check -----------------------------------------------------------------------------------
SEED = 20240607  # one generator state for kernelforge and the C++ reference: the same masks


def _generator(device):
    return torch.Generator(device=device).manual_seed(SEED)


def _check_inputs(op):
    def inputs(shape, v, dtype, device):
        t = {name: randn(None, device, dtype, *shape) for name in INPUT_NAMES[op]}
        t["dy"] = randn(None, device, dtype, *shape)
        t["generator_device"] = str(device)  # the C++ reference draws from a generator of this device
        return t
    return inputs


def _call(op, kfm, t, p, generator):
    if op == "dropout":
        return kfm.dropout(t["x"], p, generator=generator)
    return kfm.dropout_add(t["x"], t["residual"], p, generator=generator)


def _check_run(op):
    def run(kfm, t, v):
        names = list(INPUT_NAMES[op])
        leaves = {k: t[k].detach().clone().requires_grad_(True) for k in names}
        dy = t["dy"]
        poison([dy.shape] * (len(names) + 1), dy.dtype, dy.device)
        y = _call(op, kfm, {**t, **leaves}, v["p"], _generator(dy.device))
        check_out("y", y, dy.shape, dy.dtype)
        return {"y": y.detach(), **grads_of([y], [dy], leaves, names, t)}
    return run


def _mask(a, v):
    """The keep mask of the checked call: the CPU op with the same generator state."""
    ops = torch.ops.kernelforge
    return ops.dropout(a["x"], v["p"], _generator(a["generator_device"]), True)[2]


def _cpp_reference(op):
    def ref(a, v):
        ops = torch.ops.kernelforge
        p, gen = v["p"], _generator(a["generator_device"])
        if op == "dropout":
            y, state, _ = ops.dropout(a["x"], p, gen, False)
            out = {"y": y}
        else:
            y, state = ops.dropout_add(a["x"], a["residual"], p, gen)
            out = {"y": y, "dresidual": a["dy"]}
        out["dx"] = ops.dropout_backward(a["dy"], state, p)
        return out
    return ref


def _reference(op):
    """F.dropout's formula in float64 on the mask of the same (seed, offset): y = x * m / (1 - p)
    (+ residual); gradients by autograd."""
    def ref(a, v):
        p = v["p"]
        names = list(INPUT_NAMES[op])
        for k in names:
            a[k].requires_grad_(True)
        m = _mask(a, v).to(f64)
        y = a["x"] * m * (1.0 / (1.0 - p) if p < 1.0 else 0.0)
        if op == "dropout_add":
            y = y + a["residual"]
        grads = torch.autograd.grad([y], [a[k] for k in names], [a["dy"]])
        return {"y": y.detach(), **{"d" + k: g for k, g in zip(names, grads)}}
    return ref


def _spec(op: str) -> OpSpec:
    return OpSpec(
        name=op, family="dropout", shape_kind="rows",
        inputs=_inputs(op), run=_kf_run(op), grad_inputs=INPUT_NAMES[op],
        row_bytes=_bytes(op), flops=_flops(op), shapes=SHAPES,
        eager=_eager(op), providers=("kernelforge", "eager", "compile"), stochastic=True,
        check_shapes=CHECK_SHAPES, variants=VARIANTS, check_inputs=_check_inputs(op),
        check_run=_check_run(op), cpp_reference=_cpp_reference(op), reference=_reference(op),
        extra={"p": P},
    )


SPECS = tuple(_spec(op) for op in ("dropout", "dropout_add"))
