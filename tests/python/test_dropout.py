"""dropout and dropout_add: masks against an independent Philox4x32-10 written here in numpy, keep
rates within binomial bounds, reproducibility with torch.manual_seed and generators, the backward
against the mask, F.dropout's edge semantics, errors, torch.compile (fullgraph) and CUDA-graph
capture / replay. CPU tensors run the float64 reference (same masks as the GPU)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from norm_ref import DEVICES

DTYPES = [torch.float32, torch.float16, torch.bfloat16]
TOL = {torch.float32: (1e-6, 1e-6), torch.float16: (1e-3, 1e-3), torch.bfloat16: (8e-3, 8e-3),
       torch.float64: (1e-12, 1e-12)}
SHAPES = [(1,), (7,), (4099,), (3, 1021), (17, 4096), (2, 3, 515)]
OPS = torch.ops.kernelforge

# ---- an independent Philox4x32-10 (Salmon et al. 2011) and the element -> counter mapping -------------
_M0, _M1, _W0, _W1, _MASK = 0xD2511F53, 0xCD9E8D57, 0x9E3779B9, 0xBB67AE85, 0xFFFFFFFF


def philox(c0, c1, c2, c3, k0, k1):
    c = [np.asarray(v, dtype=np.uint64) for v in (c0, c1, c2, c3)]
    k0, k1 = np.uint64(k0), np.uint64(k1)
    for r in range(10):
        if r:
            k0, k1 = (k0 + np.uint64(_W0)) & np.uint64(_MASK), (k1 + np.uint64(_W1)) & np.uint64(_MASK)
        p0, p1 = np.uint64(_M0) * c[0], np.uint64(_M1) * c[2]
        c = [(p1 >> np.uint64(32)) ^ c[1] ^ k0, p1 & np.uint64(_MASK), (p0 >> np.uint64(32)) ^ c[3] ^ k1,
             p0 & np.uint64(_MASK)]
    return c


def test_numpy_philox_known_answers():
    got = philox(0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344, 0xA4093822, 0x299F31D0)
    assert [int(v) for v in got] == [0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1]


def keep_threshold(p: float) -> int:
    """round((1 - p) 2^16): a 16-bit value below it is kept (65536 keeps all, 0 none)."""
    return math.floor((1.0 - p) * 65536.0 + 0.5)


def expected_bits(numel: int, seed: int, offset: int) -> np.ndarray:
    """Element i: 16 bits of Philox(counter = (offset / 4, i / 8), key = seed), the low (even i) or high
    (odd i) half of word (i % 8) / 2."""
    seed, offset = seed & 0xFFFFFFFFFFFFFFFF, offset & 0xFFFFFFFFFFFFFFFF
    g = np.arange((numel + 7) // 8, dtype=np.uint64)
    c = offset // 4
    words = philox(np.full_like(g, c & _MASK), np.full_like(g, c >> 32), g & np.uint64(_MASK), g >> np.uint64(32),
                   seed & _MASK, seed >> 32)
    w = np.stack(words, axis=1)  # [groups, 4]
    halves = np.stack([w & np.uint64(0xFFFF), w >> np.uint64(16)], axis=2)  # [groups, 4, 2]: low, high
    return halves.reshape(-1)[:numel]


def expected_mask(numel: int, seed: int, offset: int, p: float) -> torch.Tensor:
    """Kept iff the element's 16 bits < round((1 - p) 2^16)."""
    return torch.from_numpy(expected_bits(numel, seed, offset) < np.uint64(keep_threshold(p)))


def test_numpy_bits_known_answer():
    # Random123's all-zero philox4x32-10 block, 0x6627e8d5 0xe169c58d 0xbc57ac4c 0x9b00dbd8, is group 0
    # at seed 0, offset 0: its 16-bit halves, low first, are elements 0 .. 7
    got = [int(v) for v in expected_bits(9, 0, 0)]
    assert got[:8] == [0xE8D5, 0x6627, 0xC58D, 0xE169, 0xAC4C, 0xBC57, 0xDBD8, 0x9B00]
    assert expected_mask(8, 0, 0, 0.0).all() and not expected_mask(8, 0, 0, 1.0).any()
    # element 6 (0xdbd8 = 56280) is kept at p = 0.1 (threshold 58982), element 7 (0x9b00) too,
    # element 0 (0xe8d5 = 59605) is not
    assert keep_threshold(0.1) == 58982
    assert expected_mask(8, 0, 0, 0.1).tolist() == [False, True, True, True, True, True, True, True]


