"""Forward and backward of the norm ops against the float64 references of kernelforge.specs.norm
(driven by the op table of norm_ref.py)."""

from __future__ import annotations

import pytest
import torch

import norm_ref as R
from norm_ref import DEVICES, DTYPES, EPS, OPS, make_inputs, run_kf, run_ref

def check_forward(kf, op, inp, dtype, device, eps=None, msg=""):
    expected = run_ref(op, inp, dtype, eps)
    R.poison(device)
    out = run_kf(kf, op, inp, eps)
    assert len(out) == len(expected)
    x = inp["x"]
    for i, (a, e) in enumerate(zip(out, expected)):
        assert a.device == x.device and a.is_contiguous(), f"{op} output {i}: device {a.device}, strides {a.stride()}"
        R.assert_close(a, e, dtype, msg=f"{op} output {i} {msg}")
    if op == "add_rms_norm":  # the new residual stream is exactly the eager sum
        assert torch.equal(out[1], inp["x"] + inp["residual"]), "add_rms_norm: sum != x + residual"
    return out


# ---- forward: one shape per code path ------------------------------------------------------------------
SHAPES = [(1, 1), (7, 1000), (3, 4096), (19, 4097), (5, 8191), (1, 4096), (64, 4096)]
HUGE_SHAPES = [(2, 131072)]  # CUDA only: keeps the CPU suite fast
DEVICE_SHAPES = [pytest.param("cpu", s, id=f"cpu-{s}") for s in SHAPES] + [
    pytest.param("cuda", s, id=f"cuda-{s}", marks=pytest.mark.cuda) for s in SHAPES + HUGE_SHAPES
]


@pytest.mark.parametrize("affine", [True, False], ids=["affine", "noweight"])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("device,shape", DEVICE_SHAPES)
@pytest.mark.parametrize("op", OPS)
def test_forward(kf, op, device, shape, dtype, affine):
    inp = make_inputs(op, shape, dtype, device, affine)
    check_forward(kf, op, inp, dtype, device)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("op", ["ada_norm_layer", "ada_norm_rms"])
def test_forward_ada_row_modulation(kf, op, device, dtype):
    """2-D x with per-row scale/shift [M, N]."""
    shape = (19, 4097)
    inp = make_inputs(op, shape, dtype, device, mod_shape=shape)
    check_forward(kf, op, inp, dtype, device)


OP_MODS = [(op, "vec") for op in OPS] + [
    (op, mod) for op in OPS if op.startswith("ada_norm") for mod in ("per_batch", "per_token")
]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("op,mod", OP_MODS)
def test_forward_3d(kf, op, mod, device, dtype):
    """x [B, S, N]; ada_norm scale/shift as [N], [B, 1, N] (DiT) or [B, S, N] (per token)."""
    b, s, n = 3, 5, 1000
    mod_shape = {"vec": (n,), "per_batch": (b, 1, n), "per_token": (b, s, n)}[mod]
    inp = make_inputs(op, (b, s, n), dtype, device, mod_shape=mod_shape)
    check_forward(kf, op, inp, dtype, device)


LAYOUTS = ["rows_strided", "rows_strided_odd", "unaligned"]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("shape", [(7, 1000), (5, 4096), (2, 3, 4097)], ids=str)
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("op", OPS)
def test_forward_layouts(kf, op, layout, shape, device, dtype):
    """Row-strided views (big[..., :N]) and base pointers one element into a buffer, for every input
    (1-D parameters get the unaligned layout too)."""
    inp = make_inputs(op, shape, dtype, device, mod_shape=shape if op.startswith("ada") else None)
    for k, v in inp.items():
        if v is None:
            continue
        if v.dim() == 1:
            if layout == "unaligned":
                inp[k] = R.with_layout(v, "unaligned")
        else:
            inp[k] = R.with_layout(v, layout)
    assert not inp["x"].is_contiguous() or layout == "unaligned"
    check_forward(kf, op, inp, dtype, device, msg=layout)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("op", ["ada_norm_layer", "ada_norm_rms"])
def test_forward_ada_chunked_modulation(kf, op, device, dtype):
    """scale/shift as the halves of one [B, 1, 2N] projection (emb.chunk(2, -1)): strided views."""
    b, s, n = 2, 7, 1536
    x = R.rand((b, s, n), dtype, device)
    emb = R.rand((b, 1, 2 * n), dtype, device, scale=0.5)
    scale, shift = emb.chunk(2, dim=-1)
    inp = {"x": x, "scale": scale, "shift": shift, "weight": None, "bias": None}
    check_forward(kf, op, inp, dtype, device)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("shape", [(0, 64), (2, 0, 64), (3, 0)], ids=str)
