"""torch.compile (fullgraph, no recompiles) and CUDA-graph capture of the norm ops."""

from __future__ import annotations

import pytest
import torch

import norm_ref as R
from norm_ref import OPS, make_inputs, run_kf

COMPILE_CASES = [pytest.param("cpu", torch.float32, "aot_eager", id="cpu-aot_eager")] + [
    pytest.param("cuda", torch.bfloat16, "inductor", id="cuda-inductor", marks=pytest.mark.cuda)
]


class Block(torch.nn.Module):
    """A small module around one op, with elementwise work before and after for the compiler."""

    def __init__(self, kf, op, inp):
        super().__init__()
        self.kf, self.op = kf, op
        for k in ("weight", "bias"):
            v = inp.get(k)
            setattr(self, k, None if v is None else torch.nn.Parameter(v.clone()))

    def forward(self, x, extra):
        inp = {"weight": self.weight, "bias": self.bias, **extra, "x": x * 2.0}
        out = run_kf(self.kf, self.op, inp)
        # mean, not sum: a float32 sum of thousands of terms differs with the summation order
        # between compiled and eager code by more than the float32 tolerance.
        return sum(y.float().sin().mean() for y in out) + out[0] * 3.0


@pytest.mark.parametrize("device,dtype,backend", COMPILE_CASES)
@pytest.mark.parametrize("op", OPS)
def test_compile_fullgraph_no_recompile(kf, op, device, dtype, backend):
    torch._dynamo.reset()
    shape = (4, 7, 1000)
    mod_shape = (4, 1, 1000) if op.startswith("ada") else None

    def inputs():
        inp = make_inputs(op, shape, dtype, device, mod_shape=mod_shape)
        extra = {k: v.requires_grad_() for k, v in inp.items() if k in ("residual", "scale", "shift")}
        return inp, inp["x"].requires_grad_(), extra

    inp, x, extra = inputs()
    block = Block(kf, op, inp)
    compiled = torch.compile(block, fullgraph=True, backend=backend, dynamic=False)

    def run(fn, x, extra):
        block.zero_grad(set_to_none=True)
        for t in (x, *extra.values()):
            t.grad = None
        y = fn(x, extra)
        y.backward(torch.ones_like(y))
        return y.detach(), [p.grad for p in block.parameters()] + [t.grad for t in (x, *extra.values())]

    y_c, g_c = run(compiled, x, extra)
    y_e, g_e = run(block, x, extra)
    R.assert_close(y_c, y_e, dtype, msg="compiled vs eager")
    for a, e in zip(g_c, g_e):
        R.assert_close(a, e.double(), dtype, grad=True, msg="compiled grad vs eager")

    # new data, same shapes: must reuse the compiled graph
    inp2, x2, extra2 = inputs()
    with torch.compiler.set_stance("fail_on_recompile"):
        y_c2, g_c2 = run(compiled, x2, extra2)
    y_e2, g_e2 = run(block, x2, extra2)
    R.assert_close(y_c2, y_e2, dtype, msg="compiled vs eager (second call)")
    for a, e in zip(g_c2, g_e2):
        R.assert_close(a, e.double(), dtype, grad=True, msg="compiled grad vs eager (second call)")
    assert not torch.equal(y_c, y_c2), "second call must see the new data"


@pytest.mark.parametrize("cls", ["RMSNorm", "LayerNorm"])
@pytest.mark.parametrize("device,dtype,backend", COMPILE_CASES)
def test_compile_nn_modules(kf, cls, device, dtype, backend):
    torch._dynamo.reset()
    m = getattr(kf.nn, cls)(256, device=device, dtype=dtype)
    ref = getattr(torch.nn, cls)(256, device=device, dtype=dtype)
    compiled = torch.compile(m, fullgraph=True, backend=backend)
    x = R.rand((8, 256), dtype, device)
    R.assert_close(compiled(x), ref(x), dtype)
    with torch.compiler.set_stance("fail_on_recompile"):
        x2 = R.rand((8, 256), dtype, device)
        R.assert_close(compiled(x2), ref(x2), dtype)


# ---- CUDA graphs --------------------------------------------------------------------------------------


def _capture(fn):
    """Warm up on a side stream, then capture fn() into a CUDA graph; returns (graph, outputs)."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(2):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out = fn()
    return g, out


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=str)
@pytest.mark.parametrize("shape", [(1, 4096), (33, 2048)], ids=str)
@pytest.mark.parametrize("op", OPS)
def test_cuda_graph_forward(kf, op, shape, dtype):
    mod_shape = shape if op.startswith("ada") else None
    static = make_inputs(op, shape, dtype, "cuda", mod_shape=mod_shape)
    g, out = _capture(lambda: run_kf(kf, op, static))
    for _ in range(2):  # replay with fresh data copied into the static inputs
        new = make_inputs(op, shape, dtype, "cuda", mod_shape=mod_shape)
        for k, v in new.items():
            if v is not None:
                static[k].copy_(v)
        g.replay()
        expected = run_kf(kf, op, new)
        for a, e in zip(out, expected):
            assert torch.equal(a, e), f"{op}: graph replay differs from eager"


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=str)
@pytest.mark.parametrize("op", OPS)
def test_cuda_graph_forward_backward(kf, op, dtype):
    shape = (3, 5, 2048)
    mod_shape = (3, 1, 2048) if op.startswith("ada") else None
    static = {k: (v.requires_grad_() if v is not None else None)
              for k, v in make_inputs(op, shape, dtype, "cuda", mod_shape=mod_shape).items()}
    leaves = [v for v in static.values() if v is not None]
    n_out = 2 if op == "add_rms_norm" else 1
    dys = [R.rand(shape, dtype, "cuda") for _ in range(n_out)]

    def step():
        for t in leaves:
            t.grad = None
        out = run_kf(kf, op, static)
        torch.autograd.backward(out, dys)
        return [o.detach() for o in out]

    g, out = _capture(step)
    grads = [t.grad for t in leaves]
    new = make_inputs(op, shape, dtype, "cuda", mod_shape=mod_shape)
    with torch.no_grad():
        for k, v in new.items():
            if v is not None:
                static[k].copy_(v)
        for d in dys:
            d.copy_(R.rand(shape, dtype, "cuda"))
    g.replay()
    torch.cuda.synchronize()
    eager = {k: (v.detach().clone().requires_grad_() if v is not None else None) for k, v in static.items()}
    e_out = run_kf(kf, op, eager)
    torch.autograd.backward(e_out, dys)
    for a, e in zip(out, e_out):
        assert torch.equal(a, e), f"{op}: graph replay forward differs from eager"
    for (k, v), gr in zip([(k, v) for k, v in eager.items() if v is not None], grads):
        assert torch.equal(gr, v.grad), f"{op}: graph replay d{k} differs from eager"