def raw_dropout(x, p, generator=None):
    y, state, mask = OPS.dropout.default(x, p, generator, True)
    return y, state, mask


# ---- masks, values, keep rates -----------------------------------------------------------------------
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("p", [0.1, 0.5, 0.9])
def test_mask_and_values(device, dtype, shape, p):
    x = torch.randn(shape, device=device).to(dtype)
    y, state, mask = raw_dropout(x, p)
    seed, offset = (int(v) for v in state.cpu())
    assert offset % 4 == 0
    want = expected_mask(x.numel(), seed, offset, p).reshape(shape)
    assert torch.equal(mask.cpu(), want)
    ref = (x.double() * mask.double() / (1 - p)).to(dtype)
    rtol, atol = TOL[dtype]
    torch.testing.assert_close(y, ref, rtol=rtol, atol=atol)
    assert (y[~mask] == 0).all()


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("p", [0.1, 0.5, 0.9])
def test_keep_rate(device, p):
    n = 1 << 20
    _, mask = __import__("kernelforge").dropout(torch.ones(n, device=device), p, return_mask=True)
    kept = mask.sum().item()
    q = keep_threshold(p) / 65536  # the keep probability, 1 - p quantized to 2^-16
    sd = math.sqrt(n * q * (1 - q))
    assert abs(kept - n * q) <= 6 * sd, (kept, n * q, sd)
    # neighbouring elements (same Philox block, adjacent blocks) are not correlated
    m = mask.double()
    corr = ((m[1:] - m.mean()) * (m[:-1] - m.mean())).mean() / m.var()
    assert abs(corr.item()) < 6 / math.sqrt(n)


# ---- reproducibility and generators ------------------------------------------------------------------
@pytest.mark.parametrize("device", DEVICES)
def test_manual_seed_reproduces_and_calls_differ(kf, device):
    x = torch.randn(4096, device=device)
    torch.manual_seed(123)
    a, b = kf.dropout(x), kf.dropout(x)
    torch.manual_seed(123)
    a2, b2 = kf.dropout(x), kf.dropout(x)
    torch.manual_seed(124)
    c = kf.dropout(x)
    assert torch.equal(a, a2) and torch.equal(b, b2)
    assert not torch.equal(a, b)  # consecutive calls draw new masks
    assert not torch.equal(a, c)  # another seed, another mask


@pytest.mark.parametrize("device", DEVICES)
def test_generator_argument(kf, device):
    x = torch.randn(3, 1000, device=device)
    g1, g2 = torch.Generator(device=device).manual_seed(7), torch.Generator(device=device).manual_seed(7)
    torch.manual_seed(0)
    cpu_state = torch.get_rng_state()
    before = torch.cuda.default_generators[0].get_offset() if device == "cuda" else None
    a, b = kf.dropout(x, 0.3, generator=g1), kf.dropout(x, 0.3, generator=g2)
    assert torch.equal(a, b)
    assert not torch.equal(a, kf.dropout(x, 0.3, generator=g1))  # g1 advanced
    assert torch.equal(torch.get_rng_state(), cpu_state)  # the default generators are untouched
    if device == "cuda":
        assert torch.cuda.default_generators[0].get_offset() == before


@pytest.mark.cuda
def test_cpu_reference_matches_cuda_with_a_cuda_generator(kf):
    x = torch.randn(7, 4099)
    g1, g2 = torch.Generator(device="cuda").manual_seed(11), torch.Generator(device="cuda").manual_seed(11)
    yc, mc = kf.dropout(x.cuda(), 0.25, generator=g1, return_mask=True)
    yh, mh = kf.dropout(x, 0.25, generator=g2, return_mask=True)
    assert torch.equal(mc.cpu(), mh)
    torch.testing.assert_close(yc.cpu(), yh, rtol=1e-6, atol=1e-6)


@pytest.mark.cuda
def test_generator_offset_advances_by_four(kf):
    g = torch.Generator(device="cuda").manual_seed(3)
    x = torch.randn(1 << 16, device="cuda")
    o0 = g.get_offset()
    kf.dropout(x, 0.5, generator=g)
    kf.dropout_add(x, x, 0.5, generator=g)
    assert g.get_offset() == o0 + 8
    # and never the counters of torch's own dropout, which takes [offset, offset + increment)
    _, state, _ = raw_dropout(x, 0.5, g)
    assert int(state[1]) == o0 + 8


