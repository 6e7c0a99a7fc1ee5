"""kernelforge.gemm and kernelforge.linear(..., activation=): cuBLASLt with fused epilogues on CUDA, the
float64 C++ reference on CPU; forward and backward against float64 torch, transposed operands, the
pre-activation and row-sum outputs, empty sizes, bad arguments, torch.compile."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

import kernelforge as kf

ACTS = ("none", "relu", "gelu_tanh")


def _ref(x, w, b, act):
    y = F.linear(x.double(), w.double(), None if b is None else b.double())
    if act == "relu":
        return y.relu()
    if act == "gelu_tanh":
        return F.gelu(y, approximate="tanh")
    return y


def _grads(y, leaves, dy):
    return torch.autograd.grad(y, [t for t in leaves if t is not None], dy)


@pytest.mark.parametrize("act", ACTS)
@pytest.mark.parametrize("bias", [False, True])
def test_linear_act_cpu_matches_float64(act, bias):
    g = torch.Generator().manual_seed(1)
    x = torch.randn(3, 5, 7, dtype=torch.float64, generator=g, requires_grad=True)
    w = torch.randn(6, 7, dtype=torch.float64, generator=g, requires_grad=True)
    b = torch.randn(6, dtype=torch.float64, generator=g, requires_grad=True) if bias else None
    y = kf.linear(x, w, b, activation=act)
    ref = _ref(x, w, b, act)
    torch.testing.assert_close(y, ref, rtol=1e-12, atol=1e-12)
    dy = torch.randn_like(ref)
    for got, want in zip(_grads(y, (x, w, b), dy), _grads(ref, (x, w, b), dy)):
        torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)


def test_gemm_outputs_cpu():
    g = torch.Generator().manual_seed(2)
    a = torch.randn(4, 9, dtype=torch.float64, generator=g)
    b = torch.randn(5, 9, dtype=torch.float64, generator=g)
    bias = torch.randn(5, dtype=torch.float64, generator=g)
    out, aux, s = kf.gemm(a, b, bias, "gelu_tanh", aux=True)
    torch.testing.assert_close(aux, a @ b.t() + bias)
    torch.testing.assert_close(out, F.gelu(aux, approximate="tanh"))
    assert s.shape == (0,)
    # transposed views (stride 1 along the rows) are taken as they are; a_sum = the row sums of a
    out, aux, s = kf.gemm(a.t().contiguous().t(), b.t().contiguous().t(), a_sum=True)
    torch.testing.assert_close(out, a @ b.t())
    torch.testing.assert_close(s, a.sum(1))
    assert aux.shape == (0, 0)
    # K = 0: out = act(bias)
    out, _, _ = kf.gemm(a[:, :0], b[:, :0], bias, "relu")
    torch.testing.assert_close(out, bias.relu().expand(4, 5))


def test_errors():
    x, w = torch.randn(4, 8), torch.randn(3, 8)
    with pytest.raises(ValueError, match="erf GELU has no fused epilogue"):
        kf.linear(x, w, activation="gelu")
    with pytest.raises(ValueError, match="activation must be one of"):
        kf.linear(x, w, activation="tanh")
    with pytest.raises(ValueError, match="gemm: activation must be 'none', 'relu' or 'gelu_tanh'"):
        kf.gemm(x, w, activation="silu")
    with pytest.raises(RuntimeError, match="b must have a's K = 8"):
        kf.gemm(x, torch.randn(3, 7))
    with pytest.raises(RuntimeError, match="aux \\(the pre-activation"):
        kf.gemm(x, w, activation="relu", aux=True)
    with pytest.raises(RuntimeError, match="a_sum \\(the bias gradient"):
        kf.gemm(x, w, torch.randn(3), a_sum=True)
    with pytest.raises(ValueError, match=r"a must have 2 dimensions \[M, K\] or 3 \[B, M, K\]"):
        kf.gemm(torch.randn(2, 2, 4, 8), w)
    with pytest.raises(RuntimeError, match="b must have out's batch size 2"):
        kf.gemm(torch.randn(2, 4, 8), torch.randn(3, 3, 8))
    y = kf.gemm(torch.randn(2, 4, 8), w)[0]  # batched a, shared b
    assert y.shape == (2, 4, 3)


# ---- the fused GELU backward + bias gradient under linear's backward ---------------------------------

OPS = torch.ops.kernelforge
# db: one rounding of the float64 column sum (up to the float64 formula's last bits)
DB_TOL = {torch.float64: 1e-12, torch.float32: 2e-6, torch.float16: 2e-3, torch.bfloat16: 1.6e-2}


def _gelu_tanh_grad64(dy, pre):
    p = pre.detach().double().requires_grad_()
    F.gelu(p, approximate="tanh").backward(dy.detach().double())
    return p.grad


class _Calls(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.ops = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops.append(func)
        return func(*args, **(kwargs or {}))


def _check_bias_grad(dy, pre, bias_dtype):
    g, db = OPS.gelu_backward_bias_grad(dy, pre, "tanh", bias_dtype)
    assert torch.equal(g, OPS.gelu_backward(dy, pre, "tanh"))  # g bit for bit
    assert db.shape == (pre.shape[-1],) and db.dtype == (bias_dtype or pre.dtype) and db.device == pre.device
    g64 = _gelu_tanh_grad64(dy, pre).reshape(-1, pre.shape[-1])
    want = g64.sum(0)
    # Each float32 term carries the float32 evaluation error of gelu' (a few ulp of |g|), so a column's
    # error is bounded by its sum of |g|; db's own rounding is relative to the sum. A row dropped or
    # counted twice moves a column by a whole |g| term, far past this bound.
    bound = DB_TOL[db.dtype] * want.abs() + 4e-6 * g64.abs().sum(0) + 1e-30
    err = (db.double() - want).abs()
    assert bool((err <= bound).all()), f"db off by {(err / bound).max().item():.3g} x its bound"


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16])
def test_gelu_backward_bias_grad_cpu(dtype):
    """kernelforge::gelu_backward_bias_grad on CPU (the float64 reference): g = gelu_backward's, db = its
    column sums in bias_dtype (None: the input's); row-strided inputs, leading dimensions, no rows."""
    gen = torch.Generator().manual_seed(4)
    big = torch.randn(7, 9, dtype=dtype, generator=gen)
    pre = 3 * torch.randn(7, 5, dtype=dtype, generator=gen)
    for bias_dtype in (None, torch.float32):
        _check_bias_grad(big[:, :5], pre, bias_dtype)  # dy rows 9 apart
        _check_bias_grad(big[:, 2:7].reshape(7, 1, 5), pre.reshape(7, 1, 5), bias_dtype)
    g, db = OPS.gelu_backward_bias_grad(pre[:0], pre[:0], "tanh")
    assert g.shape == (0, 5) and torch.equal(db, torch.zeros(5, dtype=dtype))


def test_gelu_backward_bias_grad_errors():
    x = torch.randn(4, 6)
    with pytest.raises(RuntimeError, match=r"gelu_backward_bias_grad: dy must have shape \[4, 6\]"):
        OPS.gelu_backward_bias_grad(torch.randn(4, 5), x, "tanh")
    with pytest.raises(RuntimeError, match="gelu_backward_bias_grad: dbias must be a floating-point tensor, got int32"):
        OPS.gelu_backward_bias_grad(x, x, "tanh", torch.int32)
    with pytest.raises(ValueError, match="gelu_backward_bias_grad: approximate must be 'none' or 'tanh', got 'erf'"):
        OPS.gelu_backward_bias_grad(x, x, "erf")
    with pytest.raises(RuntimeError, match="gelu_backward_bias_grad: x must have between 1 and 8 dimensions"):
        OPS.gelu_backward_bias_grad(torch.tensor(1.0), torch.tensor(1.0), "tanh")


def test_gelu_backward_bias_grad_opcheck():
    gen = torch.Generator().manual_seed(5)
    dy, pre = torch.randn(6, 10, generator=gen), torch.randn(6, 10, generator=gen)
    torch.library.opcheck(OPS.gelu_backward_bias_grad.default, (dy, pre, "tanh", torch.float64))
    torch.library.opcheck(OPS.gelu_backward_bias_grad.default, (dy, pre, "none"))


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_linear_gelu_tanh_backward_fuses_the_bias_gradient(dtype):
    """linear(..., 'gelu_tanh')'s backward takes g and db from one gelu_backward_bias_grad call when the bias
    wants a gradient (gelu_backward otherwise), and dx, dW, db match float64 (CPU: the reference)."""
    gen = torch.Generator().manual_seed(6)
    x = torch.randn(3, 5, 7, dtype=dtype, generator=gen, requires_grad=True)
    w = torch.randn(9, 7, dtype=dtype, generator=gen, requires_grad=True)
    b = torch.randn(9, dtype=dtype, generator=gen, requires_grad=True)
    y = kf.linear(x, w, b, activation="gelu_tanh")
    dy = torch.randn(y.shape, dtype=dtype, generator=gen)
    with _Calls() as mode:
        got = torch.autograd.grad(y, (x, w, b), dy)
    assert OPS.gelu_backward_bias_grad.default in mode.ops and OPS.gelu_backward.default not in mode.ops
    ref = _ref(x, w, b, "gelu_tanh")
    tol = 1e-12 if dtype == torch.float64 else 1e-5
    for name, g, want in zip("xwb", got, _grads(ref, (x, w, b), dy.double())):
        assert g.dtype == dtype, name
        torch.testing.assert_close(g.double(), want.double(), rtol=tol, atol=tol, msg=name)
    # no bias gradient asked: gelu_backward alone
    y = kf.linear(x, w, b.detach(), activation="gelu_tanh")
    with _Calls() as mode:
        torch.autograd.grad(y, (x, w), dy)
    assert OPS.gelu_backward.default in mode.ops and OPS.gelu_backward_bias_grad.default not in mode.ops


# ---- CUDA ------------------------------------------------------------------------------------------

TOL = {torch.bfloat16: 2e-2, torch.float16: 4e-3}


def _rel(got, want):
    return ((got.double() - want).norm() / want.norm().clamp_min(1e-30)).item()


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("act", ACTS)
@pytest.mark.parametrize("shape", [(2, 100, 256, 320), (1, 37, 129, 67), (4, 8, 72, 4096)])
def test_linear_act_cuda(dtype, act, shape):
    b_, s, n, k = shape
    g = torch.Generator(device="cuda").manual_seed(3)
    x = torch.randn(b_, s, k, device="cuda", dtype=dtype, generator=g).requires_grad_()
    w = (torch.randn(n, k, device="cuda", dtype=dtype, generator=g) / k**0.5).requires_grad_()
    b = torch.randn(n, device="cuda", dtype=dtype, generator=g).requires_grad_()
    y = kf.linear(x, w, b, activation=None if act == "none" else act)
    assert y.shape == (b_, s, n) and y.dtype == dtype and y.is_contiguous()
    ref = _ref(x, w, b, act)
    assert torch.isfinite(y).all()
    assert _rel(y, ref) < TOL[dtype]
    dy = torch.randn_like(y)
    for name, got, want in zip("xwb", _grads(y, (x, w, b), dy), _grads(ref, (x, w, b), dy.double())):
        assert torch.isfinite(got).all(), name
        assert _rel(got, want) < TOL[dtype] * 2, name


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("m, n", [(1, 1), (7, 7), (1000, 4099), (2049, 1024), (0, 7)])
def test_gelu_backward_bias_grad_cuda(dtype, m, n):
    """The CUDA kernels: g bit-identical to gelu_backward's, db against float64, rows of dy strided, db in
    the input dtype and in float32, bit-identical reruns."""
    gen = torch.Generator(device="cuda").manual_seed(7)
    big = torch.randn(m, n + 3, device="cuda", dtype=dtype, generator=gen)
    pre = 3 * torch.randn(m, n, device="cuda", dtype=dtype, generator=gen)
    for bias_dtype in (None, torch.float32):
        _check_bias_grad(big[:, :n], pre, bias_dtype)
        first = OPS.gelu_backward_bias_grad(big[:, :n], pre, "tanh", bias_dtype)
        again = OPS.gelu_backward_bias_grad(big[:, :n], pre, "tanh", bias_dtype)
        assert torch.equal(first[0], again[0]) and torch.equal(first[1], again[1])


@pytest.mark.cuda
def test_gemm_cuda_transposed_and_sums():
    g = torch.Generator(device="cuda").manual_seed(4)
    a = torch.randn(300, 96, device="cuda", dtype=torch.bfloat16, generator=g)
    b = torch.randn(64, 96, device="cuda", dtype=torch.bfloat16, generator=g)
    for at in (a, a.t().contiguous().t()):
        for bt in (b, b.t().contiguous().t()):
            out, _, s = kf.gemm(at.t().contiguous().t() if at is a else at, bt)
            assert _rel(out, a.double() @ b.double().t()) < 1e-2
    # the weight-gradient form: dW = dy^T x with db = the row sums of dy^T, both transposed views
    dy = torch.randn(300, 64, device="cuda", dtype=torch.bfloat16, generator=g)
    dw, _, db = kf.gemm(dy.t(), a.t(), a_sum=True)
    assert _rel(dw, dy.double().t() @ a.double()) < 1e-2
    assert _rel(db, dy.double().sum(0)) < 1e-2


@pytest.mark.cuda
def test_gemm_cuda_empty_and_k0():
    x = torch.randn(0, 64, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    w = torch.randn(32, 64, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    y = kf.linear(x, w, activation="gelu_tanh")
    assert y.shape == (0, 32)
    y.sum().backward()
    assert w.grad is not None and (w.grad == 0).all()
    bias = torch.randn(8, device="cuda", dtype=torch.float16)
    out, aux, _ = kf.gemm(torch.randn(5, 0, device="cuda", dtype=torch.float16),
                          torch.randn(8, 0, device="cuda", dtype=torch.float16), bias, "gelu_tanh", aux=True)
    torch.testing.assert_close(aux, bias.expand(5, 8))
    torch.testing.assert_close(out, F.gelu(bias.float(), approximate="tanh").half().expand(5, 8), rtol=4e-3, atol=4e-3)


@pytest.mark.cuda
def test_linear_act_compiles(fresh_dynamo):
    x = torch.randn(64, 128, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    w = torch.randn(96, 128, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    b = torch.randn(96, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    f = torch.compile(lambda x, w, b: kf.linear(x, w, b, activation="gelu_tanh"), fullgraph=True)
    y = f(x, w, b)
    torch.testing.assert_close(y, kf.linear(x, w, b, activation="gelu_tanh"))
    y.float().sum().backward()
    assert x.grad is not None and w.grad is not None and b.grad is not None


@pytest.mark.cuda
def test_float32_cuda_with_an_activation():
    """float32 runs the GEMM family too (cuBLASLt's plain float32 compute, no TF32)."""
    x, w = torch.randn(32, 16, device="cuda"), torch.randn(8, 16, device="cuda")
    want = F.relu(F.linear(x.double(), w.double())).float()
    torch.testing.assert_close(kf.linear(x, w, activation="relu"), want, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(kf.linear(x, w), F.linear(x, w))  # no activation: torch's GEMM, by design


# ---- bmm and matmul ---------------------------------------------------------------------------------------

MATMUL_SHAPES = [((5, 7), (7, 4)), ((2, 3, 5, 7), (7, 4)), ((5, 7), (2, 3, 7, 4)), ((2, 1, 5, 7), (3, 7, 4)),
                 ((7,), (7, 4)), ((5, 7), (7,)), ((7,), (7,)), ((2, 3, 5, 7), (2, 3, 7, 4)), ((3, 7), (1, 7, 2))]


@pytest.mark.parametrize("sa,sb", MATMUL_SHAPES)
def test_matmul_cpu_matches_torch(sa, sb):
    g = torch.Generator().manual_seed(3)
    a = torch.randn(*sa, dtype=torch.float64, generator=g, requires_grad=True)
    b = torch.randn(*sb, dtype=torch.float64, generator=g, requires_grad=True)
    y, ref = kf.matmul(a, b), torch.matmul(a, b)
    assert y.shape == ref.shape
    torch.testing.assert_close(y, ref, rtol=1e-12, atol=1e-12)
    dy = torch.randn(ref.shape, dtype=torch.float64, generator=g)
    for got, want in zip(_grads(y, (a, b), dy), _grads(ref, (a, b), dy)):
        torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)


def test_bmm_cpu_transposed_views_and_errors():
    g = torch.Generator().manual_seed(4)
    a = torch.randn(3, 7, 5, dtype=torch.float64, generator=g).transpose(1, 2).requires_grad_()  # [3, 5, 7] view
    b = torch.randn(3, 7, 4, dtype=torch.float64, generator=g, requires_grad=True)
    y = kf.bmm(a, b)
    torch.testing.assert_close(y, torch.bmm(a, b), rtol=1e-12, atol=1e-12)
    dy = torch.randn(y.shape, dtype=torch.float64, generator=g)
    for got, want in zip(_grads(y, (a, b), dy), _grads(torch.bmm(a, b), (a, b), dy)):
        torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
    with pytest.raises(ValueError, match="bmm: a and b must have 3 dimensions"):
        kf.bmm(a[0], b)
    with pytest.raises(ValueError, match=r"do not multiply \(\[B, M, K\] @ \[B, K, N\]\)"):
        kf.bmm(a, b[:2])
    with pytest.raises(ValueError, match="matmul: shapes .* do not multiply"):
        kf.matmul(a, b.transpose(1, 2))
    with pytest.raises(ValueError, match="must share one dtype"):
        kf.matmul(a, b.float())
    with pytest.raises(ValueError, match="at least 1 dimension"):
        kf.matmul(torch.tensor(1.0, dtype=torch.float64), b)


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("sa,sb", MATMUL_SHAPES + [((8, 129, 67), (8, 67, 130)), ((4, 256, 512), (512, 384))])
def test_matmul_cuda(dtype, sa, sb):
    g = torch.Generator(device="cuda").manual_seed(5)
    a = torch.randn(*sa, device="cuda", generator=g).to(dtype).requires_grad_()
    b = torch.randn(*sb, device="cuda", generator=g).to(dtype).requires_grad_()
    y = kf.matmul(a, b)
    ref = torch.matmul(a.double(), b.double())
    k = sa[-1]
    tol = dict(rtol=2e-2 if dtype == torch.bfloat16 else 4e-3, atol=1e-2 * (k ** 0.5 / 8 + 1))
    assert y.dtype == dtype and y.shape == ref.shape
    torch.testing.assert_close(y.double(), ref, **tol)
    dy = torch.randn(ref.shape, device="cuda", generator=g).to(dtype)
    got = _grads(y, (a, b), dy)
    want = _grads(ref, (a, b), dy.double())
    for gg, ww in zip(got, want):
        assert gg.dtype == dtype
        torch.testing.assert_close(gg.double(), ww.double(), rtol=tol["rtol"], atol=tol["atol"] * 4)


@pytest.mark.cuda
def test_bmm_compiles(fresh_dynamo):
    a = torch.randn(4, 64, 96, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    b = torch.randn(4, 96, 80, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    f = torch.compile(lambda a, b: kf.bmm(a, b).float().square().sum(), fullgraph=True)
    loss = f(a, b)
    loss.backward()
    ref = torch.bmm(a.double(), b.double()).square().sum()
    torch.testing.assert_close(loss.double(), ref, rtol=2e-2, atol=1.0)
    assert a.grad is not None and b.grad is not None
