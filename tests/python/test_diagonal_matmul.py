"""kf.diagonal_matmul (``a.unsqueeze(-1) * b``) forward and backward against the float64 reference of
kernelforge.specs.diagonal_matmul, on CPU (the C++ float64 reference) and CUDA (the kernels): per-row
and broadcast scales, batched, row-strided and unaligned views, empty tensors, each gradient alone,
determinism, double backward, torch.compile(fullgraph=True) and the error messages."""

from __future__ import annotations

import pytest
import torch

import norm_ref as R
from norm_ref import DEVICES, DTYPES

from kernelforge.specs.diagonal_matmul import reference

# (b's shape, broadcast a): one element, decode rows, prime / odd widths (scalar head and tail),
# several rows per block (N = 64), a long row, batched per-row and broadcast scales.
CASES = [((1, 1), False), ((7, 127), False), ((19, 4097), False), ((300, 64), False), ((2, 3, 1000), False),
         ((3, 5, 1023), True), ((8, 16, 256), True), ((2, 2, 9, 24), True), ((1, 4, 33), True)]
HUGE = [((2, 65537), False)]  # CUDA only: keeps the CPU suite fast
DEVICE_CASES = [pytest.param("cpu", c, id=f"cpu-{c[0]}{'-bcast' if c[1] else ''}") for c in CASES] + [
    pytest.param("cuda", c, id=f"cuda-{c[0]}{'-bcast' if c[1] else ''}", marks=pytest.mark.cuda) for c in CASES + HUGE
]


def a_shape(b_shape, bcast):
    return (b_shape[-2],) if bcast else tuple(b_shape[:-1])


def inputs(b_shape, bcast, dtype, device, seed=0):
    g = torch.Generator().manual_seed(seed)
    a = torch.randn(a_shape(b_shape, bcast), generator=g).to(device, dtype)
    b = torch.randn(b_shape, generator=g).to(device, dtype)
    dy = torch.randn(b_shape, generator=g).to(device, dtype)
    return a, b, dy


def ref_grads(a, b, dy):
    a64 = a.detach().double().cpu().requires_grad_(True)
    b64 = b.detach().double().cpu().requires_grad_(True)
    y = reference(a64, b64)
    da, db = torch.autograd.grad([y], [a64, b64], [dy.double().cpu()])
    return y.detach(), da, db


def run(kf, a, b, dy, need_a=True, need_b=True):
    a = a.detach().clone().requires_grad_(need_a)
    b = b.detach().clone().requires_grad_(need_b)
    R.poison(dy.device)
    y = kf.diagonal_matmul(a, b)
    y.backward(dy)
    return y, a.grad, b.grad


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("device,case", DEVICE_CASES)
def test_forward_backward(kf, device, case, dtype):
    b_shape, bcast = case
    a, b, dy = inputs(b_shape, bcast, dtype, device)
    y_ref, da_ref, db_ref = ref_grads(a, b, dy)
    y, da, db = run(kf, a, b, dy)
    assert y.device == b.device and y.is_contiguous() and y.shape == b.shape
    R.assert_close(y, y_ref.to(dtype), dtype, msg="y")
    R.assert_close(da, da_ref, dtype, grad=True, msg="da")
    R.assert_close(db, db_ref, dtype, grad=True, msg="db")
    assert da.dtype == dtype and db.dtype == dtype


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("bcast", [False, True])
def test_each_gradient_alone(kf, device, dtype, bcast):
    """Only da (no db written), only db (the forward kernel on dy)."""
    a, b, dy = inputs((3, 6, 130), bcast, dtype, device, seed=1)
    _, da_ref, db_ref = ref_grads(a, b, dy)
    _, da, db = run(kf, a, b, dy, need_a=True, need_b=False)
    assert db is None
    R.assert_close(da, da_ref, dtype, grad=True, msg="da alone")
    _, da, db = run(kf, a, b, dy, need_a=False, need_b=True)
    assert da is None
    R.assert_close(db, db_ref, dtype, grad=True, msg="db alone")


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("device", DEVICES)
def test_views(kf, device, dtype):
    """Row-strided views (big[:, :N]: no copy), base pointers one element off alignment, a strided a."""
    g = torch.Generator().manual_seed(2)
    big = torch.randn(33, 300, generator=g).to(device, dtype)
    flat = torch.randn(33 * 257 + 1, generator=g).to(device, dtype)
    scales = torch.randn(66, generator=g).to(device, dtype)
    for b in (big[:, :257], flat[1:].view(33, 257), big[:, 1:258]):
        for a in (scales[:33], scales[::2], scales[1:34]):
            dy = torch.randn(b.shape, generator=g).to(device, dtype)
            y_ref, da_ref, db_ref = ref_grads(a, b, dy)
            y, da, db = run(kf, a, b, dy)
            R.assert_close(y, y_ref.to(dtype), dtype, msg=f"y strides {b.stride()}")
            R.assert_close(da, da_ref, dtype, grad=True, msg="da")
            R.assert_close(db, db_ref, dtype, grad=True, msg="db")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("b_shape,bcast", [((0, 8), False), ((5, 0), False), ((0, 4, 8), True), ((3, 4, 0), True),
                                           ((2, 0, 8), True)])