# ---- backward ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_backward_uses_the_forward_mask(kf, device, dtype):
    x = torch.randn(5, 1031, device=device).to(dtype).requires_grad_()
    r = torch.randn(5, 1031, device=device).to(dtype).requires_grad_()
    dy = torch.randn(5, 1031, device=device).to(dtype)
    rtol, atol = TOL[dtype]
    y, mask = kf.dropout(x, 0.4, return_mask=True)
    y.backward(dy)
    torch.testing.assert_close(x.grad, (dy.double() * mask / 0.6).to(dtype), rtol=rtol, atol=atol)
    x.grad = None
    torch.manual_seed(5)
    _, mask2 = kf.dropout(x.detach(), 0.4, return_mask=True)
    torch.manual_seed(5)
    z = kf.dropout_add(x, r, 0.4)
    torch.testing.assert_close(z, (r.double() + x.double() * mask2 / 0.6).to(dtype), rtol=rtol, atol=atol)
    z.backward(dy)
    assert torch.equal(r.grad, dy)
    torch.testing.assert_close(x.grad, (dy.double() * mask2 / 0.6).to(dtype), rtol=rtol, atol=atol)


def test_gradcheck(kf):
    """float64 on the CPU; each call gets a generator with one seed, so every evaluation has one mask."""
    x = torch.randn(3, 9, dtype=torch.float64, requires_grad=True)
    r = torch.randn(3, 9, dtype=torch.float64, requires_grad=True)
    fixed = lambda: torch.Generator().manual_seed(1)  # noqa: E731
    assert torch.autograd.gradcheck(lambda t: kf.dropout(t, 0.3, generator=fixed()), (x,))
    assert torch.autograd.gradcheck(lambda a, b: kf.dropout_add(a, b, 0.3, generator=fixed()), (x, r))
    # double backward (create_graph=True): the backward is linear in dy, its own derivative
    assert torch.autograd.gradgradcheck(lambda t: kf.dropout(t, 0.3, generator=fixed()), (x,))
    assert torch.autograd.gradgradcheck(lambda a, b: kf.dropout_add(a, b, 0.3, generator=fixed()), (x, r))


# ---- F.dropout's edges -------------------------------------------------------------------------------
@pytest.mark.parametrize("device", DEVICES)
def test_edges(kf, device):
    x = torch.randn(4, 33, device=device, requires_grad=True)
    assert kf.dropout(x, 0.5, training=False) is x
    assert kf.dropout(x, 0.0) is x
    y, m = kf.dropout(x, 0.0, return_mask=True)
    assert y is x and m.all()
    y = kf.dropout(x, 1.0)
    assert (y == 0).all()
    y.sum().backward()
    assert (x.grad == 0).all()
    r = torch.randn(4, 33, device=device)
    assert torch.equal(kf.dropout_add(x, r, 0.5, training=False), r + x)
    assert torch.equal(kf.dropout_add(x, r, 1.0), r)
    # a dropped inf is NaN, as F.dropout (x * 0)
    inf = torch.full((256,), float("inf"), device=device)
    y, m = kf.dropout(inf, 0.5, return_mask=True)
    assert torch.isnan(y[~m]).all() and (y[m] == float("inf")).all()


@pytest.mark.parametrize("device", DEVICES)
def test_empty_and_noncontiguous(kf, device):
    e = torch.randn(0, 8, device=device)
    y, m = kf.dropout(e, 0.5, return_mask=True)
    assert y.shape == (0, 8) and m.shape == (0, 8)
    assert kf.dropout_add(e, e, 0.5).shape == (0, 8)
    x = torch.randn(64, 33, device=device)
    torch.manual_seed(9)
    a = kf.dropout(x.t(), 0.5)
    torch.manual_seed(9)
    b = kf.dropout(x.t().contiguous(), 0.5)
    assert torch.equal(a, b)  # element i is the i-th of the row-major order, whatever the strides


@pytest.mark.parametrize("device", DEVICES)
def test_errors(kf, device):
    x = torch.randn(4, 8, device=device)
    for p in (-0.1, 1.5):
        with pytest.raises((ValueError, RuntimeError), match=r"dropout: p must lie in \[0, 1\]"):
            kf.dropout(x, p)
        with pytest.raises((ValueError, RuntimeError), match=r"dropout: p must lie in \[0, 1\]"):
            kf.dropout(x, p, training=False)
    with pytest.raises(RuntimeError, match=r"dropout_add: residual must have the shape of x \[4, 8\], got \[8\]"):
        kf.dropout_add(x, torch.randn(8, device=device))
    with pytest.raises(RuntimeError, match="dropout: x must be a (float32/float16/bfloat16|floating-point) tensor"):
        kf.dropout(torch.ones(4, 8, dtype=torch.int32, device=device))
    with pytest.raises(RuntimeError, match="dropout_backward: rng_state must be an int64 tensor"):
        OPS.dropout_backward.default(x, torch.zeros(2, dtype=torch.int32, device=device), 0.5)


