"""Forward and backward of the activation ops against the float64 references of
kernelforge.specs.activation (driven by the variant table of act_ref.py)."""

from __future__ import annotations

import pytest
import torch

import act_ref as A
import norm_ref as R
from act_ref import OPS, OPS_SHORT, make_inputs, run_kf, run_ref
from norm_ref import DEVICES, DTYPES

from kernelforge.specs.activation import gelu_ref


def check_forward(kf, op, inp, dtype, device, msg=""):
    expected = run_ref(op, inp, dtype)
    R.poison(device)
    out = run_kf(kf, op, inp)
    first = next(iter(inp.values()))
    assert out.device == first.device and out.is_contiguous(), f"{op}: device {out.device}, strides {out.stride()}"
    assert out.shape == A.out_shape(op, inp)
    R.assert_close(out, expected, dtype, msg=f"{op} {msg}")
    return out


# ---- forward: output shapes [..., I] chosen per code path --------------------------------------------
# 1 column, odd and prime widths (no 16-byte vectors; a partial last vector), decode rows, the common
# MLP widths, a 3-D batch.
SHAPES = [(1, 1), (1, 7), (7, 127), (3, 4096), (19, 4097), (2, 11008), (64, 4096), (2, 3, 1000)]
HUGE_SHAPES = [(2, 65537)]  # CUDA only: keeps the CPU suite fast
DEVICE_SHAPES = [pytest.param("cpu", s, id=f"cpu-{s}") for s in SHAPES] + [
    pytest.param("cuda", s, id=f"cuda-{s}", marks=pytest.mark.cuda) for s in SHAPES + HUGE_SHAPES
]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("device,shape", DEVICE_SHAPES)
@pytest.mark.parametrize("op", OPS)
def test_forward(kf, op, device, shape, dtype):
    check_forward(kf, op, make_inputs(op, shape, dtype, device), dtype, device)


LAYOUTS = ["rows_strided", "rows_strided_odd", "unaligned"]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("op", OPS_SHORT)
def test_forward_backward_layouts(kf, op, layout, device, dtype):
    """Row-strided views (big[..., :N]) and base pointers one element into a buffer, for every input;
    forward and gradients match the contiguous inputs'."""
    inp = make_inputs(op, (5, 3, 1000), dtype, device)
    views = {k: R.with_layout(v, layout).requires_grad_() for k, v in inp.items()}
    leaves = {k: v.clone().requires_grad_() for k, v in inp.items()}
    y_view = check_forward(kf, op, views, dtype, device, msg=layout)
    y_leaf = run_kf(kf, op, leaves)
    assert torch.equal(y_view, y_leaf)
    dy = R.rand(y_leaf.shape, dtype, device)
    y_view.backward(dy)
    y_leaf.backward(dy)
    for k in inp:
        assert torch.equal(views[k].grad, leaves[k].grad), f"{op} d{k} ({layout}) differs from contiguous"


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("op", ["swiglu", "geglu_none"])
def test_two_inputs_different_layouts(kf, op, device, dtype):
    """One input aligned and contiguous, the other an unaligned view: the kernels fall back to a
    narrower vector width for both."""
    inp = make_inputs(op, (7, 4096), dtype, device)
    first, second = A.TWO[A.kind(op)]
    inp[second] = R.with_layout(inp[second], "unaligned")
    check_forward(kf, op, inp, dtype, device)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("op", ["silu_and_mul", "gelu_and_mul_none_second"])
def test_split_halves_of_projection_output(kf, op, device, dtype):
    """x is the [..., 2I] output of a fused gate/up projection viewed with a row stride (a slice of
    a wider buffer, e.g. a QKV-style packed projection)."""
    big = R.rand((9, 3 * 1024), dtype, device)
    x = big[:, 512:512 + 2 * 1024]
    check_forward(kf, op, {"x": x}, dtype, device)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("shape", [(0, 64), (2, 0, 64), (3, 0)], ids=str)
@pytest.mark.parametrize("op", OPS_SHORT)
def test_empty(kf, op, shape, device, dtype):
    """No rows (or empty rows): empty outputs of the right shape, and empty gradients."""
    inp = {k: v.requires_grad_() for k, v in make_inputs(op, shape, dtype, device).items()}
    y = run_kf(kf, op, inp)
    assert y.shape == A.out_shape(op, inp) and y.dtype == dtype
    y.sum().backward()
    for v in inp.values():
        assert v.grad is None or v.grad.shape == v.shape


