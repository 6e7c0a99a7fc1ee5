"""fused_linear_rowsum (= F.linear(x, w, bias).sum(-1)) forward and backward against the float64
definition of kernelforge.specs.fused_linear_rowsum, on CPU (the C++ reference) and CUDA (the kernels):
shapes per code path, row-strided / unaligned / strided-bias layouts, empty sizes, each gradient alone,
determinism, errors, torch.compile, CUDA graphs and the nn module."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import norm_ref as R
from norm_ref import DEVICES, DTYPES

from kernelforge.specs.fused_linear_rowsum import fused_linear_rowsum_ref

f64 = torch.float64
# float32 accumulation of a sum of many terms: bound by 1e-5 of the sum of the terms' magnitudes
# (the same bound as tests/cpp/test_fused_linear_rowsum_util.h)
ACCUM = 1e-5


def make(lead, k, o, dtype, device, bias=True, scale_w=1.0):
    x = R.rand((*lead, k), dtype, device)
    w = R.rand((o, k), dtype, device, scale=scale_w)
    b = R.rand((o,), dtype, device) if bias else None
    return x, w, b


def assert_y_close(y, x, w, b, dtype, msg=""):
    """y within one rounding of the dtype plus the float32 accumulation bound of the float64 definition."""
    e = fused_linear_rowsum_ref(x.detach().cpu(), w.detach().cpu(), None if b is None else b.detach().cpu())
    assert y.dtype == dtype and y.shape == e.shape, f"{msg}: {y.dtype} {tuple(y.shape)} vs {dtype} {tuple(e.shape)}"
    xa, wa = x.detach().cpu().double().abs(), w.detach().cpu().double().abs()
    mag = xa @ wa.sum(0) + (0.0 if b is None else b.detach().cpu().double().abs().sum())
    tol = R.TOL[dtype]
    a = y.detach().cpu().double()
    bound = tol * e.abs() + tol + ACCUM * mag
    err = (a - e).abs()
    ok = torch.isfinite(a) & (err <= bound)
    assert bool(ok.all()), f"{msg}: {(~ok).sum().item()} of {a.numel()} differ; worst err {err.max().item():.3g}"


def grads(fn, inputs, dy):
    leaves = [t.detach().clone().requires_grad_(True) if t is not None else None for t in inputs]
    y = fn(*leaves)
    gs = torch.autograd.grad(y, [t for t in leaves if t is not None], dy)
    return y.detach(), list(gs)


def check(kf, x, w, b, dtype, msg=""):
    R.poison(x.device)
    dy = R.rand(x.shape[:-1], dtype, x.device)
    y, g = grads(kf.fused_linear_rowsum, (x, w, b), dy)
    assert y.device == x.device
    assert_y_close(y, x, w, b, dtype, msg)
    _, e = grads(fused_linear_rowsum_ref, tuple(None if t is None else t.detach().cpu().double() for t in (x, w, b)),
                 dy.cpu().double())
    for name, a, ex in zip(("dx", "dweight", "dbias"), g, e):
        assert a.dtype == dtype and a.device == x.device, f"{msg} {name}: {a.dtype} {a.device}"
        R.assert_close(a, ex, dtype, grad=True, msg=f"{msg} {name}")
    return y, g


# (leading dims of x, K, O): ones, odd / prime sizes, one row and a long weight, K past 4096, a 3-D x,
# several row chunks of x
SHAPES = [((1,), 1, 1), ((7,), 127, 5), ((1,), 4096, 300), ((3,), 4097, 7), ((2, 3), 1000, 33), ((257,), 520, 17)]
HUGE_SHAPES = [((4097,), 1023, 513), ((2,), 65537, 2), ((1100,), 256, 4100)]  # CUDA only: keeps the CPU suite fast
DEVICE_SHAPES = [pytest.param("cpu", s, id=f"cpu-{s}") for s in SHAPES] + [
    pytest.param("cuda", s, id=f"cuda-{s}", marks=pytest.mark.cuda) for s in SHAPES + HUGE_SHAPES
]


@pytest.mark.parametrize("bias", [True, False], ids=["bias", "nobias"])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("device,shape", DEVICE_SHAPES)
def test_forward_backward(kf, device, shape, dtype, bias):
    lead, k, o = shape
    x, w, b = make(lead, k, o, dtype, device, bias)
    check(kf, x, w, b, dtype, f"{shape}")


def _views(x, w, b, layout):
    """The same values stored as `layout`: rows of a wider buffer, a base pointer one element off, or a
    bias with stride 2."""
    if layout == "rows_strided":
        return R.with_layout(x, "rows_strided"), R.with_layout(w, "rows_strided"), b
    if layout == "unaligned":
        return R.with_layout(x, "unaligned"), R.with_layout(w, "unaligned"), R.with_layout(b, "unaligned")
    if layout == "odd_stride":
        return R.with_layout(x, "rows_strided_odd"), R.with_layout(w, "rows_strided_odd"), b
    big = torch.empty(2 * b.shape[0], dtype=b.dtype, device=b.device)
    big[::2] = b
    return x, w, big[::2]


@pytest.mark.parametrize("layout", ["rows_strided", "unaligned", "odd_stride", "bias_strided"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=str)
@pytest.mark.parametrize("device", DEVICES)
def test_layouts(kf, device, dtype, layout):
    x, w, b = make((33,), 1024, 40, dtype, device)
    xv, wv, bv = _views(x, w, b, layout)
    assert torch.equal(xv, x) and torch.equal(wv, w) and torch.equal(bv, b)
    check(kf, xv, wv, bv, dtype, layout)


@pytest.mark.parametrize("device", DEVICES)
def test_empty_sizes(kf, device):
    dt = torch.float32
    # no rows: y is empty, dweight = 0, dbias = 0
    x, w, b = make((0,), 16, 5, dt, device)
    y, (dx, dw, db) = grads(kf.fused_linear_rowsum, (x, w, b), torch.empty(0, device=device))
    assert y.shape == (0,) and dx.shape == (0, 16)
    assert torch.equal(dw, torch.zeros_like(w)) and torch.equal(db, torch.zeros_like(b))
    # K = 0: y = sum(bias)
    x, w, b = make((4,), 0, 3, dt, device)
    y = kf.fused_linear_rowsum(x, w, b)
    torch.testing.assert_close(y, b.sum().expand(4), rtol=1e-6, atol=1e-6)
    # O = 0: y = 0
    x, w, _ = make((4,), 8, 0, dt, device)
    assert torch.equal(kf.fused_linear_rowsum(x, w, torch.empty(0, device=device)), torch.zeros(4, device=device))


@pytest.mark.parametrize("wants", ["x", "w", "bias", "x+bias"])
@pytest.mark.parametrize("device", DEVICES)
def test_each_gradient_alone(kf, device, wants):
    dt = torch.float32
    x, w, b = make((5, 3), 64, 9, dt, device)
    names = wants.split("+")
    leaves = {"x": x.clone().requires_grad_("x" in names), "w": w.clone().requires_grad_("w" in names),
              "bias": b.clone().requires_grad_("bias" in names)}
    y = kf.fused_linear_rowsum(leaves["x"], leaves["w"], leaves["bias"])
    dy = R.rand(y.shape, dt, device)
    y.backward(dy)
    ref = {k: v.detach().cpu().double().requires_grad_(True) for k, v in leaves.items()}
    fused_linear_rowsum_ref(ref["x"], ref["w"], ref["bias"]).backward(dy.cpu().double())
    for k, v in leaves.items():
        if k in names:
            R.assert_close(v.grad, ref[k].grad, dt, grad=True, msg=f"d{k}")
        else:
            assert v.grad is None, f"{k} got a gradient although it does not require one"


def test_sum_of_rows_gradient(kf):
    """y.sum() sends an expanded (stride 0) gradient; [B, S].sum(-1) a [B, 1]-broadcast one (strides (1, 0))."""
    x, w, b = make((3, 4), 32, 6, torch.float64, "cpu")
    for reduce in (lambda y: y.sum(), lambda y: (y.sum(-1) * torch.arange(3.0, dtype=f64)).sum()):
        leaves = [t.clone().requires_grad_(True) for t in (x, w, b)]
        reduce(kf.fused_linear_rowsum(*leaves)).backward()
        refs = [t.clone().requires_grad_(True) for t in (x, w, b)]
        reduce(F.linear(*refs).sum(-1)).backward()
        for a, e in zip(leaves, refs):
            torch.testing.assert_close(a.grad, e.grad, rtol=1e-12, atol=1e-12)


def test_gradcheck_float64(kf):
    x, w, b = (t.requires_grad_(True) for t in make((4,), 6, 5, torch.float64, "cpu"))
    assert torch.autograd.gradcheck(kf.fused_linear_rowsum, (x, w, b))


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_deterministic(kf, dtype):
    x, w, b = make((4097,), 1023, 513, dtype, "cuda")
    dy = R.rand((4097,), dtype, "cuda")
    y1, g1 = grads(kf.fused_linear_rowsum, (x, w, b), dy)
    y2, g2 = grads(kf.fused_linear_rowsum, (x, w, b), dy)
    assert torch.equal(y1, y2)
    for a, c in zip(g1, g2):
        assert torch.equal(a, c)


@pytest.mark.cuda
def test_last_plan(kf):
    x, w, b = make((64,), 4096, 128, torch.bfloat16, "cuda")
    kf.fused_linear_rowsum(x, w, b)
    assert kf.last_plan().startswith("flrs_fwd vec=8"), kf.last_plan()


@pytest.mark.parametrize("device", DEVICES)
def test_errors(kf, device):
    x, w, b = make((4,), 8, 5, torch.float32, device)
    with pytest.raises(RuntimeError, match=r"fused_linear_rowsum: weight must have shape \[O, 8\].*got \[5, 7\]"):
        kf.fused_linear_rowsum(x, w[:, :7].contiguous(), b)
    with pytest.raises(RuntimeError, match=r"bias must have shape \[5\] \(out_features = weight.shape\[0\]\), "
                                           r"got \[4\]"):
        kf.fused_linear_rowsum(x, w, b[:4])
    with pytest.raises(RuntimeError, match=r"weight must have the same dtype as x \(float32\), got bfloat16"):
        kf.fused_linear_rowsum(x, w.bfloat16(), b)
    with pytest.raises(RuntimeError, match=r"x must have between 1 and 8 dimensions"):
        kf.fused_linear_rowsum(x[0, 0], w, b)
    with pytest.raises(RuntimeError, match=r"x must be a (float32/float16/bfloat16|floating-point) tensor, got int64"):
        kf.fused_linear_rowsum(x.long(), w, b)


# ---- torch.compile, CUDA graphs, nn -------------------------------------------------------------------
COMPILE_CASES = [pytest.param("cpu", torch.float32, "aot_eager", id="cpu-aot_eager"),
                 pytest.param("cuda", torch.bfloat16, "inductor", id="cuda-inductor", marks=pytest.mark.cuda)]


@pytest.mark.parametrize("device,dtype,backend", COMPILE_CASES)
def test_compile_fullgraph_no_recompile(kf, device, dtype, backend):
    torch._dynamo.reset()

    def fn(x, w, b):
        return kf.fused_linear_rowsum(x * 0.5, w, b).float() * 2.0

    compiled = torch.compile(fn, fullgraph=True, backend=backend, dynamic=False)

    def run(f, args):
        leaves = [t.detach().clone().requires_grad_(True) for t in args]
        y = f(*leaves)
        y.backward(torch.ones_like(y))
        return y.detach(), [t.grad for t in leaves]

    for call in range(2):  # the second call (new data, same shapes) must reuse the compiled graph
        args = make((3, 5), 256, 48, dtype, device)
        if call == 0:
            y_c, g_c = run(compiled, args)
        else:
            with torch.compiler.set_stance("fail_on_recompile"):
                y_c, g_c = run(compiled, args)
        y_e, g_e = run(fn, args)
        tol = R.TOL[dtype]
        torch.testing.assert_close(y_c, y_e, rtol=tol, atol=tol * max(1.0, y_e.abs().max().item()))
        for a, e in zip(g_c, g_e):
            R.assert_close(a, e.double(), dtype, grad=True, msg="compiled grad vs eager")


@pytest.mark.cuda
def test_cuda_graph(kf):
    x, w, b = make((64,), 2048, 96, torch.bfloat16, "cuda")
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(2):
            kf.fused_linear_rowsum(x, w, b)
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        y = kf.fused_linear_rowsum(x, w, b)
    for _ in range(2):
        for t, v in zip((x, w, b), make((64,), 2048, 96, torch.bfloat16, "cuda")):
            t.copy_(v)
        g.replay()
        assert torch.equal(y, kf.fused_linear_rowsum(x, w, b))


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("device", DEVICES)
def test_nn_module(kf, device, bias):
    lin = torch.nn.Linear(64, 24, bias=bias, device=device)
    mod = kf.nn.FusedLinearRowSum(64, 24, bias=bias, device=device)
    mod.load_state_dict(lin.state_dict())  # same keys and shapes as nn.Linear
    assert "in_features=64, out_features=24" in repr(mod)
    x = R.rand((2, 5, 64), torch.float32, device).requires_grad_(True)
    y = mod(x)
    assert y.shape == (2, 5)
    assert_y_close(y, x, mod.weight, mod.bias, torch.float32, "module")
    y.sum().backward()
    assert mod.weight.grad is not None and x.grad is not None
    assert (mod.bias is not None and mod.bias.grad is not None) == bias
    fresh = kf.nn.FusedLinearRowSum(64, 24, bias=bias)  # nn.Linear's initialization: U(-1/8, 1/8)
    assert fresh.weight.abs().max().item() <= 1 / 8 and fresh.weight.std().item() > 0
