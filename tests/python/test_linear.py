"""kernelforge.linear (nn.Linear's y = x w^T + bias) against a float64 reference, x.double() @
w.double().T + bias.

CPU tensors run the op's float64 C++ reference (any M); CUDA tensors (float16 / bfloat16) run the
skinny kernel for M <= 16 rows and the GEMM family (kernelforge.gemm, cuBLASLt) above. Outputs are
compared with the reference rounded to the dtype: |got - want| <= tol (|want| + scale), tol =
TOL[dtype].out (gradients: .grad), scale = sqrt(sum_k (x_k w_k)^2), the size of a sum of K terms of
random sign (the float32 accumulation's error grows with it, and a result that cancels to ~0 is judged
against it rather than against itself). The outputs' allocator blocks are pre-filled with NaN.
Gradients (torch's GEMMs) against float64 autograd.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from kernelforge.specs import TOL
from kernelforge.specs._spec import poison

f64 = torch.float64
CPU = pytest.param("cpu", f64, id="cpu-float64")
CPU_BF16 = pytest.param("cpu", torch.bfloat16, id="cpu-bfloat16")
CUDA = [pytest.param("cuda", dt, id=f"cuda-{str(dt)[6:]}") for dt in (torch.bfloat16, torch.float16)]
DEVICES = [CPU, CPU_BF16] + CUDA
ERR = (RuntimeError, ValueError)


# ---- the reference and the comparison ----------------------------------------------------------------


def make(m, n, k, dtype, device, bias=True, lead=None):
    """x ~ N(0, 1) [m, k] (or lead + [k]), w ~ N(0, 1 / k) [n, k] (nn.Linear's scale), bias ~ N(0, 1) [n]."""
    x = torch.randn(*(lead if lead is not None else (m,)), k, device=device).to(dtype)
    w = (torch.randn(n, k, device=device) / max(k, 1) ** 0.5).to(dtype)
    b = torch.randn(n, device=device).to(dtype) if bias else None
    return x, w, b


def reference(x, w, b=None):
    """(y, scale) in float64 on the CPU: y = x w^T + b, scale = sqrt((x^2) (w^2)^T)."""
    x64, w64 = x.detach().to("cpu", f64), w.detach().to("cpu", f64)
    y = x64 @ w64.t()
    if b is not None:
        y = y + b.detach().to("cpu", f64)
    return y, ((x64 * x64) @ (w64 * w64).t()).sqrt()


def close(got, want64, scale, dtype, what, kind="out"):
    """|got - want| <= tol (|want| + scale), want the reference rounded to got's dtype; NaN never passes."""
    tol = getattr(TOL[dtype], kind)
    want = want64.to(got.dtype).to(f64)
    g = got.detach().to("cpu", f64)
    assert g.shape == want.shape, f"{what}: shape {tuple(g.shape)} != {tuple(want.shape)}"
    assert torch.isfinite(g).all(), f"{what}: non-finite values"
    if g.numel() == 0:
        return
    excess = ((g - want).abs() - tol * (want.abs() + scale.expand_as(want))).max().item()
    err = ((g - want).abs() / (want.abs() + scale).clamp_min(1e-300)).max().item()
    assert excess <= 0, f"{what}: max error {err:.3e} (relative to |want| + scale) > {tol:.0e}"


def run(kf, x, w, b, shape):
    """kf.linear with the output's blocks poisoned; y has x's dtype and device, contiguous."""
    poison([shape], x.dtype, x.device)
    y = kf.linear(x, w, b)
    assert y.shape == shape and y.dtype == x.dtype and y.device == x.device and y.is_contiguous()
    return y


def check(kf, x, w, b, dtype, what=""):
    shape = (*x.shape[:-1], w.shape[0])
    y = run(kf, x, w, b, shape)
    want, scale = reference(x, w, b)
    close(y, want, scale, dtype, what or f"x {tuple(x.shape)} w {tuple(w.shape)} bias={b is not None}")
    return y


# ---- values ------------------------------------------------------------------------------------------

M_ROWS = [1, 2, 7, 16]
# (N, K): one column, K = 1 and 7 (no 16-byte loads), N around a 128-column tile, K past a 4096 split
# (4104 = 4096 + 8, 5000 not a multiple of 8), Llama's 4096 / 14336
CUDA_NK = [(1, 1), (3, 7), (127, 64), (128, 4096), (4096, 4104), (1, 5000), (4096, 5000), (3, 4096), (14336, 4096)]
CPU_NK = [(1, 1), (3, 7), (127, 64), (128, 100)]


def nk_id(nk) -> str:
    return f"n{nk[0]}k{nk[1]}"


@pytest.mark.parametrize("bias", [False, True], ids=["nobias", "bias"])
@pytest.mark.parametrize("nk", CUDA_NK, ids=nk_id)
@pytest.mark.parametrize("m", M_ROWS)
@pytest.mark.parametrize("device,dtype", CUDA)
def test_values_cuda(kf, device, dtype, m, nk, bias):
    x, w, b = make(m, *nk, dtype, device, bias)
    check(kf, x, w, b, dtype)


@pytest.mark.parametrize("bias", [False, True], ids=["nobias", "bias"])
@pytest.mark.parametrize("nk", CPU_NK, ids=nk_id)
@pytest.mark.parametrize("m", M_ROWS + [40])  # the CPU reference takes any M
@pytest.mark.parametrize("device,dtype", [CPU, CPU_BF16])
def test_values_cpu(kf, device, dtype, m, nk, bias):
    x, w, b = make(m, *nk, dtype, device, bias)
    check(kf, x, w, b, dtype)


@pytest.mark.parametrize("lead", [(2, 8), (4, 1), (1, 16), (3, 5), (2, 2, 3), ()], ids=str)
@pytest.mark.parametrize("device,dtype", DEVICES)
def test_leading_dims(kf, device, dtype, lead):
    """x [B, S, K] (B * S <= 16 rows), [B, S, T, K] and a 1-D x [K] (one row): y [..., N]."""
    k, n = (4096, 300) if device == "cuda" else (64, 30)
    x, w, b = make(0, n, k, dtype, device, lead=lead)
    check(kf, x, w, b, dtype)


@pytest.mark.parametrize("device,dtype", DEVICES)
def test_strided_inputs(kf, device, dtype):
    """x a column slice of a wider activation (row stride > K; base 1 element past 16 bytes), w a slice
    of a bigger weight (rows and columns), a 3-D x whose rows collapse into one stride (a view), ones
    whose rows do not and a transposed x (copied): all the reference's result."""
    k, n = (4104, 260) if device == "cuda" else (72, 26)
    wide = torch.randn(7, k + 9, device=device).to(dtype)
    big = (torch.randn(n + 5, k + 16, device=device) / k ** 0.5).to(dtype)
    b = torch.randn(n, device=device).to(dtype)
    cases = {
        "x column slice": (wide[:, 8:8 + k], big[:n, :k]),
        "x unaligned base": (wide[:, 1:1 + k], big[:n, :k]),
        "w slice": (wide[:, :k], big[3:3 + n, 16:16 + k]),
        "both unaligned": (wide[:, 3:3 + k], big[1:1 + n, 5:5 + k]),
    }
    for what, (x, w) in cases.items():
        assert x.stride(0) > k and w.stride(0) > k
        check(kf, x, w, b, dtype, what)
        check(kf, x, w, None, dtype, what + " no bias")
    t = torch.randn(2, 4, k + 3, device=device).to(dtype)
    check(kf, t[:, :, 2:2 + k], big[:n, :k], b, dtype, "3-D x, one row stride")
    u = torch.randn(2, 5, k, device=device).to(dtype)
    check(kf, u[:, :4], big[:n, :k], b, dtype, "3-D x, rows that do not collapse")
    check(kf, u[:, 1:3].transpose(0, 1), big[:n, :k], None, dtype, "3-D x, transposed leading dims")
    # x with a strided last dimension (any strides, as F.linear takes them: copied, at most 16 rows)
    v = torch.randn(k, 6, device=device).to(dtype)
    check(kf, v.t(), big[:n, :k], b, dtype, "x transposed")
    check(kf, v.t().view(2, 3, k), big[:n, :k], b, dtype, "3-D x, strided last dimension")


@pytest.mark.parametrize("device,dtype", DEVICES)
def test_empty(kf, device, dtype):
    """M = 0 and N = 0: empty outputs; K = 0: y = bias (or 0), written (never NaN)."""
    x, w, b = make(0, 5, 8, dtype, device)
    assert run(kf, x, w, b, (0, 5)).numel() == 0
    x, w, _ = make(3, 0, 8, dtype, device, bias=False)
    assert run(kf, x, w, torch.empty(0, device=device, dtype=dtype), (3, 0)).numel() == 0
    assert run(kf, x.view(1, 3, 8), w, None, (1, 3, 0)).numel() == 0
    x, w, b = make(4, 6, 0, dtype, device)
    y = run(kf, x, w, b, (4, 6))
    assert torch.equal(y.cpu(), b.cpu().expand(4, 6))
    y = run(kf, x, w, None, (4, 6))
    assert torch.equal(y.cpu(), torch.zeros(4, 6, dtype=dtype))


@pytest.mark.parametrize("device,dtype", CUDA)
def test_many_rows_go_to_the_gemm_family(kf, device, dtype):
    """More than 16 rows on CUDA: kernelforge.gemm (cuBLASLt, the bias in its epilogue); the skinny op
    itself refuses them, naming the limit."""
    for lead in ((17,), (64,), (300,), (4, 8), (2, 3, 5)):
        x, w, b = make(0, 384, 1000, dtype, device, lead=lead)
        for bias in (b, None):
            y = kf.linear(x, w, bias)
            assert y.shape == (*lead, 384) and y.is_contiguous()
            want, scale = reference(x, w, bias)
            close(y, want, scale, dtype, f"lead {lead}")
    x, w, b = make(17, 64, 64, dtype, device)
    with pytest.raises(ERR, match="at most 16"):
        torch.ops.kernelforge.linear(x, w, b)


@pytest.mark.cuda
def test_float64_cuda_falls_back(kf):
    """float64 CUDA tensors (no kernel) run the float64 CPU reference (warned once per process)."""
    x, w, b = make(3, 20, 33, f64, "cuda")
    y = kf.linear(x, w, b)
    assert y.device.type == "cuda" and y.dtype == f64
    want, scale = reference(x, w, b)
    close(y, want, scale, f64, "float64 on CUDA")


# ---- errors ------------------------------------------------------------------------------------------


def test_errors(kf):
    x, w, b = make(3, 5, 8, f64, "cpu")
    with pytest.raises(ValueError, match=r"w must have 2 dimensions \[N, K\]"):
        kf.linear(x, w[0], b)
    with pytest.raises(ValueError, match="w must have 2 dimensions"):
        kf.linear(x, w.view(1, 5, 8), b)
    with pytest.raises(ValueError, match="x must have at least 1 dimension"):
        kf.linear(x[0, 0], w, b)
    with pytest.raises(ERR, match=r"\bw\b.*dtype"):
        kf.linear(x, w.float(), b)
    with pytest.raises(ERR, match=r"bias.*dtype"):
        kf.linear(x, w, b.float())
    with pytest.raises(ERR, match=r"\bw\b.*K = 8"):
        kf.linear(x, w[:, :7], b)
    with pytest.raises(ERR, match=r"bias must have shape \[5\]"):
        kf.linear(x, w, b[:4])
    with pytest.raises(ERR, match="bias must have 1 dimension"):
        kf.linear(x, w, b.view(1, 5))
    with pytest.raises(ERR, match="float16 or bfloat16"):
        kf.linear(x.to(torch.int64), w.to(torch.int64), None)
    with pytest.raises(ERR, match="w must be contiguous in its last dimension"):  # a weight is never copied
        kf.linear(x, w.t().contiguous().t(), b)
    with pytest.raises(ERR, match="bias must be contiguous"):
        kf.linear(x, w, torch.randn(5, 2, dtype=f64)[:, 0])


@pytest.mark.cuda
def test_errors_cuda(kf):
    x, w, b = make(3, 5, 8, torch.bfloat16, "cuda")
    with pytest.raises(ERR, match="float16 or bfloat16"):
        kf.linear(x.float(), w.float(), b.float())
    with pytest.raises(ERR, match=r"\bw\b.*device"):
        kf.linear(x, w.cpu(), b)
    with pytest.raises(ERR, match=r"\bw\b.*dtype"):
        kf.linear(x, w.half(), b)
    with pytest.raises(ERR, match=r"\bw\b.*K = 8"):
        kf.linear(x, w[:, :7], b)
    with pytest.raises(ERR, match="bias must have shape"):
        kf.linear(x, w, b[:4])
    with pytest.raises(ERR, match="w must be contiguous in its last dimension"):
        kf.linear(x, w.t().contiguous().t(), b)


# ---- gradients ---------------------------------------------------------------------------------------


def grads_ref(x, w, b, dy):
    """(dx, dw, dbias) and their scales in float64: dx = dy w, dw = dy^T x (over the rows), dbias = sum dy."""
    d = dy.detach().to("cpu", f64).reshape(-1, w.shape[0])
    x64, w64 = x.detach().to("cpu", f64).reshape(-1, w.shape[1]), w.detach().to("cpu", f64)

    def sq(t):
        return t * t

    return {"dx": (d @ w64, (sq(d) @ sq(w64)).sqrt()), "dw": (d.t() @ x64, (sq(d).t() @ sq(x64)).sqrt()),
            "dbias": (d.sum(0), sq(d).sum(0).sqrt())}


@pytest.mark.parametrize("lead", [(1,), (7,), (16,), (2, 5), (40,)], ids=str)
@pytest.mark.parametrize("device,dtype", DEVICES)
def test_gradients(kf, device, dtype, lead):
    """dx, dw and dbias through kf.linear's autograd (torch's GEMMs) against float64 autograd; 40 rows
    on CUDA take the cuBLAS route (torch's own autograd)."""
    k, n = (1000, 384) if device == "cuda" else (40, 24)
    x, w, b = make(0, n, k, dtype, device, lead=lead)
    leaves = [t.clone().requires_grad_() for t in (x, w, b)]
    y = kf.linear(*leaves)
    dy = torch.randn_like(y, dtype=torch.float32).to(dtype)
    got = dict(zip(("dx", "dw", "dbias"), torch.autograd.grad([y], leaves, [dy])))
    want = grads_ref(x, w, b, dy)
    for key, (ref, scale) in want.items():
        g = got[key].reshape(ref.shape) if key == "dx" else got[key]
        assert got[key].shape == {"dx": x, "dw": w, "dbias": b}[key].shape
        close(g, ref, scale, dtype, key, kind="grad")


@pytest.mark.parametrize("device,dtype", DEVICES)
def test_gradients_of_some_inputs(kf, device, dtype):
    """Only the inputs that require grad get one (no bias: two); a frozen weight (inference with a
    trainable adapter upstream) gives dx only."""
    x, w, b = make(5, 12, 16, dtype, device)
    xg = x.clone().requires_grad_()
    y = kf.linear(xg, w, b)
    assert y.requires_grad
    (dx,) = torch.autograd.grad(y.sum(), [xg])
    want = grads_ref(x, w, b, torch.ones(5, 12))["dx"]
    close(dx, *want, dtype, "dx", kind="grad")
    wg = w.clone().requires_grad_()
    dx, dw = torch.autograd.grad(kf.linear(xg, wg, None).sum(), [xg, wg])
    assert dx.shape == x.shape and dw.shape == w.shape
    with torch.no_grad():
        assert not kf.linear(xg, wg, b).requires_grad


def test_gradcheck_cpu(kf):
    """Float64 gradcheck and gradgradcheck (the backward is differentiable torch ops) on the CPU."""
    x = torch.randn(2, 3, 5, dtype=f64, requires_grad=True)
    w = torch.randn(4, 5, dtype=f64, requires_grad=True)
    b = torch.randn(4, dtype=f64, requires_grad=True)
    assert torch.autograd.gradcheck(kf.linear, (x, w, b))
    assert torch.autograd.gradgradcheck(kf.linear, (x, w, b))
    assert torch.autograd.gradcheck(lambda x, w: kf.linear(x, w), (x, w))


# ---- torch.compile, CUDA graphs, opcheck ---------------------------------------------------------------

COMPILE_DEVICES = [CPU, CUDA[0]]


@pytest.mark.parametrize("device,dtype", COMPILE_DEVICES)
def test_compile_fullgraph(kf, fresh_dynamo, device, dtype):
    """torch.compile(fullgraph=True) of a block calling kf.linear (3-D x, bias, then a pointwise op):
    no graph break, the fake impl's shape, the reference's values; and its backward compiled too."""
    k, n = (4096, 512) if device == "cuda" else (64, 48)
    x, w, b = make(0, n, k, dtype, device, lead=(2, 4))

    @torch.compile(fullgraph=True)
    def f(x, w, b):
        return kf.linear(x, w, b) * 2

    y = f(x, w, b)
    want, scale = reference(x, w, b)
    close(y / 2, want, scale, dtype, "compiled")
    leaves = [t.clone().requires_grad_() for t in (x, w, b)]
    dy = torch.randn(2, 4, n, device=device).to(dtype)
    got = torch.autograd.grad([f(*leaves)], leaves, [dy])
    for (key, (ref, sc)), g in zip(grads_ref(x, w, b, 2 * dy.to(f64)).items(), got):
        close(g.reshape(ref.shape), ref, sc, dtype, f"compiled {key}", kind="grad")


@pytest.mark.cuda
def test_cuda_graph_replay(kf):
    """kf.linear captured into a CUDA graph (a K split: its workspace from the graph's pool) replays for
    new x, w and bias values."""
    dtype = torch.bfloat16
    shapes = [(1, 128, 5000), (16, 4096, 4096), (3, 127, 64)]
    inputs = [make(*s, dtype, "cuda") for s in shapes]
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for t in inputs:
            kf.linear(*t)  # warm up (allocator, plan)
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        outs = [kf.linear(*t) for t in inputs]
    for _ in range(2):
        for t in inputs:
            for u in t:
                u.copy_(torch.randn_like(u, dtype=torch.float32).to(dtype) / u.shape[-1] ** 0.5)
        graph.replay()
        torch.cuda.synchronize()
        for t, y in zip(inputs, outs):
            want, scale = reference(*t)
            close(y, want, scale, dtype, f"replay x {tuple(t[0].shape)} w {tuple(t[1].shape)}")


@pytest.mark.parametrize("device,dtype", [CPU, CUDA[0]])
def test_opcheck(kf, device, dtype):
    x, w, b = make(0, 24, 40, dtype, device, lead=(2, 3))
    for args in ((x, w, b), (x, w, None), (x[0, 0], w, b)):
        torch.library.opcheck(torch.ops.kernelforge.linear.default, args)
    xg, wg, bg = (t.clone().requires_grad_() for t in (x, w, b))
    torch.library.opcheck(torch.ops.kernelforge.linear.default, (xg, wg, bg))
