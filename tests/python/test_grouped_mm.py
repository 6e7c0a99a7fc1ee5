"""kf.grouped_mm (the MoE grouped GEMM) forward and backward (dx, and dw through grouped_mm_wgrad) against
the float64 reference of kernelforge.specs.grouped_mm, on CPU (the C++ float64 reference) and CUDA (the
wgmma kernel on sm_90 for aligned shapes, the portable kernel for the rest): skewed routing with empty
experts, rows of no expert, out-of-order offsets, w as a transposed [E, K, N] view, odd sizes, strided
x, torch._grouped_mm and a cuBLAS loop at a model shape, torch.compile, CUDA graphs, the error messages."""

from __future__ import annotations

import pytest
import torch

import norm_ref as R
from norm_ref import DEVICES

from kernelforge.specs.grouped_mm import group_sizes, grouped_ref

DTYPES = [torch.bfloat16, torch.float16]

# (E, T, N, K): one row; odd N and K (portable kernel); aligned (wgmma on sm_90); more experts than rows
CASES = [(1, 1, 8, 8), (3, 37, 19, 33), (4, 200, 64, 128), (8, 300, 136, 72), (16, 9, 24, 40), (6, 513, 264, 136)]


def make(e, t, n, k, dtype, device, sizes=None, w_kn=False, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(t, k, generator=g).to(device, dtype)
    w = torch.randn(e, k, n, generator=g) if w_kn else torch.randn(e, n, k, generator=g)
    w = (w / k ** 0.5).to(device, dtype)
    if w_kn:
        w = w.transpose(1, 2)
    sizes = group_sizes(e, t) if sizes is None else sizes
    offsets = torch.tensor(sizes).cumsum(0).to(device=device, dtype=torch.int32)
    dy = torch.randn(t, n, generator=g).to(device, dtype)
    return x, w, offsets, dy


def ref_grads(x, w, offsets, dy):
    x64 = x.detach().double().cpu().requires_grad_(True)
    w64 = w.detach().double().cpu().requires_grad_(True)
    y = grouped_ref(x64, w64, offsets.cpu())
    dx, dw = torch.autograd.grad([y], [x64, w64], [dy.double().cpu()])
    return y.detach(), dx, dw


def run(kf, x, w, offsets, dy):
    """y and the gradients of x and w; a transposed w stays a transposed view of its leaf."""
    x = x.detach().clone().requires_grad_(True)
    kn = not w.is_contiguous()
    leaf = (w.detach().transpose(1, 2) if kn else w.detach()).clone().requires_grad_(True)
    R.poison(dy.device)
    y = kf.grouped_mm(x, leaf.transpose(1, 2) if kn else leaf, offsets)
    y.backward(dy)
    return y, x.grad, leaf.grad.transpose(1, 2) if kn else leaf.grad


def check(kf, x, w, offsets, dy, dtype):
    y_ref, dx_ref, dw_ref = ref_grads(x, w, offsets, dy)
    y, dx, dw = run(kf, x, w, offsets, dy)
    assert y.shape == y_ref.shape and y.dtype == dtype and y.is_contiguous()
    R.assert_close(y, y_ref.to(dtype), dtype, grad=True, msg="y")
    R.assert_close(dx, dx_ref, dtype, grad=True, msg="dx")
    R.assert_close(dw, dw_ref, dtype, grad=True, msg="dw")


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("case", CASES, ids=lambda c: "e{}t{}n{}k{}".format(*c))
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("w_kn", [False, True], ids=["w_nk", "w_kn"])
def test_forward_backward(kf, device, case, dtype, w_kn):
    x, w, offsets, dy = make(*case, dtype, device, w_kn=w_kn)
    check(kf, x, w, offsets, dy, dtype)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("routing", ["empty_first", "one_expert", "tail", "unsorted", "clamped"])
def test_routing(kf, device, routing):
    """Empty experts, everything in one, rows of no expert (0 out, 0 dx), decreasing and out-of-range
    offsets (the clamp rule)."""
    e, t = 5, 160
    x, w, _, dy = make(e, t, 64, 64, torch.bfloat16, device, seed=3)
    ends = {"empty_first": [0, 40, 40, 100, 160], "one_expert": [0, 0, 160, 160, 160],
            "tail": [20, 50, 60, 90, 120], "unsorted": [50, 30, 100, 90, 160],
            "clamped": [-7, 40, 200, 10, 165]}[routing]
    offsets = torch.tensor(ends, dtype=torch.int32, device=device)
    check(kf, x, w, offsets, dy, torch.bfloat16)
    if routing == "tail":
        y = kf.grouped_mm(x, w, offsets)
        assert torch.count_nonzero(y[120:]) == 0


@pytest.mark.parametrize("device", DEVICES)
def test_strided_x_and_views(kf, device):
    """x a row-strided view (big[:, :K]), w a slice of a larger stack: no copies needed, same results."""
    e, t, n, k = 4, 100, 64, 64
    x, w, offsets, dy = make(e, t, n, k, torch.bfloat16, device)
    big = torch.zeros(t, k + 24, dtype=x.dtype, device=device)
    big[:, :k] = x
    wbig = torch.zeros(e + 2, n, k, dtype=w.dtype, device=device)
    wbig[1:e + 1] = w
    y = kf.grouped_mm(big[:, :k], wbig[1:e + 1], offsets)
    torch.testing.assert_close(y, kf.grouped_mm(x, w, offsets), rtol=0, atol=0)


@pytest.mark.parametrize("device", DEVICES)
def test_empty(kf, device):
    x, w, offsets, _ = make(3, 0, 16, 8, torch.bfloat16, device, sizes=[0, 0, 0])
    assert kf.grouped_mm(x, w, offsets).shape == (0, 16)
    dw = kf.grouped_mm_wgrad(torch.zeros(0, 16, dtype=x.dtype, device=device), x, offsets)
    assert dw.shape == (3, 16, 8) and torch.count_nonzero(dw) == 0
    x, w, offsets, _ = make(3, 10, 16, 0, torch.bfloat16, device)  # K = 0: out = 0
    y = kf.grouped_mm(x, w, offsets)
    assert y.shape == (10, 16) and torch.count_nonzero(y) == 0


@pytest.mark.cuda
def test_deterministic(kf):
    x, w, offsets, dy = make(8, 1000, 256, 128, torch.bfloat16, "cuda")
    a = [run(kf, x, w, offsets, dy) for _ in range(2)]
    for u, v in zip(*a):
        assert torch.equal(u, v)


@pytest.mark.cuda
@pytest.mark.parametrize("e,n,k", [(8, 1024, 512), (32, 384, 256)])
def test_against_torch_grouped_mm_and_loop(kf, e, n, k):
    """At a model-like shape the forward matches torch._grouped_mm (where it runs) and a loop of cuBLAS
    GEMMs as closely as they match each other, and the gradients match the loop's."""
    t = 2048
    x, w, offsets, dy = make(e, t, n, k, torch.bfloat16, "cuda")
    sizes = group_sizes(e, t)
    y = kf.grouped_mm(x, w, offsets)
    loop = torch.cat([x[a:b] @ w[i].t() for i, (a, b) in enumerate(zip([0] + offsets.tolist()[:-1], offsets.tolist()))])
    ref = grouped_ref(x.cpu(), w.cpu(), offsets.cpu()).cuda()
    err_kf = (y.double() - ref).abs().max().item()
    err_loop = (loop.double() - ref).abs().max().item()
    assert err_kf <= 1.5 * err_loop + 1e-3, (err_kf, err_loop)
    fn = getattr(torch, "_grouped_mm", None)
    if fn is not None:
        try:
            tg = fn(x, w.transpose(1, 2), offs=offsets)
        except RuntimeError:  # not on this GPU / dtype
            tg = None
        if tg is not None:
            err_t = (tg.double() - ref).abs().max().item()
            assert err_kf <= 1.5 * err_t + 1e-3, (err_kf, err_t)
    assert sum(sizes) == t


@pytest.mark.cuda
def test_plan_on_hopper(kf):
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("the wgmma kernel runs on sm_90")
    x, w, offsets, _ = make(8, 512, 256, 128, torch.bfloat16, "cuda")
    kf.grouped_mm(x, w, offsets)
    assert kf.last_plan().startswith("grouped_mm_wgmma rows/w-row"), kf.last_plan()
    kf.grouped_mm(x, w.transpose(1, 2).contiguous().transpose(1, 2), offsets)
    assert kf.last_plan().startswith("grouped_mm_wgmma rows/w-col"), kf.last_plan()
    kf.grouped_mm(x[:, :127], w[:, :, :127], offsets)  # K not a multiple of 8
    assert kf.last_plan().startswith("grouped_mm_mma"), kf.last_plan()


@pytest.mark.cuda
def test_cuda_graph_replays_new_routing(kf):
    """The group sizes stay on the device: a captured call replays correctly with new offsets."""
    x, w, offsets, _ = make(4, 256, 128, 64, torch.bfloat16, "cuda")
    static_off = offsets.clone()
    kf.grouped_mm(x, w, static_off)  # warm-up (plans, workspace)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = kf.grouped_mm(x, w, static_off)
    for ends in ([64, 128, 192, 256], [0, 0, 10, 256], [200, 210, 220, 230]):
        static_off.copy_(torch.tensor(ends, dtype=torch.int32))
        graph.replay()
        torch.testing.assert_close(out, kf.grouped_mm(x, w, static_off), rtol=0, atol=0)


@pytest.mark.parametrize("device", DEVICES)
def test_compile_fullgraph(kf, device):
    x, w, offsets, dy = make(4, 64, 32, 16, torch.bfloat16, device)
    f = torch.compile(lambda x, w, o: kf.grouped_mm(x, w, o) * 2.0, fullgraph=True)
    xr, wr = x.clone().requires_grad_(True), w.clone().requires_grad_(True)
    y = f(xr, wr, offsets)
    y.backward(dy)
    y_ref, dx_ref, dw_ref = ref_grads(x, w, offsets, dy * 2.0)
    R.assert_close(y, 2.0 * y_ref.to(y.dtype), torch.bfloat16, grad=True, msg="y")
    R.assert_close(xr.grad, dx_ref, torch.bfloat16, grad=True, msg="dx")
    R.assert_close(wr.grad, dw_ref, torch.bfloat16, grad=True, msg="dw")


@pytest.mark.parametrize("device", DEVICES)
def test_errors(kf, device):
    x, w, offsets, _ = make(4, 64, 32, 16, torch.bfloat16, device)
    with pytest.raises(RuntimeError, match=r"w must have shape \[E, N, K\] with E = 4 \(offsets' length\) and K = 16"):
        kf.grouped_mm(x, w[:, :, :8], offsets)
    with pytest.raises(RuntimeError, match=r"offsets must be int32, got int64"):
        kf.grouped_mm(x, w, offsets.long())
    with pytest.raises(RuntimeError, match=r"w must have x's dtype bfloat16, got float16"):
        kf.grouped_mm(x, w.half(), offsets)
    with pytest.raises(RuntimeError, match=r"x must have 2 dimensions"):
        kf.grouped_mm(x[None], w, offsets)
    with pytest.raises(RuntimeError, match=r"offsets must have shape \[E\]"):
        kf.grouped_mm(x, w, offsets[:0])
