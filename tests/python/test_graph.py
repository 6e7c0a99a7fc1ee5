"""The graph ops (segment_sum / mean / max, gather_scatter, scatter_add), forward and backward, against
the float64 references of kernelforge.specs.graph (torch's scatter_reduce in float64; max gradients
routed to the first maximum), on CPU (the C++ float64 reference) and CUDA (the kernels).

Graphs are power-law (node 0 takes ~E / N^(1/3) edges, many nodes none), edges in random order,
int64 and int32 indices; outputs are checked elementwise with atol scaled by sqrt(in-degree) (float32
sums of many terms), NaN never passes, the CUDA results must be bit-identical run to run, and
torch.compile(fullgraph=True) must trace every op without a graph break."""

from __future__ import annotations

import math

import pytest
import torch

import norm_ref as R
from norm_ref import DEVICES, DTYPES

from kernelforge.specs import TOL
from kernelforge.specs.graph import GraphShape, gather_scatter_ref, graph, segment_ref

REDUCES = ["sum", "mean", "max"]
SEGMENT_FN = {"sum": "segment_sum", "mean": "segment_mean", "max": "segment_max"}


def assert_rows_close(actual, expected, dtype, deg, *, grad=False, msg=""):
    """|actual - expected| <= tol |expected| + tol sqrt(deg_row) * scale per row, NaN never passes.
    deg: the number of terms summed into each row (float32 accumulation error grows with sqrt(deg)).
    scale: 1 for outputs (inputs are N(0, 1)), max|expected| for gradients."""
    t = TOL[dtype]
    tol = t.grad if grad else t.out
    assert actual.shape == expected.shape, f"{msg}: shape {tuple(actual.shape)} != {tuple(expected.shape)}"
    a = actual.detach().double().cpu().reshape(actual.shape[0], -1) if actual.numel() else actual.double().cpu()
    e = expected.detach().double().cpu().reshape(a.shape)
    if a.numel() == 0:
        return
    assert torch.isfinite(a).all(), f"{msg}: non-finite values in the result"
    scale = max(1.0, e.abs().max().item()) if grad else 1.0
    atol = tol * scale * 4 * deg.double().clamp(min=1).sqrt().cpu().reshape(-1, 1)
    bad = (a - e).abs() > tol * e.abs() + atol
    assert not bad.any(), (f"{msg}: {int(bad.sum())} of {a.numel()} elements differ; first at "
                           f"{tuple(bad.nonzero()[0].tolist())}: got {a[bad][0].item()}, want {e[bad][0].item()}")


def make_graph(shape, device, index_dtype=torch.int64):
    g = graph(shape, device)
    return {k: v.to(index_dtype) if k in ("edge_src", "edge_dst", "rowptr") else v for k, v in g.items()}


SHAPES = [GraphShape(1, 1, 1), GraphShape(7, 40, 7), GraphShape(50, 3001, 33), GraphShape(3, 0, 8),
          GraphShape(64, 5000, 128), GraphShape(17, 300, 1024)]
CUDA_SHAPES = [GraphShape(1000, 300_000, 64)]  # node 0: ~30k edges over ~470 tiles
DEVICE_SHAPES = [pytest.param("cpu", s, id=f"cpu-{s}") for s in SHAPES] + [
    pytest.param("cuda", s, id=f"cuda-{s}", marks=pytest.mark.cuda) for s in SHAPES + CUDA_SHAPES]