def test_empty(kf, device, b_shape, bcast):
    """Empty tensors: y and db empty, da of an empty sum zero."""
    a, b, dy = inputs(b_shape, bcast, torch.float32, device)
    y, da, db = run(kf, a, b, dy)
    assert y.shape == b.shape and db.shape == b.shape and da.shape == a.shape
    assert torch.equal(da, torch.zeros_like(a))


@pytest.mark.cuda
@pytest.mark.parametrize("bcast", [False, True])
def test_deterministic(kf, bcast):
    a, b, dy = inputs((8, 256, 1024), bcast, torch.bfloat16, "cuda", seed=3)
    first = run(kf, a, b, dy)
    second = run(kf, a, b, dy)
    for x, z in zip(first, second):
        assert torch.equal(x, z)


def test_double_backward(kf):
    g = torch.Generator().manual_seed(4)
    b = torch.randn(3, 4, 5, generator=g, dtype=torch.float64, requires_grad=True)
    for a in (torch.randn(4, generator=g, dtype=torch.float64), torch.randn(3, 4, generator=g, dtype=torch.float64)):
        a.requires_grad_(True)
        assert torch.autograd.gradcheck(kf.diagonal_matmul, (a, b))
        assert torch.autograd.gradgradcheck(kf.diagonal_matmul, (a, b))


@pytest.mark.parametrize("device", DEVICES)
def test_compile_fullgraph(kf, device):
    a, b, dy = inputs((4, 16, 64), True, torch.float32, device, seed=5)
    a.requires_grad_(True)
    b.requires_grad_(True)
    f = torch.compile(lambda a, b: kf.diagonal_matmul(a, b) * 2.0, fullgraph=True)
    y = f(a, b)
    y.backward(dy)
    y_ref, da_ref, db_ref = ref_grads(a, b, dy)
    R.assert_close(y, (2 * y_ref).float(), torch.float32, msg="y")
    R.assert_close(a.grad, 2 * da_ref, torch.float32, grad=True, msg="da")
    R.assert_close(b.grad, 2 * db_ref, torch.float32, grad=True, msg="db")


def test_fake_shapes(kf):
    from torch._subclasses.fake_tensor import FakeTensorMode  # noqa: PLC0415

    with FakeTensorMode():
        b = torch.empty(2, 3, 8, dtype=torch.bfloat16)
        a = torch.empty(3, dtype=torch.bfloat16)
        y = torch.ops.kernelforge.diagonal_matmul(a, b)
        da, db = torch.ops.kernelforge.diagonal_matmul_backward(y, a, b, True, False)
    assert y.shape == (2, 3, 8) and da.shape == (3,) and db.shape == (0,)


@pytest.mark.parametrize("device", DEVICES)
def test_errors(kf, device):
    b = torch.randn(2, 3, 8, device=device)
    with pytest.raises(RuntimeError, match=r"a must have shape \[2, 3\] \(b.shape\[:-1\].*or \[3\].*got \[8\]"):
        kf.diagonal_matmul(torch.randn(8, device=device), b)
    with pytest.raises(RuntimeError, match=r"a must have the same dtype as b \(float32\), got float16"):
        kf.diagonal_matmul(torch.randn(3, device=device, dtype=torch.float16), b)
    with pytest.raises(RuntimeError, match=r"b must have between 2 and 8 dimensions"):
        kf.diagonal_matmul(torch.randn(1, device=device), torch.randn(8, device=device))
    with pytest.raises(RuntimeError, match=r"b must be contiguous in its last dimension"):
        kf.diagonal_matmul(torch.randn(8, device=device), torch.randn(3, 8, device=device).t())
