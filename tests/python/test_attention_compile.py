"""kernelforge.attention under torch.compile(fullgraph=True) and CUDA-graph capture: the fake impl's
shapes, no graph break, no recompilation on new varlen lengths (max_seqlen are SymInts the fake impl
never reads), and a captured graph that replays on new data."""

from __future__ import annotations

import pytest
import torch

from kernelforge.specs import TOL
from kernelforge.specs.attention import attention_ref

DEVICES = [pytest.param("cpu", torch.float64, id="cpu-float64"),
           pytest.param("cuda", torch.bfloat16, id="cuda-bfloat16", marks=pytest.mark.cuda)]


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


@pytest.mark.parametrize("layout", ["bshd", "bhsd"])
@pytest.mark.parametrize("device,dtype", DEVICES)
def test_compile_fullgraph_matches_eager(kf, device, dtype, layout):
    q = torch.randn(2, 8, 4, 64, device=device, dtype=dtype)
    k = torch.randn(2, 8, 2, 64, device=device, dtype=dtype)
    if layout == "bhsd":
        q, k = q.transpose(1, 2), k.transpose(1, 2)
    sinks = torch.randn(4, device=device)

    def f(q, k, v):
        out, lse = kf.attention(q, k, v, causal=True, window=(3, 0), softcap=20.0, sinks=sinks, layout=layout,
                                return_lse=True)
        return out * 2, lse

    got, lse = torch.compile(f, fullgraph=True)(q, k, k)
    want, want_lse = f(q, k, k)
    assert got.shape == want.shape and got.dtype == dtype and lse.shape == want_lse.shape
    assert lse.dtype == torch.float32
    assert torch.equal(got, want) and torch.equal(lse, want_lse)


@pytest.mark.parametrize("device,dtype", DEVICES)
@torch._dynamo.config.patch(error_on_recompile=True)
def test_varlen_no_recompile_on_new_lengths(kf, device, dtype):
    """Calls with different cu_seqlens values, token counts and max_seqlen: one compilation."""
    counts = {"frames": 0}

    def backend(gm, example_inputs):
        counts["frames"] += 1
        return gm

    @torch.compile(fullgraph=True, dynamic=True, backend=backend)
    def f(q, k, v, cu, max_len):
        return kf.attention(q, k, v, causal=True, cu_seqlens_q=cu, cu_seqlens_k=cu, max_seqlen_q=max_len,
                            max_seqlen_k=max_len)

    for lens in ([3, 5, 2], [7, 1, 6], [4, 4, 9]):
        t = sum(lens)
        cu = torch.tensor([0] + lens, device=device).cumsum(0).to(torch.int32)
        q, k, v = (torch.randn(t, 4, 64, device=device, dtype=dtype) for _ in range(3))
        got = f(q, k, v, cu, max(lens))
        want, _ = attention_ref(q.cpu(), k.cpu(), v.cpu(), causal=True, cu_seqlens_q=cu.cpu(), cu_seqlens_k=cu.cpu(),
                                layout="varlen")
        err = (got.cpu().double() - want.to(dtype).double()).abs().max().item()
        assert err <= TOL[dtype].attn * 2
    assert counts["frames"] == 1


@pytest.mark.parametrize("device,dtype", DEVICES)
@torch._dynamo.config.patch(error_on_recompile=True)
def test_varlen_same_shape_new_values_no_recompile(kf, device, dtype):
    """Default (static) compile: new cu_seqlens values of the same shape reuse the graph."""
    f = torch.compile(lambda q, cu: kf.attention(q, q, q, cu_seqlens_q=cu, cu_seqlens_k=cu, max_seqlen_q=12,
                                                 max_seqlen_k=12), fullgraph=True)
    q = torch.randn(12, 2, 64, device=device, dtype=dtype)
    for cut in (3, 7, 12):
        cu = torch.tensor([0, cut, 12], device=device, dtype=torch.int32)
        f(q, cu)


def test_compile_grad_matches_eager(kf):
    """A gradient through the compiled op (aot_eager on the CPU reference): the backward op traces
    into the joint graph, and the gradient is the eager one."""
    q = torch.randn(1, 4, 2, 64, dtype=torch.float64, requires_grad=True)
    f = torch.compile(lambda q: kf.attention(q, q.detach(), q.detach()), fullgraph=True, backend="aot_eager")
    f(q).sum().backward()
    got = q.grad
    q.grad = None
    kf.attention(q, q.detach(), q.detach()).sum().backward()
    assert torch.equal(got, q.grad)


@pytest.mark.cuda
def test_cuda_graph_capture(kf):
    """The op captures into a CUDA graph (no host sync, no allocation outside the graph pool) and
    the replay computes on the new contents of the captured inputs."""
    q, k, v = (torch.randn(2, 256, 8, 128, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        kf.attention(q, k, v, causal=True)  # warm up (plan caches, allocator)
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out = kf.attention(q, k, v, causal=True)
    for _ in range(2):
        for t in (q, k, v):
            t.copy_(torch.randn_like(t))
        g.replay()
        torch.cuda.synchronize()
        assert torch.equal(out, kf.attention(q, k, v, causal=True))
