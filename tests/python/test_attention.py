"""kernelforge.attention and kernelforge.scaled_dot_product_attention against the float64 PyTorch
reference of the spec (masks built explicitly from the contract's formula).

CPU tensors run the op's float64 C++ reference (a second, independent implementation of the formula);
CUDA tensors (float16 / bfloat16) run the kernels, within TOL[dtype].attn of the reference rounded to
the dtype. Shapes are tiny on the CPU; the CUDA cases add tile-sized ones.
"""

from __future__ import annotations

import math
import warnings

import pytest
import torch

from kernelforge.specs import TOL
from kernelforge.specs.attention import attention_ref, make_inputs

CPU = pytest.param("cpu", torch.float64, id="cpu-float64")
CUDA = [pytest.param("cuda", dt, id=f"cuda-{str(dt)[6:]}", marks=pytest.mark.cuda)
        for dt in (torch.bfloat16, torch.float16)]
DEVICES = [CPU, pytest.param("cpu", torch.bfloat16, id="cpu-bfloat16")] + CUDA

# (B, Sq, Sk, Hq, Hkv, Dqk, Dv): every head dim pair; GQA 4:1, MQA; Sq < Sk and Sq > Sk (bottom-right
# causal: the first Sq - Sk rows see no key); a single query row
SHAPES = [(2, 9, 9, 2, 2, 64, 64), (1, 7, 13, 4, 1, 96, 96), (2, 11, 5, 4, 2, 128, 128),
          (1, 6, 6, 2, 1, 192, 128), (1, 5, 5, 2, 2, 96, 96), (1, 4, 4, 2, 2, 256, 256),
          (2, 1, 10, 4, 2, 128, 128)]
GPU_SHAPES = [(2, 128, 128, 4, 4, 64, 64), (1, 77, 203, 8, 2, 128, 128), (2, 200, 65, 4, 1, 96, 96),
              (1, 130, 130, 2, 1, 256, 256), (1, 64, 64, 2, 2, 192, 128), (2, 300, 300, 2, 2, 96, 96)]
VARIANTS = [
    {},
    {"causal": True},
    {"causal": True, "window": (3, 0)},
    {"window": (2, 4)},
    {"causal": True, "softcap": 5.0},
    {"causal": True, "sinks": True},
    {"window": (0, 0), "sinks": True},
    {"scale": 0.375},  # a float32 value: the contract takes the scale as a float
]


def vid(v: dict) -> str:
    return "-".join(f"{k}={v[k]}" for k in v) or "plain"


def close(got: torch.Tensor, want64: torch.Tensor, dtype, what: str):
    """|got - want| <= tol (1 + |want|), want the float64 reference rounded to got's dtype."""
    tol = TOL[dtype].attn
    want = want64.to(got.dtype).to("cpu", torch.float64)
    g = got.detach().to("cpu", torch.float64)
    assert g.shape == want.shape, f"{what}: shape {tuple(g.shape)} != {tuple(want.shape)}"
    assert torch.isfinite(g).all(), f"{what}: non-finite values"
    err = ((g - want).abs() / (1 + want.abs())).max().item() if g.numel() else 0.0
    assert err <= tol, f"{what}: max error {err:.3e} > {tol:.0e}"


def run(kf, t, v, layout, return_lse=True):
    kw = {k: t[k] for k in ("sinks", "cu_seqlens_q", "cu_seqlens_k", "max_seqlen_q", "max_seqlen_k")}
    opts = {k: v[k] for k in ("causal", "window", "softcap", "scale") if k in v}
    return kf.attention(t["q"], t["k"], t["v"], layout=layout, return_lse=return_lse, **opts, **kw)


def reference(t, v, layout):
    cpu = {k: (x.cpu() if isinstance(x, torch.Tensor) else x) for k, x in t.items()}
    opts = {k: v[k] for k in ("causal", "window", "softcap", "scale") if k in v}
    return attention_ref(cpu["q"], cpu["k"], cpu["v"], sinks=cpu["sinks"], cu_seqlens_q=cpu["cu_seqlens_q"],
                         cu_seqlens_k=cpu["cu_seqlens_k"], layout=layout, **opts)