# ---- segment reductions ----------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("device,shape", DEVICE_SHAPES)
@pytest.mark.parametrize("reduce", REDUCES)
@pytest.mark.parametrize("index_dtype", [torch.int64, torch.int32], ids=["i64", "i32"])
def test_segment(kf, reduce, device, shape, dtype, index_dtype):
    g = make_graph(shape, device, index_dtype)
    x = R.rand((shape.e, shape.f), dtype, device).requires_grad_()
    dy = R.rand((shape.n, shape.f), dtype, device)
    x64 = x.detach().double().cpu().requires_grad_()
    rp64 = g["rowptr"].long().cpu()
    want = segment_ref(x64, rp64, reduce)
    (want_dx,) = torch.autograd.grad(want, x64, dy.double().cpu())
    R.poison(device)
    y = getattr(kf, SEGMENT_FN[reduce])(x, g["rowptr"])
    assert y.dtype == dtype and y.device == x.device and y.is_contiguous()
    deg = rp64.diff()
    assert_rows_close(y, want.to(dtype), dtype, deg, msg=f"segment_{reduce}")
    (dx,) = torch.autograd.grad(y, x, dy)
    assert_rows_close(dx, want_dx, dtype, torch.ones(shape.e), grad=True, msg=f"segment_{reduce} dx")
    if device == "cuda":  # deterministic: bit-identical reruns
        y2 = getattr(kf, SEGMENT_FN[reduce])(x, g["rowptr"])
        (dx2,) = torch.autograd.grad(y2, x, dy)
        assert torch.equal(y, y2) and torch.equal(dx, dx2)


# ---- gather_scatter --------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("device,shape", DEVICE_SHAPES)
@pytest.mark.parametrize("reduce", REDUCES)
@pytest.mark.parametrize("weighted", [False, True], ids=["plain", "weight"])
def test_gather_scatter(kf, reduce, weighted, device, shape, dtype):
    index_dtype = torch.int32 if shape.e % 2 else torch.int64
    g = make_graph(shape, device, index_dtype)
    n = shape.n
    x = R.rand((n, shape.f), dtype, device).requires_grad_()
    w = None
    if weighted:  # magnitudes 0.5 / 1 / 2: exact products, so the maxima match the float64 reference
        mag = torch.pow(2.0, torch.randint(-1, 2, (shape.e,), device=device).float())
        w = (mag * torch.where(torch.rand(shape.e, device=device) < 0.5, -1.0, 1.0)).to(dtype).requires_grad_()
    dy = R.rand((n, shape.f), dtype, device)
    src, dst = g["edge_src"], g["edge_dst"]
    x64 = x.detach().double().cpu().requires_grad_()
    w64 = w.detach().double().cpu().requires_grad_() if weighted else None
    want = gather_scatter_ref(x64, src.long().cpu(), dst.long().cpu(), n, reduce, w64)
    leaves = [x64] + ([w64] if weighted else [])
    want_grads = torch.autograd.grad(want, leaves, dy.double().cpu())
    R.poison(device)
    y = kf.gather_scatter(x, src, dst, n, reduce, w)
    assert y.dtype == dtype and y.shape == (n, shape.f)
    deg = torch.bincount(dst.long().cpu(), minlength=n)
    assert_rows_close(y, want.to(dtype), dtype, deg * (2 if weighted else 1), msg=f"gather_scatter {reduce}")
    grads = torch.autograd.grad(y, [x] + ([w] if weighted else []), dy)
    out_deg = torch.bincount(src.long().cpu(), minlength=n)
    assert_rows_close(grads[0], want_grads[0], dtype, out_deg * 2, grad=True, msg=f"gather_scatter {reduce} dx")
    if weighted:
        assert_rows_close(grads[1], want_grads[1], dtype, torch.full((shape.e,), float(shape.f)), grad=True,
                          msg=f"gather_scatter {reduce} dw")
    if device == "cuda":
        y2 = kf.gather_scatter(x, src, dst, n, reduce, w)
        grads2 = torch.autograd.grad(y2, [x] + ([w] if weighted else []), dy)
        assert torch.equal(y, y2) and all(torch.equal(a, b) for a, b in zip(grads, grads2))


# ---- scatter_add -----------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("device,shape", DEVICE_SHAPES)
def test_scatter_add(kf, device, shape, dtype):
    g = make_graph(shape, device)
    src = R.rand((shape.e, 2, shape.f), dtype, device).requires_grad_()  # trailing dims are features
    dy = R.rand((shape.n, 2, shape.f), dtype, device)
    s64 = src.detach().double().cpu().requires_grad_()
    want = torch.zeros((shape.n, 2, shape.f), dtype=torch.float64).index_add(0, g["edge_dst"].cpu(), s64)
    (want_ds,) = torch.autograd.grad(want, s64, dy.double().cpu())
    R.poison(device)
    y = kf.scatter_add(src, g["edge_dst"], shape.n)
    deg = torch.bincount(g["edge_dst"].cpu(), minlength=shape.n)
    assert_rows_close(y, want.to(dtype), dtype, deg, msg="scatter_add")
    (ds,) = torch.autograd.grad(y, src, dy)
    assert torch.equal(ds.cpu(), want_ds.to(dtype)), "scatter_add backward is a gather: exact"