@pytest.mark.parametrize("op", OPS)
def test_empty(kf, op, shape, device, dtype):
    """No rows (or empty rows): empty outputs of the right shape, and empty gradients."""
    inp = make_inputs(op, shape, dtype, device)
    grads = [v.requires_grad_() for v in inp.values() if v is not None]
    out = run_kf(kf, op, inp)
    for y in out:
        assert y.shape == inp["x"].shape and y.dtype == dtype and y.device == inp["x"].device
    sum(y.sum() for y in out).backward()
    for g in grads:
        if g.numel() == 0:  # nothing to check: autograd may leave .grad unset for empty tensors
            assert g.grad is None or g.grad.shape == g.shape
            continue
        assert g.grad is not None and g.grad.shape == g.shape
        # parameter gradients of zero rows are zeros (sum over no rows), never garbage
        assert torch.equal(g.grad, torch.zeros_like(g)), "gradient of an empty input must be zero"


@pytest.mark.cuda
@pytest.mark.parametrize("op", OPS)
def test_empty_launches_nothing(kf, op):
    inp = make_inputs(op, (0, 4096), torch.bfloat16, "cuda")
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        run_kf(kf, op, inp)
        torch.cuda.synchronize()
    kernels = [e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    assert kernels == [], f"{op} on 0 rows launched {kernels}"


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("op", OPS)
def test_eps_is_used(kf, op, device, dtype):
    """Tiny inputs where eps dominates mean(x^2): a wrong or ignored eps cannot pass."""
    inp = make_inputs(op, (4, 512), dtype, device)
    inp["x"] = inp["x"] * 1e-3
    if "residual" in inp:
        inp["residual"] = inp["residual"] * 1e-3
    out = check_forward(kf, op, inp, dtype, device, eps=1e-4)
    # and the result differs clearly from the one with a much smaller eps
    other = run_ref(op, inp, dtype, eps=1e-8)[0].double()
    assert (out[0].double() - other).abs().max() > 0.1


# ---- backward ----------------------------------------------------------------------------------------
GRAD_INPUTS = ["x", "residual", "weight", "bias", "scale", "shift"]


def check_grads(kf, op, inp, dtype, device, use_sum=True, msg=""):
    """Gradients of every differentiable input vs float64 autograd of the reference."""
    leaves = {k: v.detach().clone().requires_grad_() for k, v in inp.items() if v is not None}
    out = run_kf(kf, op, {**dict.fromkeys(inp), **leaves})
    ref_leaves = {k: v.detach().double().requires_grad_() for k, v in leaves.items()}
    ref_out = run_ref(op, {**dict.fromkeys(inp), **ref_leaves}, torch.float64)
    dys = [R.rand(y.shape, dtype, device) for y in out]
    if op == "add_rms_norm" and not use_sum:
        out, ref_out, dys = out[:1], ref_out[:1], dys[:1]  # no gradient flows into the sum
    R.poison(device)
    torch.autograd.backward(out, dys)
    torch.autograd.backward(ref_out, [d.double() for d in dys])
    for k, v in leaves.items():
        assert v.grad is not None, f"{op}: no gradient for {k}"
        assert v.grad.dtype == dtype and v.grad.shape == v.shape and v.grad.device == v.device
        R.assert_close(v.grad, ref_leaves[k].grad, dtype, grad=True, msg=f"{op} d{k} {msg}")
    if op == "add_rms_norm":
        assert torch.equal(leaves["x"].grad, leaves["residual"].grad)


GRAD_DEVICE_DTYPES = [pytest.param("cpu", d, id=f"cpu-{d}") for d in DTYPES] + [
    pytest.param("cuda", d, id=f"cuda-{d}", marks=pytest.mark.cuda) for d in DTYPES
]


@pytest.mark.parametrize("affine", [True, False], ids=["affine", "noweight"])
@pytest.mark.parametrize("shape", [(1, 1), (7, 1000), (3, 4097), (64, 4096)], ids=str)
@pytest.mark.parametrize("device,dtype", GRAD_DEVICE_DTYPES)
@pytest.mark.parametrize("op", OPS)
def test_backward(kf, op, device, dtype, shape, affine):
    inp = make_inputs(op, shape, dtype, device, affine)
    check_grads(kf, op, inp, dtype, device)


@pytest.mark.parametrize("device,dtype", GRAD_DEVICE_DTYPES)
def test_backward_add_rms_norm_without_sum_grad(kf, device, dtype):
    """Only y is used downstream: the C++ backward gets no dsum."""
    inp = make_inputs("add_rms_norm", (7, 1000), dtype, device)
    check_grads(kf, "add_rms_norm", inp, dtype, device, use_sum=False)


@pytest.mark.parametrize("mod", ["vec", "per_batch", "per_token"])
@pytest.mark.parametrize("affine", [True, False], ids=["affine", "noweight"])
@pytest.mark.parametrize("device,dtype", GRAD_DEVICE_DTYPES)
@pytest.mark.parametrize("op", ["ada_norm_layer", "ada_norm_rms"])
def test_backward_ada_modulation(kf, op, device, dtype, affine, mod):
    """dscale/dshift are reduced over the rows that share a modulation row."""
    b, s, n = 3, 17, 1000
    mod_shape = {"vec": (n,), "per_batch": (b, 1, n), "per_token": (b, s, n)}[mod]
    inp = make_inputs(op, (b, s, n), dtype, device, affine, mod_shape=mod_shape)
    check_grads(kf, op, inp, dtype, device)


@pytest.mark.parametrize("device,dtype", GRAD_DEVICE_DTYPES)
@pytest.mark.parametrize("op", OPS)
def test_backward_strided_input(kf, op, device, dtype):
    """x is a row-strided view (odd row stride) of a leaf buffer: forward and dx match the
    contiguous input's within tolerance, and nothing is written outside the view."""
    m, n = 9, 1000
    inp = make_inputs(op, (m, n), dtype, device)
    big = torch.full((m, n + 3), float("nan"), dtype=dtype, device=device)
    big[:, :n] = inp["x"]
    big.requires_grad_()
    x_view = big[:, :n]
    x_leaf = inp["x"].detach().clone().requires_grad_()
    out_view = run_kf(kf, op, {**inp, "x": x_view})
    out_leaf = run_kf(kf, op, {**inp, "x": x_leaf})
    dys = [R.rand(y.shape, dtype, device) for y in out_leaf]
    torch.autograd.backward(out_view, dys)
    torch.autograd.backward(out_leaf, dys)
    for a, e in zip(out_view, out_leaf):
        R.assert_close(a, e, dtype, msg=f"{op} strided forward")
    R.assert_close(big.grad[:, :n], x_leaf.grad, dtype, grad=True, msg=f"{op} strided dx")
    assert torch.equal(big.grad[:, n:], torch.zeros_like(big.grad[:, n:]))


@pytest.mark.parametrize("op", OPS)
def test_gradcheck_float64_cpu(kf, op):
    """Finite differences in float64 on the CPU implementation (the C++ reference)."""
    inp = make_inputs(op, (3, 2, 8), torch.float64, "cpu", mod_shape=(3, 1, 8))
    names = [k for k, v in inp.items() if v is not None]

    def f(*tensors):
        return run_kf(kf, op, {**dict.fromkeys(inp), **dict(zip(names, tensors))})

    tensors = [inp[k].detach().requires_grad_() for k in names]
    assert torch.autograd.gradcheck(f, tensors, eps=1e-6, atol=1e-7, rtol=1e-5)


# ---- torch.library.opcheck ----------------------------------------------------------------------------


def _opcheck_cases(op, affine, device):
    """(op overload, args) for the forward op and its backward, with or without the optional tensors."""
    ops = torch.ops.kernelforge
    cases = []
    inp = make_inputs(op, (2, 3, 40), torch.float32, device, affine, mod_shape=(2, 1, 40))
    g = {k: (v.requires_grad_() if v is not None else None) for k, v in inp.items()}
    x, w, b = g["x"], g["weight"], g.get("bias")
    dy = R.rand(x.shape, torch.float32, device)
    eps = EPS[op]
    if op == "rms_norm":
        cases.append((ops.rms_norm.default, (x, w, eps)))
        cases.append((ops.rms_norm_backward.default, (dy, x.detach(), None if w is None else w.detach(), eps)))
    elif op == "add_rms_norm":
        cases.append((ops.add_rms_norm.default, (x, g["residual"], w, eps)))
        s = (x + g["residual"]).detach()
        wd = None if w is None else w.detach()
        cases.append((ops.add_rms_norm_backward.default, (dy, dy * 0.5, s, wd, eps)))
        cases.append((ops.add_rms_norm_backward.default, (dy, None, s, wd, eps)))
    elif op == "layer_norm":
        cases.append((ops.layer_norm.default, (x, w, b, eps)))
        det = [None if t is None else t.detach() for t in (x, w, b)]
        cases.append((ops.layer_norm_backward.default, (dy, *det, eps)))
    else:
        kind = "layer" if op == "ada_norm_layer" else "rms"
        sc, sh = g["scale"], g["shift"]
        cases.append((ops.ada_norm.default, (x, sc, sh, w, b, eps, kind)))
        det = [None if t is None else t.detach() for t in (x, sc, sh, w, b)]
        cases.append((ops.ada_norm_backward.default, (dy, *det, eps, kind)))
    return cases


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("affine", [True, False], ids=["affine", "noweight"])
@pytest.mark.parametrize("op", OPS)
def test_opcheck(kf, op, affine, device):
    for overload, args in _opcheck_cases(op, affine, device):
        torch.library.opcheck(overload, args)