def check_lse(lse, want):
    assert lse.dtype == torch.float32
    lse64, want = lse.detach().cpu().double(), want.cpu()
    inf = torch.isinf(want)
    assert torch.equal(torch.isinf(lse64), inf) and (lse64[inf] < 0).all(), "lse: -inf rows differ"
    err = (lse64[~inf] - want[~inf]).abs().max().item() if (~inf).any() else 0.0
    assert err <= 1e-4 * (1 + want[~inf].abs().max().item() if (~inf).any() else 1), f"lse error {err:.2e}"


@pytest.mark.parametrize("layout", ["bshd", "bhsd", "varlen"])
@pytest.mark.parametrize("v", VARIANTS, ids=vid)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("device,dtype", DEVICES)
def test_values(kf, device, dtype, shape, v, layout):
    if dtype != torch.float64 and device == "cpu" and (layout != "bshd" or v not in VARIANTS[:2]):
        pytest.skip("CPU half precision: the plain cases suffice (the reference computes in float64 anyway)")
    t = make_inputs(shape, {"layout": layout, "sinks": v.get("sinks")}, dtype, device)
    out, lse = run(kf, t, v, layout)
    want, want_lse = reference(t, v, layout)
    close(out, want, dtype if dtype != torch.float64 else torch.float64, "out")
    check_lse(lse, want_lse)


@pytest.mark.parametrize("layout", ["bshd", "varlen"])
@pytest.mark.parametrize("v", VARIANTS[:6], ids=vid)
@pytest.mark.parametrize("shape", GPU_SHAPES, ids=str)
@pytest.mark.parametrize("device,dtype", CUDA)
def test_values_gpu_tiles(kf, device, dtype, shape, v, layout):
    t = make_inputs(shape, {"layout": layout, "sinks": v.get("sinks")}, dtype, device)
    out, lse = run(kf, t, v, layout)
    want, want_lse = reference(t, v, layout)
    close(out, want, dtype, "out")
    check_lse(lse, want_lse)


@pytest.mark.parametrize("device,dtype", [CPU] + CUDA)
def test_strided_views_and_no_lse(kf, device, dtype):
    """q, k, v as slices of one fused qkv projection [B, S, 3, H, D]; without return_lse one output."""
    qkv = torch.randn(2, 9, 3, 4, 64, device=device, dtype=dtype)
    q, k, v = qkv.unbind(2)
    out = kf.attention(q, k, v, causal=True)
    assert isinstance(out, torch.Tensor) and out.shape == (2, 9, 4, 64) and out.is_contiguous()
    want, _ = attention_ref(q.cpu(), k.cpu(), v.cpu(), causal=True)
    close(out, want, dtype, "out")


@pytest.mark.parametrize("device,dtype", [CPU] + CUDA)
def test_fully_masked_rows_are_zero(kf, device, dtype):
    """Sq > Sk causal (bottom-right): the first Sq - Sk rows see no key: out 0, lse -inf; with sinks
    lse is the sink. Sk = 0: zeros."""
    q = torch.randn(1, 6, 2, 64, device=device, dtype=dtype)
    k = torch.randn(1, 2, 2, 64, device=device, dtype=dtype)
    out, lse = kf.attention(q, k, k, causal=True, return_lse=True)
    assert torch.isfinite(out).all()
    assert (out[:, :4] == 0).all() and not (out[:, 4:] == 0).all()
    assert torch.isinf(lse[:, :, :4]).all() and (lse[:, :, :4] < 0).all()
    sinks = torch.tensor([0.5, -1.0], device=device)
    out, lse = kf.attention(q, k, k, causal=True, sinks=sinks, return_lse=True)
    assert (out[:, :4] == 0).all()
    assert torch.allclose(lse[0, :, :4].cpu(), sinks.cpu().view(2, 1).expand(2, 4))
    empty = k[:, :0]
    out = kf.attention(q, empty, empty)
    assert out.shape == q.shape and (out == 0).all()