# ---- layouts, empty inputs ---------------------------------------------------------------------------
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("layout", ["rows_strided", "rows_strided_odd", "unaligned"])
def test_layouts_match_contiguous(kf, device, layout):
    shape = GraphShape(40, 2000, 64)
    g = make_graph(shape, device)
    for dtype in (torch.bfloat16, torch.float32):
        x = R.rand((shape.e, shape.f), dtype, device)
        xv = R.with_layout(x, layout)
        assert torch.equal(kf.segment_max(xv, g["rowptr"]), kf.segment_max(x, g["rowptr"]))
        nx = R.rand((shape.n, shape.f), dtype, device)
        nv = R.with_layout(nx, layout)
        a = kf.gather_scatter(nv, g["edge_src"], g["edge_dst"], shape.n, "mean")
        b = kf.gather_scatter(nx, g["edge_src"], g["edge_dst"], shape.n, "mean")
        assert torch.equal(a, b), layout


@pytest.mark.parametrize("device", DEVICES)
def test_empty(kf, device):
    x = torch.randn(0, 8, device=device)
    rp = torch.zeros(4, dtype=torch.long, device=device)
    for fn in (kf.segment_sum, kf.segment_mean, kf.segment_max):
        y = fn(x, rp)
        assert y.shape == (3, 8) and torch.equal(y, torch.zeros_like(y))
    e = torch.zeros(0, dtype=torch.long, device=device)
    nx = torch.randn(5, 8, device=device, requires_grad=True)
    y = kf.gather_scatter(nx, e, e, 3, "max")
    assert torch.equal(y, torch.zeros(3, 8, device=device))
    y.sum().backward()
    assert torch.equal(nx.grad, torch.zeros_like(nx))
    assert kf.scatter_add(x, e, 0).shape == (0, 8)
    assert kf.gather_scatter(nx, e, e, 0).shape == (0, 8)


@pytest.mark.cuda
def test_long_segment_load_balanced(kf):
    """A 200k-message segment (spread over tiles, combined in order) next to tiny ones, bit-identical
    across runs and equal to the float64 sum within float32 accumulation error."""
    lens = torch.tensor([200_000, 0, 3, 1, 0, 50_000, 7])
    rp = torch.cat([torch.zeros(1, dtype=torch.long), lens.cumsum(0)]).cuda()
    x = torch.randn(int(lens.sum()), 256, device="cuda")
    y = kf.segment_sum(x, rp)
    assert torch.equal(y, kf.segment_sum(x, rp))
    want = segment_ref(x.double().cpu(), rp.cpu(), "sum")
    assert_rows_close(y, want.float(), torch.float32, lens, msg="long segment")
    ym = kf.segment_max(x, rp)
    assert torch.equal(ym.cpu(), segment_ref(x.cpu(), rp.cpu(), "max"))


# ---- errors --------------------------------------------------------------------------------------
def test_errors(kf):
    x = torch.randn(10, 4)
    src, dst = torch.randint(0, 10, (20,)), torch.randint(0, 5, (20,))
    with pytest.raises(ValueError, match="edge_src and edge_dst must have the same dtype"):
        kf.gather_scatter(x, src, dst.int(), 5)
    with pytest.raises(ValueError, match="reduce must be 'sum', 'mean' or 'max', got 'min'"):
        kf.gather_scatter(x, src, dst, 5, "min")
    with pytest.raises(RuntimeError, match=r"edge_dst values must lie in \[0, 3\)"):
        kf.gather_scatter(x, src, dst, 3)
    with pytest.raises(RuntimeError, match=r"edge_weight must have shape \[20\]"):
        kf.gather_scatter(x, src, dst, 5, "sum", torch.randn(7))
    with pytest.raises(RuntimeError, match="edge_weight must have the same dtype as x"):
        kf.gather_scatter(x, src, dst, 5, "sum", torch.randn(20, dtype=torch.float64))
    with pytest.raises(RuntimeError, match=r"rowptr\[-1\] must equal the number of positions \(10\)"):
        kf.segment_sum(x, torch.tensor([0, 3, 9]))
    with pytest.raises(RuntimeError, match="rowptr must be non-decreasing"):
        kf.segment_sum(x, torch.tensor([0, 6, 3, 10]))
    with pytest.raises(ValueError, match="rowptr must be an int32 or int64 tensor"):
        kf.segment_sum(x, torch.tensor([0.0, 10.0]))
    with pytest.raises(ValueError, match=r"index must have one entry per row of src \(10\)"):
        kf.scatter_add(x, torch.tensor([0, 1]), 3)
    with pytest.raises(RuntimeError, match=r"index values must lie in \[0, 2\)"):
        kf.scatter_add(x, torch.arange(10), 2)


