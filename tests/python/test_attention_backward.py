"""The attention backward: gradients of kernelforge.attention (q, k, v, sinks) through the op's
autograd Function and kernelforge::attention_backward.

CPU tensors run the float64 C++ reference backward; its gradients are compared with torch autograd of
the float64 eager formula (kernelforge.specs.attention.attention_ref, masks built from the contract)
over every feature (causal with Sq != Sk, windows, softcap, sinks, GQA / MQA, ragged varlen, every
head dim pair), and with finite differences (gradcheck). CUDA tensors (float16 / bfloat16) run the
kernels: their gradients are compared with float32 SDPA math-backend gradients at model shapes, within
a factor of torch's own half-precision SDPA error; deterministic mode is bit-identical on reruns; the
forward + backward captures into a CUDA graph and compiles with torch.compile(fullgraph=True).
"""

from __future__ import annotations

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from kernelforge.specs.attention import attention_ref, make_inputs

f64 = torch.float64

# (B, Sq, Sk, Hq, Hkv, Dqk, Dv): every head dim pair; GQA 2:1 / 4:1, MQA; Sq < Sk and Sq > Sk (bottom-
# right causal: the first Sq - Sk rows see no key and get no gradient); a single query row
SHAPES = [(2, 5, 5, 2, 2, 64, 64), (1, 4, 7, 4, 1, 96, 96), (2, 6, 3, 4, 2, 128, 128),
          (1, 4, 4, 2, 1, 192, 128), (1, 3, 3, 2, 2, 256, 256), (2, 1, 6, 4, 2, 64, 64)]
VARIANTS = [
    {},
    {"causal": True},
    {"causal": True, "window": (2, 0)},
    {"window": (1, 2)},
    {"softcap": 2.0},  # small: the tanh saturates, its derivative matters
    {"causal": True, "softcap": 5.0},
    {"causal": True, "sinks": True},
    {"window": (0, 0), "sinks": True},
    {"scale": 0.375},
]
LAYOUTS = ["bshd", "bhsd", "varlen"]


def vid(v: dict) -> str:
    return "-".join(f"{k}={v[k]}" for k in v) or "plain"


def opts(v: dict) -> dict:
    return {k: v[k] for k in ("causal", "window", "softcap", "scale") if k in v}


def tensor_args(t: dict) -> dict:
    return {k: t[k] for k in ("sinks", "cu_seqlens_q", "cu_seqlens_k", "max_seqlen_q", "max_seqlen_k")}


def leaves(t: dict) -> list[str]:
    return ["q", "k", "v"] + (["sinks"] if t["sinks"] is not None else [])


def grads_kf(kf, t, v, layout, dout, deterministic=False):
    x = {n: t[n].detach().clone().requires_grad_() for n in leaves(t)}
    args = {**tensor_args(t), **{n: x[n] for n in x if n == "sinks"}}
    out = kf.attention(x["q"], x["k"], x["v"], layout=layout, deterministic=deterministic, **opts(v), **args)
    out.backward(dout)
    return out.detach(), {n: x[n].grad for n in x}


def grads_ref(t, v, layout, dout):
    x = {n: t[n].detach().to("cpu", f64).requires_grad_() for n in leaves(t)}
    cpu = {k: (a.cpu() if isinstance(a, torch.Tensor) else a) for k, a in tensor_args(t).items()}
    out, _ = attention_ref(x["q"], x["k"], x["v"], sinks=x.get("sinks"), cu_seqlens_q=cpu["cu_seqlens_q"],
                           cu_seqlens_k=cpu["cu_seqlens_k"], layout=layout, **opts(v))
    out.backward(dout.to("cpu", f64))
    return out.detach(), {n: x[n].grad for n in x}


def assert_close64(name, got, want, tol=1e-9):
    """float64 CPU: |got - want| <= tol (1 + |want|). The reference's saved lse is float32: p = exp(s -
    lse) carries its rounding (about 1e-7 relative), the one loss of precision on this path."""
    assert got.shape == want.shape and got.dtype == want.dtype, f"{name}: {got.shape} {got.dtype} vs {want.shape}"
    assert torch.isfinite(got).all(), f"{name}: non-finite values"
    err = ((got.double() - want.double()).abs() / (1 + want.double().abs())).max().item() if got.numel() else 0.0
    assert err <= tol, f"{name}: max error {err:.3e} > {tol:.0e}"