@pytest.mark.parametrize("device,dtype", [CPU] + CUDA)
def test_varlen_empty_sequence_and_defaults(kf, device, dtype):
    """A zero-length sequence in the batch; max_seqlen None (the token count) gives the same result."""
    t = make_inputs((3, 8, 8, 2, 1, 64, 64), {"layout": "varlen"}, dtype, device)
    assert 0 in (t["cu_seqlens_q"][1:] - t["cu_seqlens_q"][:-1]).tolist()
    out = kf.attention(t["q"], t["k"], t["v"], causal=True, cu_seqlens_q=t["cu_seqlens_q"],
                       cu_seqlens_k=t["cu_seqlens_k"])
    exact = kf.attention(t["q"], t["k"], t["v"], causal=True, cu_seqlens_q=t["cu_seqlens_q"],
                         cu_seqlens_k=t["cu_seqlens_k"], max_seqlen_q=t["max_seqlen_q"],
                         max_seqlen_k=t["max_seqlen_k"])
    assert torch.equal(out, exact)
    want, _ = reference(t, {"causal": True}, "varlen")
    close(out, want, dtype, "out")


# ---- scaled_dot_product_attention ------------------------------------------------------------------


@pytest.mark.parametrize("sq,sk", [(9, 9), (12, 7)])
@pytest.mark.parametrize("is_causal", [False, True])
@pytest.mark.parametrize("device,dtype", [pytest.param("cpu", torch.float32, id="cpu-float32"), CPU] + CUDA)
def test_sdpa_matches_torch(kf, device, dtype, is_causal, sq, sk):
    """SDPA semantics, including its top-left causal mask when Sq > Sk, and GQA with enable_gqa."""
    q = torch.randn(2, 4, sq, 64, device=device, dtype=dtype)
    k = torch.randn(2, 2, sk, 64, device=device, dtype=dtype)
    v = torch.randn(2, 2, sk, 64, device=device, dtype=dtype)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the kernel path: no fallback
        got = kf.scaled_dot_product_attention(q, k, v, is_causal=is_causal, enable_gqa=True)
    want = torch.nn.functional.scaled_dot_product_attention(q.double(), k.double(), v.double(), is_causal=is_causal,
                                                            enable_gqa=True)
    assert got.dtype == dtype and got.shape == want.shape
    close(got, want, dtype if dtype != torch.float32 else torch.float64, "sdpa")


def test_sdpa_falls_back_with_a_warning(kf, monkeypatch):
    from kernelforge.patch import _runtime

    monkeypatch.setattr(_runtime, "warned", set())
    q = torch.randn(1, 2, 5, 64, dtype=torch.float64)
    mask = torch.rand(5, 5) > 0.3
    mask[:, 0] = True
    with pytest.warns(UserWarning, match="attn_mask"):
        got = kf.scaled_dot_product_attention(q, q, q, attn_mask=mask)
    assert torch.allclose(got, torch.nn.functional.scaled_dot_product_attention(q, q, q, attn_mask=mask))
    with pytest.warns(UserWarning, match="Sq=5 < Sk=7"):
        k = torch.randn(1, 2, 7, 64, dtype=torch.float64)
        kf.scaled_dot_product_attention(q, k, k, is_causal=True)
    monkeypatch.setenv("KF_STRICT", "1")
    with pytest.raises(RuntimeError, match="KF_STRICT=1"):
        kf.scaled_dot_product_attention(q, q, q, dropout_p=0.1)


# ---- errors ----------------------------------------------------------------------------------------


def qkv(shape=(1, 4, 2, 64), dtype=torch.float64):
    return [torch.randn(*shape, dtype=dtype) for _ in range(3)]


