"""kernelforge as torch's flash attention implementation (kernelforge.sdpa_impl).

CPU: the registration and activation (no GPU needed); the math fallback (math_forward /
math_backward) against autograd of SDPA's math and of the contract's float64 formula, dropout's
forward / backward agreement; the four overrides registered for the CPU key in a test-only library
(the kernel path then runs the op's float64 reference), called through the aten ops and their aten
autograd formulas, and through torch.nn.attention.varlen.varlen_attn; the announced fallback
(a warning once, KF_STRICT=1: an error) and the errors.

CUDA: activated, ``F.scaled_dot_product_attention`` under ``sdpa_kernel(FLASH_ATTENTION)``, varlen_attn
and torch.compile run kernelforge's op (a counting spy around it), outputs within TOL[dtype].attn of
float32 math SDPA and gradients within test_attention_backward's criterion (twice torch's own flash
error plus a floor). Every test restores torch's implementation, even on failure.
"""

from __future__ import annotations

import math
import warnings

import pytest
import torch
import torch.nn.functional as F

from kernelforge.specs.attention import attention_ref

if not hasattr(torch.nn.attention, "register_flash_attention_impl"):
    pytest.skip("torch has no flash attention registry (torch >= 2.11)", allow_module_level=True)

from test_attention import close  # noqa: E402
from test_attention_backward import _judge, assert_close64  # noqa: E402
from torch.nn.attention import SDPBackend, sdpa_kernel  # noqa: E402

f64 = torch.float64
aten = torch.ops.aten


@pytest.fixture
def si(kf):
    """kernelforge.sdpa_impl; torch's implementation is restored after the test, whatever happened."""
    from kernelforge import sdpa_impl

    yield sdpa_impl
    sdpa_impl.restore()
    assert torch.nn.attention.current_flash_attention_impl() != sdpa_impl.NAME


@pytest.fixture
def cpu_overrides(si):
    """The four overrides registered for the CPU key (aten has no CPU kernel for these ops), removed
    after the test."""
    handle = si._register("CPU")
    yield si
    handle.remove()


@pytest.fixture
def fresh_warnings(monkeypatch):
    from kernelforge.patch import _runtime

    monkeypatch.setattr(_runtime, "warned", set())
    monkeypatch.delenv("KF_STRICT", raising=False)


class Spy:
    """Counts the calls of kernelforge's ops made by sdpa_impl (monkeypatched over its _ops)."""

    def __init__(self, ops):
        self.ops, self.forward, self.backward = ops, 0, 0

    def attention(self, *a, **kw):
        self.forward += 1
        return self.ops.attention(*a, **kw)

    def attention_backward(self, *a, **kw):
        self.backward += 1
        return self.ops.attention_backward(*a, **kw)


@pytest.fixture
def spy(si, monkeypatch):
    s = Spy(si._ops)
    monkeypatch.setattr(si, "_ops", s)
    return s


def grads(f, xs, dout):
    xs = [x.detach().clone().requires_grad_() for x in xs]
    out = f(*xs)
    return out.detach(), torch.autograd.grad(out, xs, dout)


# ---- registration and activation (no GPU needed) ------------------------------------------------------


def test_registered_not_activated(si):
    assert si.NAME in torch.nn.attention.list_flash_attention_impls()
    assert torch.nn.attention.current_flash_attention_impl() != si.NAME  # importing does not activate


def test_activate_and_restore(si):
    torch.nn.attention.activate_flash_attention_impl("kernelforge")
    assert torch.nn.attention.current_flash_attention_impl() == "kernelforge"
    torch.nn.attention.restore_flash_attention_impl()
    assert torch.nn.attention.current_flash_attention_impl() is None
    si.activate()
    assert torch.nn.attention.current_flash_attention_impl() == "kernelforge"
    si.restore()
    assert torch.nn.attention.current_flash_attention_impl() is None
    si.restore()  # nothing active: a no-op