# ---- CPU: the float64 reference backward against autograd of the eager formula -------------------


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("v", VARIANTS, ids=vid)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_grads_match_eager_autograd(kf, shape, v, layout):
    t = make_inputs(shape, {"layout": layout, "sinks": v.get("sinks")}, f64, "cpu")
    if t["sinks"] is not None:
        t["sinks"] = t["sinks"].to(f64)
    dout = torch.randn(*t["q"].shape[:-1], t["v"].shape[-1], dtype=f64)
    out, got = grads_kf(kf, t, v, layout, dout)
    want_out, want = grads_ref(t, v, layout, dout)
    assert_close64("out", out, want_out)
    for n in want:
        assert_close64(f"d{n}", got[n], want[n], tol=2e-6)


@pytest.mark.parametrize("sinks_dtype", [torch.float32, torch.bfloat16])
def test_sinks_grad_in_sinks_dtype(kf, sinks_dtype):
    """dsinks is summed in float32 and returned in sinks' dtype (float32, or q's dtype)."""
    q, k, v = (torch.randn(2, 5, 4, 64, dtype=torch.bfloat16) for _ in range(3))
    sinks = torch.randn(4, dtype=sinks_dtype, requires_grad=True)
    out = kf.attention(q, k, v, causal=True, sinks=sinks)
    dout = torch.randn_like(out)
    out.backward(dout)
    assert sinks.grad.dtype == sinks_dtype and sinks.grad.shape == (4,)
    s64 = sinks.detach().double().requires_grad_()
    o64, _ = attention_ref(q, k, v, causal=True, sinks=s64)
    o64.backward(dout.double())
    err = (sinks.grad.double() - s64.grad).abs().max().item()
    assert err <= 2e-2 * (1 + s64.grad.abs().max().item()), f"dsinks error {err:.2e}"


def test_varlen_ragged_grads_per_sequence(kf):
    """Ragged varlen (an empty sequence, Sk != Sq): each sequence's gradients are those of that
    sequence run alone in bshd (no leakage across cu_seqlens boundaries)."""
    t = make_inputs((3, 6, 8, 4, 2, 64, 64), {"layout": "varlen", "sinks": True}, f64, "cpu")
    t["sinks"] = t["sinks"].to(f64)
    v = {"causal": True, "window": (3, 0)}
    dout = torch.randn(t["q"].shape[0], 4, 64, dtype=f64)
    _, got = grads_kf(kf, t, v, "varlen", dout)
    cq, ck = t["cu_seqlens_q"].tolist(), t["cu_seqlens_k"].tolist()
    dsinks = torch.zeros(4, dtype=f64)
    for b in range(3):
        one = {"q": t["q"][None, cq[b]:cq[b + 1]], "k": t["k"][None, ck[b]:ck[b + 1]],
               "v": t["v"][None, ck[b]:ck[b + 1]], "sinks": t["sinks"], "cu_seqlens_q": None, "cu_seqlens_k": None,
               "max_seqlen_q": None, "max_seqlen_k": None}
        _, g = grads_kf(kf, one, v, "bshd", dout[None, cq[b]:cq[b + 1]])
        assert_close64(f"dq[{b}]", got["q"][cq[b]:cq[b + 1]], g["q"][0], tol=1e-12)
        assert_close64(f"dk[{b}]", got["k"][ck[b]:ck[b + 1]], g["k"][0], tol=1e-12)
        assert_close64(f"dv[{b}]", got["v"][ck[b]:ck[b + 1]], g["v"][0], tol=1e-12)
        dsinks += g["sinks"]
    assert_close64("dsinks", got["sinks"], dsinks, tol=1e-7)  # dsinks: a float32 sum (the contract)


