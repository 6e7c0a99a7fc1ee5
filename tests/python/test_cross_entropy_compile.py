"""opcheck, torch.compile (fullgraph, no recompiles) and CUDA-graph capture of cross_entropy and
fused_linear_cross_entropy (no host sync anywhere in their path: capture would fail on one)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import norm_ref as R
from norm_ref import DEVICES

OPCHECK_TESTS = ("test_schema", "test_autograd_registration", "test_faketensor", "test_aot_dispatch_dynamic")


def _ce_inputs(device, dtype=torch.float32, t=9, v=515):
    x = R.rand((t, v), dtype, device, scale=3.0)
    tg = torch.randint(0, v, (t,), device=device)
    tg[3] = -100
    return x, tg


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("reduction", ["none", "mean", "sum"])
def test_opcheck_cross_entropy(kf, device, reduction):
    x, tg = _ce_inputs(device)
    ops = torch.ops.kernelforge
    torch.library.opcheck(ops.cross_entropy.default, (x.requires_grad_(), tg, -100, 0.1, 1e-4, 0.0, reduction),
                          test_utils=OPCHECK_TESTS)
    loss, lse, valid = ops.cross_entropy(x.detach(), tg, -100, 0.1, 1e-4, 0.0, reduction)
    dloss = torch.rand(loss.shape, device=device)
    torch.library.opcheck(ops.cross_entropy_backward.default,
                          (dloss, x.detach(), tg, lse, valid, -100, 0.1, 1e-4, 0.0, reduction),
                          test_utils=OPCHECK_TESTS)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("reduction", ["none", "mean"])
def test_opcheck_flce(kf, device, reduction):
    h = R.rand((11, 16), torch.float32, device).requires_grad_()
    w = R.rand((130, 16), torch.float32, device, scale=0.3).requires_grad_()
    b = R.rand((130,), torch.float32, device).requires_grad_()
    tg = torch.randint(0, 130, (11,), device=device)
    ops = torch.ops.kernelforge
    torch.library.opcheck(ops.fused_linear_cross_entropy.default, (h, w, tg, b, -100, 0.0, 0.0, 0.0, reduction, 4),
                          test_utils=OPCHECK_TESTS)
    args = (h.detach(), w.detach(), tg, b.detach(), -100, 0.0, 0.0, 0.0, reduction, 4, True, True, True)
    torch.library.opcheck(ops.fused_linear_cross_entropy_forward.default, args, test_utils=OPCHECK_TESTS[:3])
    lse = ops.fused_linear_cross_entropy_forward(*args)[1]
    torch.library.opcheck(ops.fused_linear_cross_entropy_backward.default,
                          (torch.rand(11, device=device), h.detach(), w.detach(), tg, b.detach(), lse, -100, 0.0,
                           0.0, 0.0, 4, True, True, True), test_utils=OPCHECK_TESTS[:3])


COMPILE_CASES = [pytest.param("cpu", torch.float32, "aot_eager", id="cpu-aot_eager")] + [
    pytest.param("cuda", torch.bfloat16, "inductor", id="cuda-inductor", marks=pytest.mark.cuda)
]


class LossHead(torch.nn.Module):
    """A projection, both loss ops and ordinary ops around them."""

    def __init__(self, kf):
        super().__init__()
        self.kf = kf

    def forward(self, h, w, tg):
        kf = self.kf
        a = kf.fused_linear_cross_entropy(h * 1.5, w, tg, label_smoothing=0.1)
        logits = (h @ w.t()).float()
        b = kf.cross_entropy(logits, tg, z_loss_scale=1e-4)
        c = kf.cross_entropy(logits * 0.5, tg, reduction="none").mean()
        return a + b + c


def _loss_inputs(device, dtype, seed):
    g = torch.Generator(device=device).manual_seed(seed)
    h = (torch.randn(24, 32, device=device, generator=g)).to(dtype).requires_grad_()
    w = (torch.randn(257, 32, device=device, generator=g) * 0.2).to(dtype).requires_grad_()
    tg = torch.randint(0, 257, (24,), device=device, generator=g)
    tg[5] = -100
    return h, w, tg


@pytest.mark.parametrize("device,dtype,backend", COMPILE_CASES)
def test_compile_fullgraph_no_recompile(kf, device, dtype, backend):
    torch._dynamo.reset()
    mod = LossHead(kf)
    compiled = torch.compile(mod, fullgraph=True, backend=backend, dynamic=False)
    for seed in (0, 1):  # the second call (new data, same shapes) must reuse the compiled graph
        h, w, tg = _loss_inputs(device, dtype, seed)
        he, we = h.detach().clone().requires_grad_(), w.detach().clone().requires_grad_()
        if seed == 0:
            out = compiled(h, w, tg)
        else:
            with torch.compiler.set_stance("fail_on_recompile"):
                out = compiled(h, w, tg)
        exp = mod(he, we, tg)
        torch.testing.assert_close(out, exp, rtol=2e-2, atol=2e-2)
        out.backward()
        exp.backward()
        for a, e in ((h.grad, he.grad), (w.grad, we.grad)):
            R.assert_close(a, e.double(), dtype, grad=True, msg="compiled grad")


def _capture(fn):
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
@pytest.mark.parametrize("reduction", ["mean", "none"])
def test_cuda_graph_cross_entropy(kf, reduction):
    x, tg = _ce_inputs("cuda", torch.bfloat16, t=64, v=32000)
    red = reduction
    ops = torch.ops.kernelforge

    def step():
        loss, lse, valid = ops.cross_entropy(x, tg, -100, 0.1, 1e-4, 0.0, red)
        dl = ops.cross_entropy_backward(torch.ones_like(loss, dtype=torch.float32), x, tg, lse, valid, -100, 0.1,
                                        1e-4, 0.0, red)
        return loss, dl

    g, (loss, dl) = _capture(step)
    x.copy_(R.rand(x.shape, x.dtype, "cuda", scale=3.0))  # new data, same buffers
    g.replay()
    torch.cuda.synchronize()
    exp_loss, exp_dl = step()
    assert torch.equal(loss, exp_loss) and torch.equal(dl, exp_dl)


@pytest.mark.cuda
def test_cuda_graph_flce(kf):
    h = torch.randn(256, 64, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(5000, 64, device="cuda", dtype=torch.bfloat16) * 0.1
    tg = torch.randint(0, 5000, (256,), device="cuda")
    ops = torch.ops.kernelforge

    def step():
        return ops.fused_linear_cross_entropy_forward(h, w, tg, None, -100, 0.0, 0.0, 0.0, "mean", 100, True, True, False)

    g, out = _capture(step)
    h.copy_(torch.randn_like(h))
    g.replay()
    torch.cuda.synchronize()
    exp = step()
    for a, e in zip(out[:4], exp[:4]):
        assert torch.equal(a, e)
    torch.testing.assert_close(out[0], F.cross_entropy((h @ w.t()).float(), tg), rtol=1e-3, atol=1e-3)
