"""torch.compile (fullgraph, no recompiles on new data), opcheck-clean fake impls and CUDA-graph
capture/replay of the softmax ops."""

from __future__ import annotations

import pytest
import torch

import norm_ref as R
import sm_ref as S

COMPILE_CASES = [pytest.param("cpu", torch.float32, "aot_eager", id="cpu-aot_eager")] + [
    pytest.param("cuda", torch.bfloat16, "inductor", id="cuda-inductor", marks=pytest.mark.cuda)
]


class Attn(torch.nn.Module):
    """Both ops, over the last and a middle dim, between small elementwise ops."""

    def __init__(self, kf):
        super().__init__()
        self.kf = kf

    def forward(self, s):
        kf = self.kf
        p = kf.softmax(s * 0.5, dim=-1)
        lp = kf.log_softmax(s + 1.0, dim=1)
        return p * 2.0 + (lp * 0.01).exp()


@pytest.mark.parametrize("device,dtype,backend", COMPILE_CASES)
def test_compile_fullgraph_no_recompile(kf, device, dtype, backend):
    torch._dynamo.reset()
    mod = Attn(kf)
    compiled = torch.compile(mod, fullgraph=True, backend=backend, dynamic=False)

    def run(fn, x):
        x.grad = None
        y = fn(x)
        y.backward(torch.ones_like(y))
        return y.detach(), x.grad

    shape = (4, 6, 1000)
    x = S.logits(shape, dtype, device).requires_grad_()
    y_c, g_c = run(compiled, x)
    y_e, g_e = run(mod, x)
    S.assert_close(y_c, y_e, dtype, scaled=True, msg="compiled vs eager")
    S.assert_close(g_c, g_e, dtype, scaled=True, msg="compiled grad vs eager")
    x2 = S.logits(shape, dtype, device).requires_grad_()
    with torch.compiler.set_stance("fail_on_recompile"):
        y_c2, g_c2 = run(compiled, x2)
    y_e2, g_e2 = run(mod, x2)
    S.assert_close(y_c2, y_e2, dtype, scaled=True, msg="compiled vs eager (second call)")
    S.assert_close(g_c2, g_e2, dtype, scaled=True, msg="compiled grad vs eager (second call)")
    assert not torch.equal(y_c, y_c2), "second call must see the new data"


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.cuda)])
@pytest.mark.parametrize("op", S.OPS)
def test_opcheck_views(kf, op, device):
    """opcheck on a row-strided view and a 1-D tensor (the fake impls return contiguous outputs)."""
    ops = torch.ops.kernelforge
    big = S.logits((5, 80), torch.float32, device)
    for x in (big[:, :40], big[0]):
        torch.library.opcheck(getattr(ops, op).default, (x.requires_grad_(),))


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
@pytest.mark.parametrize("shape", [(1, 4096), (33, 2048), (2, 131072)], ids=str)
def test_cuda_graph_forward_backward(kf, shape, dtype):
    x = S.logits(shape, dtype, "cuda").requires_grad_()
    dy = R.rand(shape, dtype, "cuda")

    def step():
        outs = []
        for op in S.OPS:
            x.grad = None
            y = S.run(kf, op, x)
            y.backward(dy)
            outs += [y.detach(), x.grad]
        return outs

    g, out = _capture(step)
    for _ in range(2):  # replay with fresh data copied into the static inputs
        with torch.no_grad():
            x.copy_(S.logits(shape, dtype, "cuda"))
            dy.copy_(R.rand(shape, dtype, "cuda"))
        g.replay()
        torch.cuda.synchronize()
        for i, op in enumerate(S.OPS):
            xe = x.detach().clone().requires_grad_()
            ye = S.run(kf, op, xe)
            ye.backward(dy)
            assert torch.equal(out[2 * i], ye), f"{op}: graph replay forward differs from eager"
            assert torch.equal(out[2 * i + 1], xe.grad), f"{op}: graph replay dx differs from eager"