def test_fully_masked_rows_get_no_gradient(kf):
    """Bottom-right causal with Sq > Sk: the first Sq - Sk rows see no key (out 0, lse -inf): their dq
    is 0 and they add nothing to dk, dv; with sinks they add nothing to dsinks either (D_i = 0)."""
    q = torch.randn(1, 6, 2, 64, dtype=f64, requires_grad=True)
    k = torch.randn(1, 2, 2, 64, dtype=f64, requires_grad=True)
    v = torch.randn(1, 2, 2, 64, dtype=f64, requires_grad=True)
    sinks = torch.randn(2, dtype=f64, requires_grad=True)
    out = kf.attention(q, k, v, causal=True, sinks=sinks)
    dout = torch.randn_like(out)
    out.backward(dout)
    assert (q.grad[:, :4] == 0).all() and (q.grad[:, 4:] != 0).any()
    rest = [x.detach()[:, 4:].clone().requires_grad_() for x in (q,)] + [k.detach().clone().requires_grad_(),
                                                                           v.detach().clone().requires_grad_()]
    s2 = sinks.detach().clone().requires_grad_()
    kf.attention(*rest, causal=True, sinks=s2).backward(dout[:, 4:])
    assert_close64("dk", k.grad, rest[1].grad, tol=1e-12)
    assert_close64("dv", v.grad, rest[2].grad, tol=1e-12)
    assert_close64("dsinks", sinks.grad, s2.grad, tol=1e-7)  # a float32 sum


@pytest.mark.parametrize("v", [{"causal": True}, {"window": (1, 1), "softcap": 3.0}, {"causal": True, "sinks": True}],
                         ids=vid)
@pytest.mark.parametrize("layout", ["bshd", "varlen"])
def test_gradcheck(kf, v, layout):
    """Finite differences of the op's own forward against its backward (tiny float64 inputs)."""
    t = make_inputs((2, 3, 4, 2, 1, 64, 64), {"layout": layout, "sinks": v.get("sinks")}, f64, "cpu")
    names = leaves(t)
    if t["sinks"] is not None:
        t["sinks"] = t["sinks"].to(f64)
    xs = tuple(t[n].detach().clone().requires_grad_() for n in names)
    extra = {k: a for k, a in tensor_args(t).items() if k != "sinks"}

    def f(*a):
        x = dict(zip(names, a))
        return kf.attention(x["q"], x["k"], x["v"], sinks=x.get("sinks"), layout=layout, **opts(v), **extra)

    # the saved lse is float32 (the op's contract): the analytical Jacobian is exact to ~1e-7
    assert torch.autograd.gradcheck(f, xs, eps=1e-6, atol=1e-5, rtol=1e-4)


def test_strided_inputs_grads(kf):
    """q, k, v as slices of a fused qkv projection (non-dense views): the gradient flows back into the
    fused tensor, equal to the gradients of contiguous copies."""
    qkv = torch.randn(2, 5, 3, 2, 64, dtype=f64, requires_grad=True)
    out = kf.attention(*qkv.unbind(2), causal=True)
    dout = torch.randn_like(out)
    out.backward(dout)
    parts = [p.detach().contiguous().requires_grad_() for p in qkv.unbind(2)]
    kf.attention(*parts, causal=True).backward(dout)
    assert_close64("dqkv", qkv.grad, torch.stack([p.grad for p in parts], dim=2), tol=1e-12)


def test_expanded_dout(kf):
    """A gradient with stride 0 (the backward of out.sum()) is densified before the kernel."""
    q = torch.randn(1, 4, 2, 64, dtype=f64, requires_grad=True)
    kf.attention(q, q.detach(), q.detach()).sum().backward()
    g = q.grad.clone()
    q.grad = None
    out = kf.attention(q, q.detach(), q.detach())
    out.backward(torch.ones_like(out).contiguous())
    assert torch.equal(g, q.grad)


# ---- the deterministic flag, lse, double backward ---------------------------------------------------