def test_error_layout(kf):
    q, k, v = qkv()
    with pytest.raises(ValueError, match="layout must be 'bshd', 'bhsd' or 'varlen', got 'sbhd'"):
        kf.attention(q, k, v, layout="sbhd")
    with pytest.raises(ValueError, match=r"q must have 3 dimensions \[Tq, Hq, D\] for layout 'varlen'"):
        kf.attention(q, k, v, layout="varlen")


def test_error_head_dim(kf):
    q, k, v = qkv((1, 4, 2, 80))
    with pytest.raises(RuntimeError, match="head dims"):
        kf.attention(q, k, v)


def test_error_dtype(kf):
    q, k, v = qkv(dtype=torch.float32)
    with pytest.raises(RuntimeError, match="q must be a float16/bfloat16/float64"):
        kf.attention(q, k, v)
    q, k, v = qkv()
    with pytest.raises(RuntimeError, match="must have the dtype of q"):
        kf.attention(q, k.half(), v)


def test_error_last_dim_not_contiguous(kf):
    q, k, v = qkv()
    with pytest.raises(RuntimeError, match="q"):
        kf.attention(q.transpose(2, 3).contiguous().transpose(2, 3), k, v)


def test_error_cu_seqlens(kf):
    q, k, v = (torch.randn(6, 2, 64, dtype=torch.float64) for _ in range(3))
    cu = torch.tensor([0, 2, 6], dtype=torch.int32)
    with pytest.raises(RuntimeError, match="cu_seqlens_q and cu_seqlens_k are required"):
        kf.attention(q, k, v, layout="varlen")
    with pytest.raises(RuntimeError, match="cu_seqlens_k must have the shape of cu_seqlens_q"):
        kf.attention(q, k, v, cu_seqlens_q=cu, cu_seqlens_k=torch.tensor([0, 6], dtype=torch.int32))
    with pytest.raises(RuntimeError, match="must be an int32 tensor"):
        kf.attention(q, k, v, cu_seqlens_q=cu.long(), cu_seqlens_k=cu.long())
    with pytest.raises(RuntimeError, match="must be null unless the layout is varlen"):
        kf.attention(q[None], k[None], v[None], cu_seqlens_q=cu, cu_seqlens_k=cu, layout="bshd")


def test_error_options(kf):
    q, k, v = qkv()
    with pytest.raises(ValueError, match="window must be a pair"):
        kf.attention(q, k, v, window=3)
    with pytest.raises(RuntimeError, match="window_left must be -1"):
        kf.attention(q, k, v, window=(-2, 0))
    with pytest.raises(RuntimeError, match="causal is window_right = 0"):
        kf.attention(q, k, v, causal=True, window=(-1, 2))
    with pytest.raises(ValueError, match="scale must be a finite value > 0"):
        kf.attention(q, k, v, scale=0.0)


@pytest.mark.parametrize("which", ["q", "k", "v", "sinks"])
def test_requires_grad_each_input(kf, which):
    """One input requiring grad: the op records its backward and only that input gets a gradient, with
    its shape and dtype; lse carries none. Under no_grad the same call records nothing."""
    q, k, v = qkv()
    sinks = torch.zeros(2, dtype=torch.float32)
    t = {"q": q, "k": k, "v": v, "sinks": sinks}
    t[which].requires_grad_(True)
    out, lse = kf.attention(t["q"], t["k"], t["v"], sinks=t["sinks"], return_lse=True)
    assert out.requires_grad and not lse.requires_grad
    (out * torch.randn_like(out)).sum().backward()
    for name, x in t.items():
        if name == which:
            assert x.grad is not None and x.grad.shape == x.shape and x.grad.dtype == x.dtype
            assert torch.isfinite(x.grad).all() and (x.grad != 0).any()
        else:
            assert x.grad is None
    with torch.no_grad():  # no gradient asked: runs without recording
        assert not kf.attention(t["q"], t["k"], t["v"], sinks=t["sinks"]).requires_grad


def test_default_scale(kf):
    q, k, v = qkv()
    assert torch.allclose(kf.attention(q, k, v), kf.attention(q, k, v, scale=1 / math.sqrt(64)), rtol=0, atol=1e-14)
