"""Double backward (create_graph=True) is an explicit error for every differentiable op: the backward
ops have no autograd of their own, so a graph through them would silently give zero second
derivatives. A plain backward still works. CPU (the float64 reference): the check is in the shared
autograd code, the same for CUDA."""

from __future__ import annotations

import pytest
import torch


def _cases(kf):
    f64 = dict(dtype=torch.float64)
    x = torch.randn(3, 8, **f64)
    w = torch.randn(8, **f64)
    cos, sin = torch.randn(5, 8, **f64), torch.randn(5, 8, **f64)
    return {
        "rms_norm": ((x, w), lambda a, b: kf.rms_norm(a, b)),
        "add_rms_norm": ((x, x.clone()), lambda a, b: kf.add_rms_norm(a, b)[0]),
        "layer_norm": ((x, w), lambda a, b: kf.layer_norm(a, b)),
        "ada_norm": ((x, w), lambda a, b: kf.ada_norm(a, b, b)),
        "silu_and_mul": ((x,), lambda a: kf.silu_and_mul(a)),
        "swiglu": ((x, x.clone()), lambda a, b: kf.swiglu(a, b)),
        "gelu_and_mul": ((x,), lambda a: kf.gelu_and_mul(a)),
        "geglu": ((x, x.clone()), lambda a, b: kf.geglu(a, b)),
        "gelu": ((x,), lambda a: kf.gelu(a)),
        "apply_rope": ((torch.randn(2, 5, 3, 8, **f64),), lambda q: kf.apply_rope(q, None, cos, sin)[0]),
    }


@pytest.mark.parametrize(
    "op",
    ["rms_norm", "add_rms_norm", "layer_norm", "ada_norm", "silu_and_mul", "swiglu", "gelu_and_mul", "geglu",
     "gelu", "apply_rope"],
)
def test_double_backward_is_an_error(kf, op):
    inputs, fn = _cases(kf)[op]
    inputs = [t.clone().requires_grad_() for t in inputs]
    grads = torch.autograd.grad(fn(*inputs).sum(), inputs)  # first derivatives: fine
    assert all(g is not None and g.isfinite().all() for g in grads)
    with pytest.raises(RuntimeError, match=f"{op}: double backward"):
        torch.autograd.grad(fn(*inputs).sum(), inputs, create_graph=True)