class _Calls(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.calls = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.calls.append((func, kwargs or {}))
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("deterministic", [False, True])
def test_deterministic_reaches_the_backward(kf, deterministic):
    """kernelforge.attention(deterministic=...) reaches kernelforge::attention_backward."""
    q = torch.randn(1, 4, 2, 64, dtype=f64, requires_grad=True)
    out = kf.attention(q, q.detach(), q.detach(), deterministic=deterministic)
    with _Calls() as mode:
        out.backward(torch.randn_like(out))
    bwd = [kw for f, kw in mode.calls if f is torch.ops.kernelforge.attention_backward.default]
    assert len(bwd) == 1 and bwd[0]["deterministic"] is deterministic


def test_forward_computes_lse_when_a_gradient_is_needed(kf):
    """Without return_lse the forward still computes lse for the backward (return_lse=True inside),
    and returns one output; lse carries no gradient."""
    q = torch.randn(1, 4, 2, 64, dtype=f64, requires_grad=True)
    with _Calls() as mode:
        out = kf.attention(q, q.detach(), q.detach())
    fwd = [kw for f, kw in mode.calls if f is torch.ops.kernelforge.attention.default]
    assert isinstance(out, torch.Tensor) and len(fwd) == 1 and fwd[0]["return_lse"] is True
    out, lse = kf.attention(q, q.detach(), q.detach(), return_lse=True)
    assert out.requires_grad and not lse.requires_grad
    with pytest.raises(RuntimeError, match="does not require grad"):
        lse.sum().backward()


def test_double_backward_is_an_error(kf):
    q = torch.randn(1, 4, 2, 64, dtype=f64, requires_grad=True)
    out = kf.attention(q, q, q)
    with pytest.raises(RuntimeError, match="double backward"):
        torch.autograd.grad(out.sum(), q, create_graph=True)


def test_sdpa_grads_match_torch(kf):
    """scaled_dot_product_attention is differentiable: GQA, SDPA's top-left causal with Sq > Sk."""
    q = torch.randn(2, 4, 7, 64, dtype=f64, requires_grad=True)
    k = torch.randn(2, 2, 5, 64, dtype=f64, requires_grad=True)
    v = torch.randn(2, 2, 5, 64, dtype=f64, requires_grad=True)
    dout = torch.randn(2, 4, 7, 64, dtype=f64)
    got = torch.autograd.grad(kf.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True), (q, k, v),
                              dout)
    want = torch.autograd.grad(torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True,
                                                                                enable_gqa=True), (q, k, v), dout)
    for n, g, w in zip("qkv", got, want):
        assert_close64(f"d{n}", g, w, tol=2e-6)


# ---- opcheck, torch.compile --------------------------------------------------------------------------


def _op_inputs(sinks=True):
    q = torch.randn(1, 5, 4, 64, dtype=f64)
    k = torch.randn(1, 6, 2, 64, dtype=f64)
    v = torch.randn(1, 6, 2, 64, dtype=f64)
    s = torch.randn(4, dtype=f64) if sinks else None
    kw = dict(causal=True, scale=None, window_left=3, window_right=0, softcap=10.0, sinks=s, cu_seqlens_q=None,
              cu_seqlens_k=None, max_seqlen_q=0, max_seqlen_k=0, layout="bshd")
    return q, k, v, kw


@pytest.mark.parametrize("sinks", [True, False])
def test_opcheck(kf, sinks):
    """The schemas, fake impls, autograd registration and AOT dispatch of both ops (CPU, float64)."""
    ops = torch.ops.kernelforge
    q, k, v, kw = _op_inputs(sinks)
    out, lse = ops.attention(q, k, v, **kw, return_lse=True)
    grads = [x.clone().requires_grad_() for x in (q, k, v)]
    kw_grad = dict(kw, sinks=kw["sinks"].clone().requires_grad_() if sinks else None)
    torch.library.opcheck(ops.attention.default, tuple(grads), dict(kw_grad, return_lse=True, deterministic=False))
    torch.library.opcheck(ops.attention.default, (q, k, v), dict(kw, return_lse=False, deterministic=True))
    dout = torch.randn_like(out)
    torch.library.opcheck(ops.attention_backward.default, (dout, q, k, v, out, lse), dict(kw, deterministic=True))
    dq, dk, dv, dsinks = ops.attention_backward(dout, q, k, v, out, lse, **kw, deterministic=False)
    assert dq.shape == q.shape and dk.shape == k.shape and dv.shape == v.shape
    assert dsinks.dtype == torch.float32 and dsinks.shape == ((4,) if sinks else (0,))


def test_opcheck_varlen(kf):
    ops = torch.ops.kernelforge
    t = make_inputs((3, 5, 7, 4, 2, 64, 64), {"layout": "varlen"}, f64, "cpu")
    kw = dict(causal=True, scale=0.2, window_left=-1, window_right=0, softcap=0.0, sinks=None,
              cu_seqlens_q=t["cu_seqlens_q"], cu_seqlens_k=t["cu_seqlens_k"], max_seqlen_q=t["max_seqlen_q"],
              max_seqlen_k=t["max_seqlen_k"], layout="varlen")
    q, k, v = (t[n].clone().requires_grad_() for n in "qkv")
    torch.library.opcheck(ops.attention.default, (q, k, v), dict(kw, return_lse=True, deterministic=False))
    out, lse = ops.attention(t["q"], t["k"], t["v"], **kw, return_lse=True)
    torch.library.opcheck(ops.attention_backward.default, (torch.randn_like(out), t["q"], t["k"], t["v"], out, lse),
                          dict(kw, deterministic=False))


