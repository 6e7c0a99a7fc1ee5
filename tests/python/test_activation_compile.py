"""torch.compile (fullgraph, no recompiles) and CUDA-graph capture of the activation ops.

One module calls every activation op, so one compile per backend covers them all (compiles are the
slow part of this suite)."""

from __future__ import annotations

import pytest
import torch

import act_ref as A
import norm_ref as R

COMPILE_CASES = [pytest.param("cpu", torch.float32, "aot_eager", id="cpu-aot_eager")] + [
    pytest.param("cuda", torch.bfloat16, "inductor", id="cuda-inductor", marks=pytest.mark.cuda)
]


class MLP(torch.nn.Module):
    """Every activation op between small elementwise ops (work for the compiler around them)."""

    def __init__(self, kf):
        super().__init__()
        self.kf = kf

    def forward(self, x, gate, up):
        kf = self.kf
        h = kf.silu_and_mul(x * 2.0)
        h = h + kf.swiglu(gate, up)
        h = h + kf.gelu_and_mul(x, approximate="tanh", gate_first=True)
        h = h + kf.gelu_and_mul(x, approximate="none", gate_first=False)
        h = h + kf.geglu(up, gate + 1.0)
        h = h + kf.gelu(gate, approximate="tanh") * 0.5
        # mean, not sum: float32 sums of thousands of terms differ with the summation order. The sine
        # takes h / 100: y.backward(ones) sends numel * d mean(sin(h/100))/dh = cos(h/100) / 100 to
        # every element of h, which moves by < 1 % when eager's bf16 rounding of h (ulp 1 at |h| ~ 200)
        # differs from the compiled float32 value; sin(h) would make that gradient arbitrary.
        return (h.float() * 0.01).sin().mean() + h * 3.0


def _inputs(shape, dtype, device):
    x = R.rand((*shape[:-1], 2 * shape[-1]), dtype, device, scale=2.0).requires_grad_()
    gate = R.rand(shape, dtype, device, scale=2.0).requires_grad_()
    up = R.rand(shape, dtype, device).requires_grad_()
    return x, gate, up


def _close_to_eager(actual, expected, dtype, msg):
    """Compiled vs eager output of the whole module: inductor fuses the elementwise ops around ours
    and keeps float32 between them, where eager rounds to bf16 after every op, so the two differ by a
    few bf16 ulps of the largest values (1.0 at |h| ~ 200): the tolerance scales with max |expected|."""
    assert actual.dtype == expected.dtype, f"{msg}: dtype {actual.dtype} != {expected.dtype}"
    tol = R.TOL[dtype]
    a, e = actual.detach().double().cpu(), expected.detach().double().cpu()
    torch.testing.assert_close(a, e, rtol=tol, atol=tol * max(1.0, e.abs().max().item()), equal_nan=False,
                               msg=lambda m: f"{msg}\n{m}")


@pytest.mark.parametrize("device,dtype,backend", COMPILE_CASES)
def test_compile_fullgraph_no_recompile(kf, device, dtype, backend):
    torch._dynamo.reset()
    shape = (4, 7, 1000)
    mlp = MLP(kf)
    compiled = torch.compile(mlp, fullgraph=True, backend=backend, dynamic=False)

    def run(fn, args):
        for t in args:
            t.grad = None
        y = fn(*args)
        y.backward(torch.ones_like(y))
        return y.detach(), [t.grad for t in args]

    args = _inputs(shape, dtype, device)
    y_c, g_c = run(compiled, args)
    y_e, g_e = run(mlp, args)
    _close_to_eager(y_c, y_e, dtype, "compiled vs eager")
    for a, e in zip(g_c, g_e):
        R.assert_close(a, e.double(), dtype, grad=True, msg="compiled grad vs eager")

    # new data, same shapes: must reuse the compiled graph
    args2 = _inputs(shape, dtype, device)
    with torch.compiler.set_stance("fail_on_recompile"):
        y_c2, g_c2 = run(compiled, args2)
    y_e2, g_e2 = run(mlp, args2)
    _close_to_eager(y_c2, y_e2, dtype, "compiled vs eager (second call)")
    for a, e in zip(g_c2, g_e2):
        R.assert_close(a, e.double(), dtype, grad=True, msg="compiled grad vs eager (second call)")
    assert not torch.equal(y_c, y_c2), "second call must see the new data"


def test_compile_odd_width_error(kf):
    """The fake implementation reports an odd last dimension while tracing, with the op's message."""
    torch._dynamo.reset()
    f = torch.compile(lambda x: kf.silu_and_mul(x), fullgraph=True, backend="aot_eager")
    with pytest.raises(Exception, match=r"silu_and_mul: x last dimension must be even \(2\*I\), got 7"):
        f(torch.randn(3, 7))


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
def test_cuda_graph_forward(kf, shape, dtype):
    static = {op: A.make_inputs(op, shape, dtype, "cuda") for op in A.OPS}
    g, out = _capture(lambda: [A.run_kf(kf, op, static[op]) for op in A.OPS])
    for _ in range(2):  # replay with fresh data copied into the static inputs
        for op in A.OPS:
            for k, v in A.make_inputs(op, shape, dtype, "cuda").items():
                static[op][k].copy_(v)
        g.replay()
        for op, y in zip(A.OPS, out):
            assert torch.equal(y, A.run_kf(kf, op, static[op])), f"{op}: graph replay differs from eager"


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=str)
def test_cuda_graph_forward_backward(kf, dtype):
    shape = (3, 5, 2048)
    static = {op: {k: v.requires_grad_() for k, v in A.make_inputs(op, shape, dtype, "cuda").items()}
              for op in A.OPS}
    dys = {op: R.rand(shape, dtype, "cuda") for op in A.OPS}

    def step():
        outs = []
        for op in A.OPS:
            for t in static[op].values():
                t.grad = None
            y = A.run_kf(kf, op, static[op])
            y.backward(dys[op])
            outs.append(y.detach())
        return outs

    g, out = _capture(step)
    grads = {op: [t.grad for t in static[op].values()] for op in A.OPS}
    with torch.no_grad():
        for op in A.OPS:
            for k, v in A.make_inputs(op, shape, dtype, "cuda").items():
                static[op][k].copy_(v)
            dys[op].copy_(R.rand(shape, dtype, "cuda"))
    g.replay()
    torch.cuda.synchronize()
    for op, y in zip(A.OPS, out):
        eager = {k: v.detach().clone().requires_grad_() for k, v in static[op].items()}
        e = A.run_kf(kf, op, eager)
        e.backward(dys[op])
        assert torch.equal(y, e), f"{op}: graph replay forward differs from eager"
        for (k, v), gr in zip(eager.items(), grads[op]):
            assert torch.equal(gr, v.grad), f"{op}: graph replay d{k} differs from eager"
