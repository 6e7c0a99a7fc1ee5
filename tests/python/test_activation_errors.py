"""Activation ops: bad inputs raise clear errors that name the argument; NaN/Inf propagate like the
float64 reference."""

from __future__ import annotations

import pytest
import torch

import act_ref as A
import norm_ref as R
from act_ref import OPS, OPS_SHORT, make_inputs, run_kf, run_ref
from norm_ref import DEVICES, DTYPES


def _raises(kf, op, inp, pattern):
    with pytest.raises(RuntimeError, match=f"{A.kind(op)}: {pattern}") as e:
        run_kf(kf, op, inp)
    return str(e.value)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("op", ["silu_and_mul", "gelu_and_mul_tanh", "gelu_and_mul_none_second"])
def test_odd_last_dim(kf, op, device):
    x = R.rand((2, 4097), torch.float32, device)
    _raises(kf, op, {"x": x}, r"x last dimension must be even \(2\*I\), got 4097")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("op", OPS_SHORT)
def test_integer_input(kf, op, device):
    inp = {k: v.to(torch.int32) for k, v in make_inputs(op, (4, 64), torch.float32, device).items()}
    first = next(iter(inp))
    msg = _raises(kf, op, inp, f"{first} must be")
    assert "int32" in msg


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("op", ["swiglu", "geglu_none"])
def test_mismatched_shapes(kf, op, device):
    inp = make_inputs(op, (4, 64), torch.float32, device)
    first, second = A.TWO[A.kind(op)]
    inp[second] = R.rand((4, 63), torch.float32, device)
    _raises(kf, op, inp, rf"{second} must have shape \[4, 64\] \(the shape of {first}\), got \[4, 63\]")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("op", ["swiglu", "geglu_none"])
def test_mismatched_dtypes(kf, op, device):
    inp = make_inputs(op, (4, 64), torch.bfloat16, device)
    first, second = A.TWO[A.kind(op)]
    inp[second] = inp[second].float()
    _raises(kf, op, inp, rf"{second} must have the same dtype as {first} \(bfloat16\), got float32")


@pytest.mark.cuda
@pytest.mark.parametrize("op", ["swiglu", "geglu_none"])
def test_mismatched_devices(kf, op):
    inp = make_inputs(op, (4, 64), torch.float32, "cuda")
    first, second = A.TWO[A.kind(op)]
    inp[second] = inp[second].cpu()
    _raises(kf, op, inp, f"{second} must be on the same device as {first}")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("op", OPS_SHORT)
def test_non_contiguous_last_dim(kf, op, device):
    # transposed: [4, 2N] or [4, N] with strides (1, 4)
    inp = {k: v.t().contiguous().t() for k, v in make_inputs(op, (4, 64), torch.float32, device).items()}
    first = next(iter(inp))
    _raises(kf, op, inp, f"{first} must be contiguous in its last dimension")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("op", ["gelu_and_mul_tanh", "geglu_none", "gelu_none"])
def test_bad_approximate(kf, op, device):
    inp = make_inputs(op, (4, 64), torch.float32, device)
    fn = {"gelu_and_mul": lambda: kf.gelu_and_mul(inp["x"], approximate="erf"),
          "geglu": lambda: kf.geglu(inp["hidden"], inp["gate"], approximate="Tanh"),
          "gelu": lambda: kf.gelu(inp["x"], approximate="")}[A.kind(op)]
    with pytest.raises(ValueError, match=f"{A.kind(op)}: approximate must be 'none' or 'tanh', got"):
        fn()


@pytest.mark.cuda
def test_float64_strict(kf):
    """KF_STRICT=1: float64 CUDA tensors are an error instead of the warned CPU round trip."""
    import subprocess
    import sys

    code = ("import torch, kernelforge as kf\n"
            "x = torch.randn(4, 64, dtype=torch.float64, device='cuda')\n"
            "try:\n    kf.silu_and_mul(x)\nexcept RuntimeError as e:\n    print('ERR', e)\n")
    import os

    r = subprocess.run([sys.executable, "-c", code], env={**os.environ, "KF_STRICT": "1"}, capture_output=True,
                       text=True, timeout=300)
    assert "ERR" in r.stdout and "silu_and_mul" in r.stdout and "KF_STRICT" in r.stdout, r.stdout + r.stderr


# ---- NaN / Inf ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")], ids=["nan", "inf", "-inf"])
@pytest.mark.parametrize("op", OPS)
def test_nonfinite_propagates(kf, op, bad, device, dtype):
    """A non-finite input gives the reference's NaN/Inf pattern (PyTorch float64: F.silu(-inf) = nan,
    F.gelu(inf) = inf, ...), forward and backward; other rows stay finite."""
    inp = make_inputs(op, (5, 300), dtype, device)
    for v in inp.values():
        v[1, 7] = bad  # the activation input and the multiplier: both positions matter
    inp = {k: v.requires_grad_() for k, v in inp.items()}
    y = run_kf(kf, op, inp)
    ref = {k: v.detach().double().requires_grad_() for k, v in inp.items()}
    e = run_ref(op, ref, torch.float64)
    assert torch.equal(y.isnan(), e.isnan()), f"{op}: NaN pattern differs from the reference"
    assert torch.equal(y.isinf(), e.to(dtype).isinf()), f"{op}: Inf pattern differs from the reference"
    assert not y.isfinite().all()
    fin = e.to(dtype).isfinite()
    R.assert_close(y[fin], e.to(dtype)[fin], dtype, msg=f"{op}: finite part")
    dy = R.rand(y.shape, dtype, device)
    y.backward(dy)
    e.backward(dy.double())
    for k in inp:
        g, ge = inp[k].grad, ref[k].grad
        assert torch.equal(g.isnan(), ge.isnan()), f"{op}: d{k} NaN pattern differs from the reference"
        rows = [0, 2, 3, 4]
        assert g[rows].isfinite().all()
        R.assert_close(g[rows], ge[rows], dtype, grad=True, msg=f"{op}: d{k} of the finite rows")