class TinyAttention(torch.nn.Module):
    """A train-step sized block: qkv projection, kernelforge.attention (GQA, causal window, softcap,
    sinks), output projection."""

    def __init__(self, kf, hidden=128, hq=4, hkv=2, d=64, dtype=f64, device="cpu", deterministic=False):
        super().__init__()
        self.kf, self.hq, self.hkv, self.d, self.deterministic = kf, hq, hkv, d, deterministic
        self.qkv = torch.nn.Linear(hidden, (hq + 2 * hkv) * d, dtype=dtype, device=device)
        self.o = torch.nn.Linear(hq * d, hidden, dtype=dtype, device=device)
        self.sinks = torch.nn.Parameter(torch.randn(hq, dtype=torch.float32, device=device))

    def forward(self, x):
        B, S, _ = x.shape
        qkv = self.qkv(x).view(B, S, self.hq + 2 * self.hkv, self.d)
        q, k, v = qkv.split([self.hq, self.hkv, self.hkv], dim=2)
        out = self.kf.attention(q, k, v, causal=True, window=(5, 0), softcap=20.0, sinks=self.sinks,
                                deterministic=self.deterministic)
        return self.o(out.reshape(B, S, -1))


def _train_step(fn, model, x, target):
    """One step of fn (model or its compiled form): the loss and model's parameter gradients."""
    model.zero_grad(set_to_none=True)
    loss = torch.nn.functional.mse_loss(fn(x).float(), target)
    loss.backward()
    return loss.detach(), {n: p.grad.detach().clone() for n, p in model.named_parameters()}


@torch._dynamo.config.patch(error_on_recompile=True)
def test_compile_train_step_cpu(kf):
    """torch.compile(fullgraph=True) (aot_eager: the joint graph holds attention and attention_backward)
    of a training step: loss and gradients equal eager's."""
    torch._dynamo.reset()
    model = TinyAttention(kf)
    compiled = torch.compile(model, fullgraph=True, backend="aot_eager")
    for _ in range(2):
        x = torch.randn(2, 9, 128, dtype=f64)
        target = torch.randn(2, 9, 128)
        loss_c, g_c = _train_step(compiled, model, x, target)
        loss_e, g_e = _train_step(model, model, x, target)
        assert torch.allclose(loss_c, loss_e, rtol=1e-6, atol=0)
        for n in g_e:
            assert torch.allclose(g_c[n].double(), g_e[n].double(), rtol=1e-6, atol=1e-9), n
    torch._dynamo.reset()


# ---- CUDA: the kernels --------------------------------------------------------------------------------

HALF = [pytest.param(torch.bfloat16, id="bfloat16"), pytest.param(torch.float16, id="float16")]


def _sdpa_grads(q, k, v, dout, causal, backend=None):
    """torch SDPA gradients on [B, S, H, D] tensors (GQA by enable_gqa), optionally one backend."""
    from torch.nn.attention import SDPBackend, sdpa_kernel  # noqa: PLC0415

    x = [t.detach().transpose(1, 2).requires_grad_() for t in (q, k, v)]
    ctx = sdpa_kernel(getattr(SDPBackend, backend)) if backend else torch.enable_grad()
    with ctx:
        o = torch.nn.functional.scaled_dot_product_attention(*x, is_causal=causal, enable_gqa=x[0].shape[1] != x[1].shape[1])
        g = torch.autograd.grad(o, x, dout.transpose(1, 2))
    return o.transpose(1, 2).detach(), [t.transpose(1, 2) for t in g]


def _err(a, b):
    return (a.double() - b.double()).abs().max().item()


def _judge(name, got, half, ref):
    """flash-attention's criterion: the kernel's error against the float32 reference is at most twice
    torch's own half-precision SDPA error plus a small floor."""
    e_kf, e_pt = _err(got, ref), _err(half, ref)
    assert torch.isfinite(got).all(), f"{name}: non-finite values"
    assert e_kf <= 2 * e_pt + 1e-3 * (1 + ref.abs().max().item()), f"{name}: kernelforge {e_kf:.2e} vs torch {e_pt:.2e}"


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", HALF)
@pytest.mark.parametrize("shape,causal", [((2, 512, 8, 8, 128), False), ((2, 512, 8, 8, 128), True),
                                          ((1, 512, 32, 8, 128), True), ((2, 384, 8, 2, 64), True),
                                          ((1, 256, 4, 4, 256), False)], ids=str)
