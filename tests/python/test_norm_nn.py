"""kernelforge.nn.RMSNorm / LayerNorm as drop-ins for torch.nn.RMSNorm / torch.nn.LayerNorm."""

from __future__ import annotations

import pytest
import torch

import norm_ref as R
from norm_ref import DEVICES, DTYPES

SHAPES = [64, (4, 16)]  # one and several normalized dims


def _pair(kf_cls, torch_cls, device, dtype, **kw):
    """A torch module with random parameters and a kernelforge module loaded from its state_dict."""
    ref = torch_cls(device=device, dtype=dtype, **kw)
    with torch.no_grad():
        for p in ref.parameters():
            p.copy_(R.rand(p.shape, dtype, device, scale=0.5, offset=1.0))
    mine = kf_cls(device=device, dtype=dtype, **kw)
    assert mine.state_dict().keys() == ref.state_dict().keys()
    mine.load_state_dict(ref.state_dict(), strict=True)
    return mine, ref


def _compare(mine, ref, x, dtype):
    xa = x.detach().clone().requires_grad_()
    xb = x.detach().clone().requires_grad_()
    R.poison(x.device)
    ya, yb = mine(xa), ref(xb)
    R.assert_close(ya, yb, dtype, msg="forward vs torch.nn")
    dy = R.rand(ya.shape, dtype, x.device)
    ya.backward(dy)
    yb.backward(dy)
    R.assert_close(xa.grad, xb.grad.double(), dtype, grad=True, msg="dx vs torch.nn")
    for (name, pa), pb in zip(mine.named_parameters(), ref.parameters()):
        R.assert_close(pa.grad, pb.grad.double(), dtype, grad=True, msg=f"d{name} vs torch.nn")


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("affine", [True, False], ids=["affine", "noweight"])
@pytest.mark.parametrize("eps", [None, 1e-5])
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_rms_norm_module(kf, shape, eps, affine, device, dtype):
    mine, ref = _pair(kf.nn.RMSNorm, torch.nn.RMSNorm, device, dtype, normalized_shape=shape, eps=eps,
                      elementwise_affine=affine)
    assert (mine.normalized_shape, mine.eps, mine.elementwise_affine) == (ref.normalized_shape, ref.eps, ref.elementwise_affine)
    norm = (shape,) if isinstance(shape, int) else shape
    _compare(mine, ref, R.rand((3, 5, *norm), dtype, device), dtype)
    # tiny inputs: eps dominates, so eps=None must resolve to torch's value (float32 epsilon for
    # half types: aten uses the epsilon of the computation dtype, not of x's dtype)
    _compare(mine, ref, R.rand((3, *norm), dtype, device, scale=1e-3), dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("affine,bias", [(True, True), (True, False), (False, False)], ids=["affine", "nobias", "noaffine"])
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_layer_norm_module(kf, shape, affine, bias, device, dtype):
    mine, ref = _pair(kf.nn.LayerNorm, torch.nn.LayerNorm, device, dtype, normalized_shape=shape, eps=1e-5,
                      elementwise_affine=affine, bias=bias)
    assert (mine.normalized_shape, mine.eps, mine.elementwise_affine) == (ref.normalized_shape, ref.eps, ref.elementwise_affine)
    assert (mine.bias is None) == (ref.bias is None)
    norm = (shape,) if isinstance(shape, int) else shape
    _compare(mine, ref, R.rand((3, 5, *norm), dtype, device, offset=0.5), dtype)


def test_defaults_and_state_dict(kf):
    a, b = kf.nn.RMSNorm(32), torch.nn.RMSNorm(32)
    assert a.eps is None and a.elementwise_affine and torch.equal(a.weight, b.weight)
    c, d = kf.nn.LayerNorm(32), torch.nn.LayerNorm(32)
    assert c.eps == d.eps == 1e-5 and torch.equal(c.weight, d.weight) and torch.equal(c.bias, d.bias)
    assert list(c.state_dict()) == ["weight", "bias"] and list(a.state_dict()) == ["weight"]
    assert kf.nn.RMSNorm(32, elementwise_affine=False).state_dict() == {}
    assert list(kf.nn.LayerNorm(32, bias=False).state_dict()) == ["weight"]
    # a torch checkpoint loads into the kernelforge module and the other way round
    kf.nn.LayerNorm(32).load_state_dict(d.state_dict(), strict=True)
    d.load_state_dict(kf.nn.LayerNorm(32).state_dict(), strict=True)
    assert "eps=None" in repr(a) and "(32,)" in repr(c)


@pytest.mark.parametrize("cls", ["RMSNorm", "LayerNorm"])
@pytest.mark.parametrize("affine", [True, False], ids=["affine", "noweight"])
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_wrong_trailing_shape_raises(kf, cls, affine, shape):
    """Like torch: the input's trailing dims must equal normalized_shape (also without a weight and
    when the element count happens to match)."""
    m = getattr(kf.nn, cls)(shape, elementwise_affine=affine)
    bad = torch.randn(3, 16, 4) if shape == (4, 16) else torch.randn(3, 32)
    with pytest.raises(RuntimeError, match="normalized_shape|trailing shape|must have shape"):
        m(bad)