@pytest.mark.cuda
def test_cuda_tensors_reject_a_cpu_generator(kf):
    with pytest.raises(ValueError, match="dropout: generator must be a CUDA generator for CUDA tensors"):
        kf.dropout(torch.randn(8, device="cuda"), 0.5, generator=torch.Generator())


# ---- torch.compile, fake tensors, CUDA graphs --------------------------------------------------------
def test_fake_shapes():
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        x = torch.empty(3, 5, dtype=torch.bfloat16)
        y, st, m = OPS.dropout.default(x, 0.5, None, True)
        assert y.shape == (3, 5) and st.shape == (2,) and st.dtype == torch.int64 and m.dtype == torch.bool
        assert OPS.dropout.default(x, 0.5, None, False)[2].shape == (0,)
        assert OPS.dropout_add.default(x, x, 0.5, None)[0].shape == (3, 5)


COMPILE_CASES = [pytest.param("cpu", "aot_eager", id="cpu-aot_eager")] + [
    pytest.param("cuda", "inductor", id="cuda-inductor", marks=pytest.mark.cuda)
]


@pytest.mark.parametrize("device,backend", COMPILE_CASES)
def test_compile(kf, fresh_dynamo, device, backend):
    def block(x, r):
        h = kf.dropout_add(x * 2.0, r, 0.1)
        return kf.dropout(h, 0.5) - kf.dropout(h, 0.5)  # two calls: two masks (not merged by CSE)

    x = torch.randn(8, 256, device=device, requires_grad=True)
    r = torch.randn(8, 256, device=device, requires_grad=True)
    with torch._inductor.config.patch(force_disable_caches=True):
        cblock = torch.compile(block, backend=backend, fullgraph=True)
        torch.manual_seed(1)
        out = cblock(x, r)
        out.sum().backward()
    assert (out != 0).any(), "the two dropout calls were merged into one"
    gx, gr = x.grad.clone(), r.grad.clone()
    x.grad = r.grad = None
    torch.manual_seed(1)
    ref = block(x, r)
    ref.sum().backward()
    # the same generator draws as eager; a compiler may run the two independent dropout calls in the
    # other order, which swaps their masks: out = -ref, and the gradients flip with it
    sign = 1.0 if torch.allclose(out, ref) else -1.0
    torch.testing.assert_close(out, sign * ref)
    torch.testing.assert_close(gx, sign * x.grad)
    torch.testing.assert_close(gr, sign * r.grad)


@pytest.mark.cuda
def test_cuda_graph_replay_draws_new_masks(kf):
    p = 0.5
    x = torch.randn(4, 4099, device="cuda")
    dy = torch.randn(4, 4099, device="cuda")
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):  # warm up outside the capture
        raw_dropout(x, p)
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y, state, mask = raw_dropout(x, p)
        dx = OPS.dropout_backward.default(dy, state, p)
        y2, state2 = OPS.dropout_add.default(x, y, p, None)
    seen = []
    for _ in range(3):
        graph.replay()
        torch.cuda.synchronize()
        seed, offset = (int(v) for v in state.cpu())
        assert torch.equal(mask.cpu(), expected_mask(x.numel(), seed, offset, p).reshape(x.shape))
        torch.testing.assert_close(y, x * mask / (1 - p))
        torch.testing.assert_close(dx, dy * mask / (1 - p))  # the backward matches the replayed forward
        assert int(state2[1]) == offset + 4 and int(state2[0]) == seed
        seen.append(mask.clone())
    assert not torch.equal(seen[0], seen[1]) and not torch.equal(seen[1], seen[2])


@pytest.mark.cuda
def test_matches_torch_dropout_statistics_not_bits(kf):
    """Same expectation as F.dropout (E[y] = x), different streams: the masks are not torch's."""
    x = torch.ones(1 << 20, device="cuda")
    y = kf.dropout(x, 0.2)
    assert abs(y.mean().item() - 1.0) < 6 * math.sqrt(0.2 / 0.8 / x.numel())
    assert not torch.equal(y != 0, F.dropout(x, 0.2) != 0)