def test_gpu_grads_vs_sdpa_math(kf, dtype, shape, causal):
    B, S, Hq, Hkv, D = shape
    q = torch.randn(B, S, Hq, D, device="cuda", dtype=dtype)
    k = torch.randn(B, S, Hkv, D, device="cuda", dtype=dtype)
    v = torch.randn(B, S, Hkv, D, device="cuda", dtype=dtype)
    dout = torch.randn(B, S, Hq, D, device="cuda", dtype=dtype)
    x = [t.clone().requires_grad_() for t in (q, k, v)]
    out = kf.attention(*x, causal=causal)
    out.backward(dout)
    o_ref, g_ref = _sdpa_grads(*(t.float() for t in (q, k, v)), dout.float(), causal, "MATH")
    o_pt, g_pt = _sdpa_grads(q, k, v, dout, causal)
    _judge("out", out.detach(), o_pt, o_ref)
    for n, t, gp, gr in zip("qkv", x, g_pt, g_ref):
        assert t.grad.dtype == dtype and t.grad.shape == t.shape
        _judge(f"d{n}", t.grad, gp, gr)


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", HALF)
def test_gpu_varlen_grads_vs_sdpa_math(kf, dtype):
    """Packed ragged sequences (GQA, causal): each sequence's gradients against SDPA math on it alone."""
    lens = [300, 17, 0, 128, 255]
    cu = torch.tensor([0] + lens, device="cuda").cumsum(0).to(torch.int32)
    T, Hq, Hkv, D = sum(lens), 8, 2, 128
    q = torch.randn(T, Hq, D, device="cuda", dtype=dtype)
    k = torch.randn(T, Hkv, D, device="cuda", dtype=dtype)
    v = torch.randn(T, Hkv, D, device="cuda", dtype=dtype)
    dout = torch.randn(T, Hq, D, device="cuda", dtype=dtype)
    x = [t.clone().requires_grad_() for t in (q, k, v)]
    kf.attention(*x, causal=True, cu_seqlens_q=cu, cu_seqlens_k=cu, max_seqlen_q=max(lens),
                 max_seqlen_k=max(lens)).backward(dout)
    c = cu.tolist()
    for b in range(len(lens)):
        if lens[b] == 0:
            continue
        sl = slice(c[b], c[b + 1])
        one = [t[None, sl] for t in (q, k, v)]
        _, g_ref = _sdpa_grads(*(t.float() for t in one), dout[None, sl].float(), True, "MATH")
        _, g_pt = _sdpa_grads(*one, dout[None, sl], True)
        for n, t, gp, gr in zip("qkv", x, g_pt, g_ref):
            _judge(f"d{n}[{b}]", t.grad[sl], gp[0], gr[0])


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", HALF)
def test_gpu_sinks_vs_eager(kf, dtype):
    """gpt-oss: sinks (float32, as the model keeps them) with a causal sliding window, GQA; against the
    eager formula (the sink logit joins the softmax and its column is dropped) in float32 and in the
    dtype."""
    from kernelforge.attention import visible_keys
    from kernelforge.patch.attention import torch_attention

    B, S, Hq, Hkv, D, W = 2, 256, 8, 2, 64, 128
    q = torch.randn(B, Hq, S, D, device="cuda", dtype=dtype)
    k = torch.randn(B, Hkv, S, D, device="cuda", dtype=dtype)
    v = torch.randn(B, Hkv, S, D, device="cuda", dtype=dtype)
    sinks = torch.randn(Hq, device="cuda")
    dout = torch.randn(B, S, Hq, D, device="cuda", dtype=dtype)
    mask = visible_keys(S, S, True, (W - 1, 0), "cuda")[None, None]

    def eager(q, k, v, s):
        x = [t.detach().clone().requires_grad_() for t in (q, k, v, s)]
        o = torch_attention(*x[:3], mask, None, 0.0, None, x[3], False)
        g = torch.autograd.grad(o, x, dout.to(o.dtype))
        return o.detach(), g

    x = [t.detach().transpose(1, 2).requires_grad_() for t in (q, k, v)]
    s = sinks.clone().requires_grad_()
    out = kf.attention(*x, causal=True, window=(W - 1, 0), sinks=s)
    out.backward(dout)
    o_ref, g_ref = eager(q.float(), k.float(), v.float(), sinks)
    o_pt, g_pt = eager(q, k, v, sinks)
    _judge("out", out.detach(), o_pt, o_ref)
    for n, got, gp, gr in zip("qkv", x, g_pt, g_ref):
        _judge(f"d{n}", got.grad, gp.transpose(1, 2), gr.transpose(1, 2))
    assert s.grad.dtype == torch.float32
    _judge("dsinks", s.grad, g_pt[3], g_ref[3])