# ---- torch.compile -------------------------------------------------------------------------------
COMPILE_CASES = [pytest.param("cpu", torch.float32, "aot_eager", id="cpu-aot_eager")] + [
    pytest.param("cuda", torch.bfloat16, "inductor", id="cuda-inductor", marks=pytest.mark.cuda)]


@pytest.mark.parametrize("device,dtype,backend", COMPILE_CASES)
def test_compile_fullgraph(kf, device, dtype, backend):
    shape = GraphShape(30, 400, 16)
    g = make_graph(shape, device)
    x = R.rand((shape.n, shape.f), dtype, device).requires_grad_()
    w = R.rand((shape.e,), dtype, device).requires_grad_()

    def layer(x, w):
        h = kf.gather_scatter(x, g["edge_src"], g["edge_dst"], shape.n, "mean", w)
        m = kf.segment_max(x.index_select(0, g["edge_src"][g["perm"]]), g["rowptr"])
        s = kf.scatter_add(x.index_select(0, g["edge_src"]) * 2.0, g["edge_dst"], shape.n)
        return ((h + m + s).float() * 0.01).sin().mean()

    torch._dynamo.reset()
    compiled = torch.compile(layer, backend=backend, fullgraph=True)
    got = compiled(x, w)
    gx, gw = torch.autograd.grad(got, [x, w])
    want = layer(x, w)
    wx, ww = torch.autograd.grad(want, [x, w])
    tol = TOL[dtype].grad
    torch.testing.assert_close(got, want, rtol=tol, atol=tol)
    torch.testing.assert_close(gx.float(), wx.float(), rtol=tol, atol=tol * max(1.0, wx.abs().max().item()))
    torch.testing.assert_close(gw.float(), ww.float(), rtol=tol, atol=tol * max(1.0, ww.abs().max().item()))
    # only the edge weights differentiated: the backward op returns an empty dx (as its fake does)
    only_w = torch.compile(lambda w: kf.gather_scatter(x.detach(), g["edge_src"], g["edge_dst"], shape.n, "max",
                                                       w).float().sum(), backend=backend, fullgraph=True)
    (gw2,) = torch.autograd.grad(only_w(w), [w])
    (ww2,) = torch.autograd.grad(kf.gather_scatter(x.detach(), g["edge_src"], g["edge_dst"], shape.n, "max",
                                                   w).float().sum(), [w])
    torch.testing.assert_close(gw2.float(), ww2.float(), rtol=tol, atol=tol * max(1.0, ww2.abs().max().item()))


# ---- PyG (the GPU machine has torch_geometric) ----------------------------------------------------
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("reduce", REDUCES)
def test_matches_pyg_scatter(kf, device, reduce):
    pyg = pytest.importorskip("torch_geometric.utils")
    shape = GraphShape(200, 5000, 32)
    g = make_graph(shape, device)
    x = R.rand((shape.n, shape.f), torch.float32, device)
    want = pyg.scatter(x.index_select(0, g["edge_src"]), g["edge_dst"], dim=0, dim_size=shape.n, reduce=reduce)
    got = kf.gather_scatter(x, g["edge_src"], g["edge_dst"], shape.n, reduce)
    deg = torch.bincount(g["edge_dst"].cpu(), minlength=shape.n)
    assert_rows_close(got, want, torch.float32, deg, msg=f"PyG scatter {reduce}")
    assert math.isfinite(got.sum().item())