def test_handle_remove_drops_the_overrides(si):
    q = torch.randn(1, 2, 3, 64, dtype=f64)
    handle = si._register("CPU")
    assert aten._scaled_dot_product_flash_attention(q, q, q)[0].shape == q.shape
    handle.remove()
    handle.remove()  # twice: harmless
    with pytest.raises(NotImplementedError):
        aten._scaled_dot_product_flash_attention(q, q, q)


# ---- the math fallback against autograd ----------------------------------------------------------------

# (B, Hq, Hkv, Sq, Sk, causal, scale): MHA, GQA 2:1 / 4:1, top-left causal with Sq > Sk and Sq < Sk
MATH_CASES = [(2, 2, 2, 7, 7, False, None), (2, 4, 2, 9, 9, True, None), (1, 4, 1, 12, 7, True, 0.3),
              (2, 4, 2, 5, 11, True, None), (1, 2, 1, 6, 13, False, 0.2), (1, 3, 3, 1, 8, True, None)]


@pytest.mark.parametrize("case", MATH_CASES, ids=str)
def test_math_matches_sdpa_autograd(si, case):
    B, hq, hkv, sq, sk, causal, scale = case
    q = torch.randn(B, hq, sq, 40, dtype=f64)
    k = torch.randn(B, hkv, sk, 40, dtype=f64)
    v = torch.randn(B, hkv, sk, 24, dtype=f64)
    dout = torch.randn(B, hq, sq, 24, dtype=f64)
    opts = dict(scale=scale, causal=causal, top_left=True)
    out, lse = si.math_forward(q, k, v, **opts)
    want, gw = grads(lambda *x: F.scaled_dot_product_attention(*x, is_causal=causal, scale=scale, enable_gqa=True),
                     (q, k, v), dout)
    assert_close64("out", out, want, tol=1e-12)
    s = (q @ k.repeat_interleave(hq // hkv, 1).transpose(-1, -2)) * (scale or 1 / math.sqrt(40))
    if causal:
        s = s.masked_fill(torch.ones(sq, sk, dtype=torch.bool).triu(1), float("-inf"))
    assert_close64("lse", lse, torch.logsumexp(s, -1), tol=1e-12)
    got = si.math_backward(dout, q, k, v, out, lse, **opts)
    for n, g, w in zip("qkv", got, gw):
        assert_close64(f"d{n}", g, w, tol=1e-10)


@pytest.mark.parametrize("opts", [{"causal": True}, {"causal": True, "window": (2, 0)}, {"window": (1, 3)}], ids=str)
@pytest.mark.parametrize("sq,sk", [(6, 6), (4, 9), (8, 3)])
def test_math_bottom_right_matches_contract(si, opts, sq, sk):
    """flash-attn's bottom-right causal / window (the contract's float64 formula, attention_ref);
    Sq > Sk causal: the first rows see no key (out 0, lse -inf, no gradient)."""
    q = torch.randn(2, 4, sq, 64, dtype=f64)
    k, v = (torch.randn(2, 2, sk, 64, dtype=f64) for _ in range(2))
    dout = torch.randn(2, 4, sq, 64, dtype=f64)
    window = opts.get("window", (-1, -1))
    out, lse = si.math_forward(q, k, v, causal=opts.get("causal", False), window=window)
    want, gw = grads(lambda *x: attention_ref(*x, layout="bhsd", **opts)[0], (q, k, v), dout)
    _, want_lse = attention_ref(q, k, v, layout="bhsd", **opts)
    assert_close64("out", out, want, tol=1e-12)
    assert torch.equal(torch.isinf(lse), torch.isinf(want_lse))
    fin = ~torch.isinf(want_lse)
    assert_close64("lse", lse[fin], want_lse[fin], tol=1e-12)
    got = si.math_backward(dout, q, k, v, out, lse, causal=opts.get("causal", False), window=window)
    for n, g, w in zip("qkv", got, gw):
        assert_close64(f"d{n}", g, w, tol=1e-10)


def _dropout_ref(q, k, v, p, seed, causal):
    """SDPA's formula with the keep mask replayed from the generator the math path draws from."""
    s = (q @ k.transpose(-1, -2)) / math.sqrt(q.shape[-1])
    if causal:
        s = s.masked_fill(torch.ones(s.shape[-2:], dtype=torch.bool).triu(1), float("-inf"))
    keep = torch.rand(s.shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float32) >= p
    return (torch.softmax(s, -1) * keep / (1 - p)) @ v


@pytest.mark.parametrize("causal", [False, True])
def test_math_dropout_forward_backward_agree(si, causal):
    q, k, v = (torch.randn(2, 2, 9, 64, dtype=f64) for _ in range(3))
    dout = torch.randn_like(q)
    p, seed = 0.3, 1234

    def gen():
        return torch.Generator().manual_seed(seed)

    out, lse = si.math_forward(q, k, v, causal=causal, top_left=True, dropout_p=p, generator=gen())
    again, _ = si.math_forward(q, k, v, causal=causal, top_left=True, dropout_p=p, generator=gen())
    other, _ = si.math_forward(q, k, v, causal=causal, top_left=True, dropout_p=p,
                               generator=torch.Generator().manual_seed(seed + 1))
    assert torch.equal(out, again) and not torch.allclose(out, other)
    want, gw = grads(lambda *x: _dropout_ref(*x, p, seed, causal), (q, k, v), dout)
    assert_close64("out", out, want, tol=1e-12)
    got = si.math_backward(dout, q, k, v, out, lse, causal=causal, top_left=True, dropout_p=p, generator=gen())
    for n, g, w in zip("qkv", got, gw):
        assert_close64(f"d{n}", g, w, tol=1e-10)


# ---- the overrides through the aten ops (registered for the CPU key) ---------------------------------------

# (B, Hq, Hkv, Sq, Sk, D, causal, memory): SDPA's top-left causal (Sq = Sk, Sq > Sk, Sq < Sk), GQA,
# inputs as [B, H, S, D] memory or as transposed [B, S, H, D] memory (the kernel's bshd layout)
SDPA_CASES = [(2, 4, 2, 9, 9, 64, True, "bhsd"), (2, 4, 4, 12, 7, 64, True, "bshd"),
              (2, 4, 1, 5, 11, 128, True, "bhsd"), (1, 2, 2, 6, 10, 96, False, "bshd"),
              (1, 2, 1, 1, 7, 256, True, "bhsd"), (2, 2, 2, 8, 8, 64, False, "bhsd")]


def _heads(B, H, S, D, memory, dtype=f64):
    if memory == "bshd":
        return torch.randn(B, S, H, D, dtype=dtype).transpose(1, 2)
    return torch.randn(B, H, S, D, dtype=dtype)


@pytest.mark.parametrize("case", SDPA_CASES, ids=str)
def test_sdpa_op_kernel_path(cpu_overrides, spy, case):
    """aten::_scaled_dot_product_flash_attention and its backward (aten's autograd formula) run
    kernelforge's op: values and gradients of SDPA, the outputs aten's meta promises."""
    B, hq, hkv, sq, sk, D, causal, memory = case
    q, k, v = _heads(B, hq, sq, D, memory), _heads(B, hkv, sk, D, memory), _heads(B, hkv, sk, D, memory)
    dout = torch.randn(B, hq, sq, D, dtype=f64)
    xs = [t.clone().requires_grad_() for t in (q, k, v)]
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the kernel path: no fallback
        res = aten._scaled_dot_product_flash_attention(*xs, 0.0, causal, scale=0.25)
        out, lse = res[0], res[1]
        got = torch.autograd.grad(out, xs, dout)
    assert spy.forward == 1 and spy.backward == 1
    want, gw = grads(lambda *x: F.scaled_dot_product_attention(*x, is_causal=causal, scale=0.25, enable_gqa=True),
                     (q, k, v), dout)
    assert_close64("out", out.detach(), want, tol=1e-12)
    for n, g, w, x in zip("qkv", got, gw, xs):
        assert_close64(f"d{n}", g, w, tol=2e-6)  # p = exp(s - lse) with the float32 lse of the contract
        assert g.stride() == torch.empty_like(x).stride(), f"d{n} strides"
    assert out.stride() == torch.empty_like(q).stride()
    assert lse.dtype == torch.float32 and lse.shape == (B, hq, sq)
    assert res[2] is None and res[3] is None and res[4] == sq and res[5] == sk
    assert res[6].dtype == torch.uint64 and res[6].shape == (2,) and res[7].dtype == torch.uint64 and res[7].dim() == 0
    assert res[8].numel() == 0


def test_sdpa_op_cpu_float32(cpu_overrides, spy):
    """float32 CPU runs the float64 reference and is rounded once to float32."""
    q, k, v = (torch.randn(1, 2, 6, 64) for _ in range(3))
    out = aten._scaled_dot_product_flash_attention(q, k, v, 0.0, True)[0]
    want = F.scaled_dot_product_attention(q.double(), k.double(), v.double(), is_causal=True)
    assert out.dtype == torch.float32 and spy.forward == 1
    close(out, want, torch.float32, "out")


@pytest.mark.parametrize("opts", [{}, {"causal": True}, {"causal": True, "window": (3, 5)}, {"window": (2, 1)}],
                         ids=str)
def test_flash_forward_dense_and_varlen(cpu_overrides, spy, opts):
    """aten::_flash_attention_forward / _backward: [B, S, H, D] and packed varlen; flash-attn's
    bottom-right causal (right window forced to 0) and windows; GQA; the contract's formula."""
    causal = opts.get("causal", False)  # scale: a float32 value (the op takes the scale as a float)
    left, right = opts.get("window", (None, None))
    ref_opts = dict(causal=causal, window=(left if left is not None else -1, 0 if causal else
                                           (right if right is not None else -1)), scale=0.375)
    q = torch.randn(2, 7, 4, 64, dtype=f64)
    k, v = (torch.randn(2, 10, 2, 64, dtype=f64) for _ in range(2))
    dout = torch.randn_like(q)

    def dense(*x):
        return aten._flash_attention_forward(*x, None, None, 7, 10, 0.0, causal, False, scale=0.375,
                                             window_size_left=left, window_size_right=right)[0]

    out, got = grads(dense, (q, k, v), dout)
    want, gw = grads(lambda *x: attention_ref(*x, **ref_opts)[0], (q, k, v), dout)
    assert_close64("out", out, want, tol=1e-12)
    for n, g, w in zip("qkv", got, gw):
        assert_close64(f"d{n}", g, w, tol=2e-6)

    cu_q = torch.tensor([0, 3, 3, 10], dtype=torch.int32)  # an empty sequence, Sq != Sk per sequence
    cu_k = torch.tensor([0, 5, 7, 15], dtype=torch.int32)
    q = torch.randn(10, 4, 64, dtype=f64)
    k, v = (torch.randn(15, 2, 64, dtype=f64) for _ in range(2))
    dout = torch.randn_like(q)

    def packed(*x):
        res = aten._flash_attention_forward(*x, cu_q, cu_k, 7, 8, 0.0, causal, False, scale=0.375,
                                            window_size_left=left, window_size_right=right)
        assert res[1].shape == (4, 10) and res[1].dtype == torch.float32
        return res[0]

    out, got = grads(packed, (q, k, v), dout)
    want, gw = grads(lambda *x: attention_ref(*x, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, layout="varlen",
                                              **ref_opts)[0], (q, k, v), dout)
    assert_close64("out", out, want, tol=1e-12)
    for n, g, w in zip("qkv", got, gw):
        assert_close64(f"d{n}", g, w, tol=2e-6)
    assert spy.forward == 2 and spy.backward == 2


@pytest.mark.parametrize("window", [(-1, -1), (-1, 0), (2, 0)], ids=str)
def test_varlen_attn(cpu_overrides, spy, window):
    """torch.nn.attention.varlen.varlen_attn reaches _flash_attention_forward / _backward."""
    from torch.nn.attention.varlen import AuxRequest, varlen_attn

    cu = torch.tensor([0, 5, 6, 14], dtype=torch.int32)
    q, k, v = (torch.randn(14, 2, 64, dtype=f64) for _ in range(3))
    dout = torch.randn_like(q)
    xs = [t.clone().requires_grad_() for t in (q, k, v)]
    out, lse = varlen_attn(*xs, cu, cu, 8, 8, window_size=window, return_aux=AuxRequest(lse=True))
    got = torch.autograd.grad(out, xs, dout)
    causal = window[1] == 0
    want, gw = grads(lambda *x: attention_ref(*x, cu_seqlens_q=cu, cu_seqlens_k=cu, layout="varlen", causal=causal,
                                              window=window)[0], (q, k, v), dout)
    _, want_lse = attention_ref(q, k, v, cu_seqlens_q=cu, cu_seqlens_k=cu, layout="varlen", causal=causal,
                                window=window)
    assert_close64("out", out.detach(), want, tol=1e-12)
    assert_close64("lse", lse.double(), want_lse, tol=1e-6)
    for n, g, w in zip("qkv", got, gw):
        assert_close64(f"d{n}", g, w, tol=2e-6)
    assert spy.forward == 1 and spy.backward == 1


def test_fallback_warns_once_and_strict_raises(cpu_overrides, spy, fresh_warnings, monkeypatch):
    """A head dim the kernels do not take runs the math path, announced once; KF_STRICT=1: an error."""
    q, k, v = (torch.randn(1, 2, 5, 80, dtype=f64) for _ in range(3))
    xs = [t.clone().requires_grad_() for t in (q, k, v)]
    dout = torch.randn_like(q)
    with pytest.warns(UserWarning, match=r"head dims 80/80.*math"):
        out = aten._scaled_dot_product_flash_attention(*xs, 0.0, True)[0]
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # once per reason: no second forward warning
        aten._scaled_dot_product_flash_attention(q, k, v, 0.0, True)
    with pytest.warns(UserWarning, match=r"_scaled_dot_product_flash_attention_backward.*head dims 80/80"):
        got = torch.autograd.grad(out, xs, dout)
    assert spy.forward == 0 and spy.backward == 0
    want, gw = grads(lambda *x: F.scaled_dot_product_attention(*x, is_causal=True), (q, k, v), dout)
    assert_close64("out", out.detach(), want, tol=1e-12)
    for n, g, w in zip("qkv", got, gw):
        assert_close64(f"d{n}", g, w, tol=1e-6)
    monkeypatch.setenv("KF_STRICT", "1")
    with pytest.raises(RuntimeError, match="KF_STRICT=1"):
        aten._scaled_dot_product_flash_attention(q, k, v, 0.0, True)


@pytest.mark.parametrize("causal", [False, True])
def test_sdpa_op_dropout(cpu_overrides, fresh_warnings, causal):
    """dropout_p > 0: the seed drawn by the forward travels in rng_state; the backward's mask is the
    forward's (gradients of the formula with the replayed mask); torch.manual_seed reproduces it."""
    q, k, v = (torch.randn(2, 2, 9, 64, dtype=f64) for _ in range(3))
    xs = [t.clone().requires_grad_() for t in (q, k, v)]
    dout = torch.randn_like(q)
    with pytest.warns(UserWarning, match="dropout_p=0.25"):
        torch.manual_seed(7)
        res = aten._scaled_dot_product_flash_attention(*xs, 0.25, causal)
        got = torch.autograd.grad(res[0], xs, dout)
    seed = int(res[6].view(torch.int64)[0])
    torch.manual_seed(7)
    assert torch.equal(res[0], aten._scaled_dot_product_flash_attention(q, k, v, 0.25, causal)[0])
    want, gw = grads(lambda *x: _dropout_ref(*x, 0.25, seed, causal), (q, k, v), dout)
    assert_close64("out", res[0].detach(), want, tol=1e-12)
    for n, g, w in zip("qkv", got, gw):
        assert_close64(f"d{n}", g, w, tol=1e-6)


def test_flash_forward_dropout_varlen(cpu_overrides, fresh_warnings):
    """Packed sequences with dropout: forward and backward draw the same masks in the same order."""
    cu = torch.tensor([0, 4, 11], dtype=torch.int32)
    q, k, v = (torch.randn(11, 2, 64, dtype=f64) for _ in range(3))
    xs = [t.clone().requires_grad_() for t in (q, k, v)]
    dout = torch.randn_like(q)
    with pytest.warns(UserWarning, match="dropout_p=0.5"):
        res = aten._flash_attention_forward(*xs, cu, cu, 7, 7, 0.5, True, False)
        got = torch.autograd.grad(res[0], xs, dout)
    gen = torch.Generator().manual_seed(int(res[2].view(torch.int64)[0]))

    def ref(q, k, v):
        outs = []
        for s, e in ((0, 4), (4, 11)):
            qs, ks, vs = (t[s:e].transpose(0, 1) for t in (q, k, v))
            sc = (qs @ ks.transpose(-1, -2)) / 8.0
            sc = sc.masked_fill(torch.ones(e - s, e - s, dtype=torch.bool).triu(1), float("-inf"))
            keep = torch.rand(sc.shape, generator=gen, dtype=torch.float32) >= 0.5
            outs.append(((torch.softmax(sc, -1) * keep * 2.0) @ vs).transpose(0, 1))
        return torch.cat(outs)

    want, gw = grads(ref, (q, k, v), dout)
    assert_close64("out", res[0].detach(), want, tol=1e-12)
    for n, g, w in zip("qkv", got, gw):
        assert_close64(f"d{n}", g, w, tol=1e-6)


def test_alibi_and_seqused_k(cpu_overrides, fresh_warnings):
    """alibi_slopes / seqused_k: forward only (the backward op receives neither): an error when a
    gradient is needed, the formula under no_grad."""
    q, k, v = (torch.randn(2, 6, 2, 64, dtype=f64) for _ in range(3))
    slopes = torch.tensor([0.5, 0.25], dtype=torch.float32)
    with pytest.raises(NotImplementedError, match="alibi_slopes"):
        aten._flash_attention_forward(q.requires_grad_(), k, v, None, None, 6, 6, 0.0, True, False, alibi_slopes=slopes)
    q = q.detach()
    with torch.no_grad(), pytest.warns(UserWarning, match="alibi_slopes"):
        out = aten._flash_attention_forward(q, k, v, None, None, 6, 6, 0.0, True, False, alibi_slopes=slopes)[0]
    s = torch.einsum("bihd,bjhd->bhij", q, k) / 8.0
    i, j = torch.arange(6)[:, None], torch.arange(6)[None, :]
    s = s - slopes.double().view(1, 2, 1, 1) * (i - j).abs() + torch.where(j > i, float("-inf"), 0.0)
    assert_close64("alibi out", out, torch.einsum("bhij,bjhd->bihd", torch.softmax(s, -1), v), tol=1e-12)
    used = torch.tensor([4, 6], dtype=torch.int32)
    with torch.no_grad(), pytest.warns(UserWarning, match="seqused_k"):
        out = aten._flash_attention_forward(q, k, v, None, None, 6, 6, 0.0, False, False, seqused_k=used)[0]
    for b, n in enumerate(used.tolist()):
        want, _ = attention_ref(q[b:b + 1], k[b:b + 1, :n], v[b:b + 1, :n])
        assert_close64(f"seqused_k row {b}", out[b:b + 1], want, tol=1e-12)


def test_errors(cpu_overrides):
    q = torch.randn(1, 2, 4, 64, dtype=f64)
    with pytest.raises(NotImplementedError, match="return_debug_mask"):
        aten._scaled_dot_product_flash_attention(q, q, q, 0.0, False, True)
    with pytest.raises(ValueError, match="query, key and value must have one floating dtype"):
        aten._scaled_dot_product_flash_attention(q, q.float(), q)
    with pytest.raises(ValueError, match=r"query heads \(2\) must be a multiple of the key/value heads \(3\)"):
        k = torch.randn(1, 3, 4, 64, dtype=f64)
        aten._scaled_dot_product_flash_attention(q, k, k)
    with pytest.raises(ValueError, match=r"query must have 3 dimensions \[T, H, D\]"):
        cu = torch.tensor([0, 4], dtype=torch.int32)
        aten._flash_attention_forward(q, q, q, cu, cu, 4, 4, 0.0, False, False)


@torch._dynamo.config.patch(error_on_recompile=True)
def test_compile_cpu(cpu_overrides, spy, fresh_dynamo):
    """torch.compile(fullgraph=True) of a train step through the aten op: the overrides run at run
    time (aten's meta traces them), gradients equal eager's."""
    def f(q, k, v):
        return aten._scaled_dot_product_flash_attention(q, k, v, 0.0, True, scale=0.2)[0].sum(-1)

    compiled = torch.compile(f, fullgraph=True, backend="aot_eager")
    q, k, v = (torch.randn(2, 2, 7, 64, dtype=f64) for _ in range(3))
    dout = torch.randn(2, 2, 7, dtype=f64)
    out_c, g_c = grads(compiled, (q, k, v), dout)
    out_e, g_e = grads(f, (q, k, v), dout)
    assert spy.forward == 2 and spy.backward == 2
    assert torch.equal(out_c, out_e)
    for a, b in zip(g_c, g_e):
        assert torch.equal(a, b)


# ---- CUDA: activated, through torch's public APIs -------------------------------------------------------

HALF = [pytest.param(torch.bfloat16, id="bfloat16"), pytest.param(torch.float16, id="float16")]

# (B, Hq, Hkv, Sq, Sk, D, causal, memory)
GPU_CASES = [(2, 4, 4, 256, 256, 64, False, "bhsd"), (2, 4, 4, 256, 256, 64, True, "bshd"),
             (1, 8, 2, 200, 200, 128, True, "bshd"), (2, 4, 4, 128, 320, 128, False, "bhsd"),
             (1, 8, 2, 300, 77, 128, False, "bshd"), (1, 4, 4, 130, 130, 256, True, "bhsd"),
             (1, 4, 1, 130, 190, 256, False, "bhsd")]


def _sdpa(q, k, v, causal, backend):
    with sdpa_kernel([backend]):
        return F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=q.shape[1] != k.shape[1])


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", HALF)
@pytest.mark.parametrize("case", GPU_CASES, ids=str)
def test_gpu_sdpa_flash_runs_kernelforge(si, spy, dtype, case):
    B, hq, hkv, sq, sk, D, causal, memory = case
    q, k, v = (_heads(B, h, s, D, memory, dtype).cuda() for h, s in ((hq, sq), (hkv, sk), (hkv, sk)))
    dout = torch.randn(B, hq, sq, D, device="cuda", dtype=dtype)
    ref_out, ref_g = grads(lambda *x: _sdpa(*x, causal, SDPBackend.MATH), [t.float() for t in (q, k, v)], dout.float())
    _, pt_g = grads(lambda *x: _sdpa(*x, causal, SDPBackend.FLASH_ATTENTION), (q, k, v), dout)  # torch's own flash
    assert spy.forward == 0
    si.activate()
    out, got = grads(lambda *x: _sdpa(*x, causal, SDPBackend.FLASH_ATTENTION), (q, k, v), dout)
    assert spy.forward == 1 and spy.backward == 1, "kernelforge's op did not run"
    assert out.dtype == dtype and out.shape == (B, hq, sq, D)
    close(out, ref_out, dtype, "out")
    for n, g, gp, gr, x in zip("qkv", got, pt_g, ref_g, (q, k, v)):
        assert g.dtype == dtype and g.shape == x.shape
        _judge(f"d{n}", g, gp, gr)


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", HALF)
@pytest.mark.parametrize("window", [(-1, -1), (-1, 0)], ids=str)
def test_gpu_varlen_attn(si, spy, dtype, window):
    from torch.nn.attention.varlen import varlen_attn

    lens = [37, 128, 65, 1]
    cu = torch.tensor([0] + lens, device="cuda").cumsum(0).to(torch.int32)
    q, k, v = (torch.randn(sum(lens), 4, 128, device="cuda", dtype=dtype) for _ in range(3))
    dout = torch.randn_like(q)
    causal = window == (-1, 0)

    def ref(q, k, v):  # float32 math SDPA per sequence (Sq == Sk: both causal conventions agree)
        b = cu.tolist()
        return torch.cat([_sdpa(*(t[s:e].transpose(0, 1)[None] for t in (q, k, v)), causal, SDPBackend.MATH)[0]
                          .transpose(0, 1) for s, e in zip(b[:-1], b[1:])])

    def kf_varlen(*x):
        return varlen_attn(*x, cu, cu, max(lens), max(lens), window_size=window)

    ref_out, ref_g = grads(ref, [t.float() for t in (q, k, v)], dout.float())
    _, pt_g = grads(kf_varlen, (q, k, v), dout)  # torch's own flash
    si.activate()
    out, got = grads(kf_varlen, (q, k, v), dout)
    assert spy.forward == 1 and spy.backward == 1, "kernelforge's op did not run"
    close(out, ref_out, dtype, "out")
    for n, g, gp, gr in zip("qkv", got, pt_g, ref_g):
        _judge(f"d{n}", g, gp, gr)


@pytest.mark.cuda
def test_gpu_compile_fullgraph(si, spy, fresh_dynamo):
    """torch.compile(fullgraph=True) of a function calling SDPA while kernelforge is active: the
    compiled forward and backward call the overrides."""
    dtype = torch.bfloat16
    q, k, v = (torch.randn(2, 4, 256, 128, device="cuda", dtype=dtype) for _ in range(3))
    w = torch.randn(128, 128, device="cuda", dtype=dtype) / 16

    def f(q, k, v):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True) @ w

    dout = torch.randn(2, 4, 256, 128, device="cuda", dtype=dtype)
    ref_out, ref_g = grads(lambda *x: _sdpa(*x, True, SDPBackend.MATH) @ w.float(), [t.float() for t in (q, k, v)],
                           dout.float())
    _, pt_g = grads(lambda *x: _sdpa(*x, True, SDPBackend.FLASH_ATTENTION) @ w, (q, k, v), dout)
    si.activate()
    compiled = torch.compile(f, fullgraph=True)
    with sdpa_kernel([SDPBackend.FLASH_ATTENTION]):
        out, got = grads(compiled, (q, k, v), dout)
    assert spy.forward >= 1 and spy.backward >= 1, "kernelforge's op did not run under torch.compile"
    close(out, ref_out, dtype, "out")
    for n, g, gp, gr in zip("qkv", got, pt_g, ref_g):
        _judge(f"d{n}", g, gp, gr)