@pytest.mark.cuda
@pytest.mark.parametrize("varlen", [False, True])
def test_gpu_deterministic_bit_identical(kf, varlen):
    """deterministic=True: reruns give bit-identical dq, dk, dv and dsinks."""
    if varlen:
        lens = [512, 200, 333]
        cu = torch.tensor([0] + lens, device="cuda").cumsum(0).to(torch.int32)
        T = sum(lens)
        shapes = [(T, 16, 128), (T, 4, 128), (T, 4, 128)]
        kw = dict(cu_seqlens_q=cu, cu_seqlens_k=cu, max_seqlen_q=512, max_seqlen_k=512)
    else:
        shapes = [(2, 512, 16, 128), (2, 512, 4, 128), (2, 512, 4, 128)]
        kw = {}
    q, k, v = (torch.randn(*s, device="cuda", dtype=torch.bfloat16) for s in shapes)
    sinks = torch.randn(16, device="cuda")
    dout = torch.randn_like(q)

    def grads():
        x = [t.clone().requires_grad_() for t in (q, k, v, sinks)]
        kf.attention(*x[:3], causal=True, sinks=x[3], deterministic=True, **kw).backward(dout)
        return [t.grad for t in x]

    first = grads()
    for _ in range(3):
        for n, a, b in zip(("dq", "dk", "dv", "dsinks"), first, grads()):
            assert torch.equal(a, b), f"{n} differs between deterministic reruns"


@pytest.mark.cuda
def test_gpu_cuda_graph_forward_backward(kf):
    """Forward + backward captured into one CUDA graph (plan on the host, workspace from the graph's
    pool): the replay computes the gradients of the new contents of the captured inputs."""
    q, k, v = (torch.randn(2, 256, 8, 128, device="cuda", dtype=torch.bfloat16, requires_grad=True)
               for _ in range(3))
    dout = torch.randn(2, 256, 8, 128, device="cuda", dtype=torch.bfloat16)

    def step():
        out = kf.attention(q, k, v, causal=True)
        return torch.autograd.grad(out, (q, k, v), dout)

    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(2):
            step()  # warm up (allocator, autograd engine's stream)
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        static = step()
    for _ in range(2):
        with torch.no_grad():
            for t in (q, k, v, dout):
                t.copy_(torch.randn_like(t))
        g.replay()
        torch.cuda.synchronize()
        want = step()
        for a, b in zip(static, want):
            # dq adds with float atomics by default: equal up to summation order
            assert (a.float() - b.float()).abs().max().item() <= 1e-2 * (1 + b.float().abs().max().item())


@pytest.mark.cuda
@torch._dynamo.config.patch(error_on_recompile=True)
def test_gpu_compile_train_step(kf):
    """torch.compile(fullgraph=True, inductor) of a bf16 training step: loss and gradients match eager
    (the same kernels; deterministic so that dq's summation order is fixed)."""
    torch._dynamo.reset()
    model = TinyAttention(kf, hidden=256, hq=8, hkv=2, d=128, dtype=torch.bfloat16, device="cuda",
                          deterministic=True)
    compiled = torch.compile(model, fullgraph=True)
    for _ in range(2):
        x = torch.randn(2, 256, 256, device="cuda", dtype=torch.bfloat16)
        target = torch.randn(2, 256, 256, device="cuda")
        loss_c, g_c = _train_step(compiled, model, x, target)
        loss_e, g_e = _train_step(model, model, x, target)
        assert torch.allclose(loss_c, loss_e, rtol=2e-2)
        for n in g_e:
            err = (g_c[n].float() - g_e[n].float()).norm() / g_e[n].float().norm().clamp_min(1e-30)
            assert err.item() < 2e-2, f"{n}: compiled vs eager rel L2 {err.item():.2e}"
    torch._dynamo.reset()