@pytest.mark.cuda
@pytest.mark.parametrize("op", OPS_SHORT)
def test_empty_launches_nothing(kf, op):
    inp = {k: v.requires_grad_() for k, v in make_inputs(op, (0, 4096), torch.bfloat16, "cuda").items()}
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        y = run_kf(kf, op, inp)
        torch.cuda.synchronize()
    kernels = [e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    assert kernels == [], f"{op} on 0 rows launched {kernels}"
    assert y.numel() == 0


# ---- backward ----------------------------------------------------------------------------------------


def check_grads(kf, op, inp, dtype, device, msg=""):
    """Gradients of every input vs float64 autograd of the reference."""
    leaves = {k: v.detach().clone().requires_grad_() for k, v in inp.items()}
    y = run_kf(kf, op, leaves)
    ref_leaves = {k: v.detach().double().requires_grad_() for k, v in leaves.items()}
    y_ref = run_ref(op, ref_leaves, torch.float64)
    dy = R.rand(y.shape, dtype, device)
    R.poison(device)
    y.backward(dy)
    y_ref.backward(dy.double())
    for k, v in leaves.items():
        assert v.grad is not None, f"{op}: no gradient for {k}"
        assert v.grad.dtype == dtype and v.grad.shape == v.shape and v.grad.device == v.device
        R.assert_close(v.grad, ref_leaves[k].grad, dtype, grad=True, msg=f"{op} d{k} {msg}")


GRAD_DEVICE_DTYPES = [pytest.param("cpu", d, id=f"cpu-{d}") for d in DTYPES] + [
    pytest.param("cuda", d, id=f"cuda-{d}", marks=pytest.mark.cuda) for d in DTYPES
]


@pytest.mark.parametrize("shape", [(1, 1), (7, 127), (3, 4097), (64, 4096)], ids=str)
@pytest.mark.parametrize("device,dtype", GRAD_DEVICE_DTYPES)
@pytest.mark.parametrize("op", OPS)
def test_backward(kf, op, device, dtype, shape):
    check_grads(kf, op, make_inputs(op, shape, dtype, device), dtype, device)


@pytest.mark.parametrize("device,dtype", GRAD_DEVICE_DTYPES)
@pytest.mark.parametrize("op", OPS_SHORT)
def test_backward_expanded_grad(kf, op, device, dtype):
    """y.sum() hands the backward an expanded (stride-0) gradient."""
    inp = {k: v.requires_grad_() for k, v in make_inputs(op, (4, 300), dtype, device).items()}
    run_kf(kf, op, inp).sum().backward()
    ref = {k: v.detach().double().requires_grad_() for k, v in inp.items()}
    run_ref(op, ref, torch.float64).sum().backward()
    for k in inp:
        R.assert_close(inp[k].grad, ref[k].grad, dtype, grad=True, msg=f"{op} d{k}")


@pytest.mark.parametrize("op", OPS)
def test_gradcheck_float64_cpu(kf, op):
    """Finite differences in float64 on the CPU implementation (the C++ reference)."""
    inp = make_inputs(op, (3, 2, 8), torch.float64, "cpu", scale=1.5)
    names = list(inp)

    def f(*tensors):
        return run_kf(kf, op, dict(zip(names, tensors)))

    tensors = [inp[k].detach().requires_grad_() for k in names]
    assert torch.autograd.gradcheck(f, tensors, eps=1e-6, atol=1e-7, rtol=1e-5)


# ---- torch.library.opcheck ----------------------------------------------------------------------------


def _opcheck_cases(op, device):
    """(op overload, args) for the forward op and its backward."""
    ops = torch.ops.kernelforge
    k, ap, gf = A.VARIANTS[op]
    inp = {n: v.requires_grad_() for n, v in make_inputs(op, (2, 3, 40), torch.float32, device).items()}
    det = {n: v.detach() for n, v in inp.items()}
    dy = R.rand((2, 3, 40), torch.float32, device)
    if k == "silu_and_mul":
        return [(ops.silu_and_mul.default, (inp["x"],)), (ops.silu_and_mul_backward.default, (dy, det["x"]))]
    if k == "swiglu":
        return [(ops.swiglu.default, (inp["gate"], inp["up"])),
                (ops.swiglu_backward.default, (dy, det["gate"], det["up"]))]
    if k == "gelu_and_mul":
        return [(ops.gelu_and_mul.default, (inp["x"], ap, gf)),
                (ops.gelu_and_mul_backward.default, (dy, det["x"], ap, gf))]
    if k == "geglu":
        return [(ops.geglu.default, (inp["hidden"], inp["gate"], ap)),
                (ops.geglu_backward.default, (dy, det["hidden"], det["gate"], ap))]
    return [(ops.gelu.default, (inp["x"], ap)), (ops.gelu_backward.default, (dy, det["x"], ap))]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("op", OPS)
def test_opcheck(kf, op, device):
    for overload, args in _opcheck_cases(op, device):
        torch.library.opcheck(overload, args)


@pytest.mark.parametrize("device", DEVICES)
def test_schema_defaults(kf, device):
    """The schema defaults are the Python API's: gelu_and_mul tanh + gate first, geglu/gelu erf."""
    x = R.rand((3, 64), torch.float32, device)
    ops = torch.ops.kernelforge
    assert torch.equal(ops.gelu_and_mul(x), kf.gelu_and_mul(x, "tanh", True))
    assert torch.equal(ops.geglu(x, x), kf.geglu(x, x, "none"))
    assert torch.equal(ops.gelu(x), kf.gelu(x, "none"))
    assert torch.equal(kf.gelu_and_mul(x), kf.gelu_and_mul(x, "tanh", True))
    R.assert_close(kf.gelu(x), gelu_ref(x, "none", torch.float32), torch.float32)


@pytest.mark.cuda
@pytest.mark.parametrize("op", OPS_SHORT)
def test_float64_on_cuda_falls_back(kf, op):
    """float64 on CUDA runs the reference (CPU round trip) with a warning."""
    inp = {k: v.requires_grad_() for k, v in make_inputs(op, (4, 64), torch.float64, "cuda").items()}
    y = run_kf(kf, op, inp)
    assert y.device == next(iter(inp.values())).device and y.dtype == torch.float64
    R.assert_close(y, run_ref(op, inp, torch.float64), torch.float64)
    y.sum().backward()
    assert all(v.grad is not None and v.grad.device == y.device for v in inp.values())
