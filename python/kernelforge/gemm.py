"""The GEMM family: the fake (meta) implementation of kernelforge::gemm, ``gemm`` and the layer built on it.

The op lives in C++ (`torch/kf_gemm.cpp`; the contract in include/kernelforge/gemm.h): out = act(a b^T +
bias) through cuBLASLt with the bias and the activation fused into the GEMM's epilogue, a [M, K] and b
[N, K] either row- or column-major (a transposed view passes without a copy), optionally the
pre-activation (``aux``, for the activation's backward) and the row sums of a (``a_sum``, the bias
gradient when a = dy^T). CPU tensors run the float64 C++ reference.

``linear_act`` is nn.Linear followed by an activation, forward and backward on that op:
  forward   y = act(x W^T + b)                      one GEMM, epilogue bias + act (+ aux for gelu_tanh)
  backward  g = dy * act'(pre), db = sum_rows(g)   gelu_tanh: one pass, kernelforge's
                                                    gelu_backward_bias_grad (reads dy and pre, writes g
                                                    and db: 3 M N elements instead of 4); relu: dy where
                                                    y > 0, then torch's column sum (faster than
                                                    cuBLASLt's fused one)
            dx = g W                                one GEMM, W^T passed as a column-major view
            dW = g^T x                              one GEMM, both operands transposed views
"""

from __future__ import annotations

import math

import torch

from ._ops import _ops

ACTIVATIONS = ("none", "relu", "gelu_tanh")


# ---- fake implementation --------------------------------------------------------------------------


@torch.library.register_fake("kernelforge::gemm")
def _gemm_fake(a, b, bias=None, activation="none", aux=False, a_sum=False):
    # The C++ impl's shapes (kf_gemm.cpp): out [M, N] (batched: [B, M, N]) contiguous, aux out's shape or
    # [0, 0], a_sum [M] or [0].
    if a.dim() not in (2, 3):
        raise ValueError(f"gemm: a must have 2 dimensions [M, K] or 3 [B, M, K], got {a.dim()}")
    if b.dim() not in (2, 3):
        raise ValueError(f"gemm: b must have 2 dimensions [N, K] or 3 [B, N, K], got {b.dim()}")
    m, n = a.shape[-2], b.shape[-2]
    shape = (m, n) if a.dim() == 2 and b.dim() == 2 else (a.shape[0] if a.dim() == 3 else b.shape[0], m, n)
    return (a.new_empty(shape), a.new_empty(shape if aux else (0, 0)), a.new_empty((m,) if a_sum else (0,)))


# ---- functional API -------------------------------------------------------------------------------


def gemm(a: torch.Tensor, b: torch.Tensor, bias: torch.Tensor | None = None, activation: str = "none",
         aux: bool = False, a_sum: bool = False) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """out = act(a @ b.T + bias) in one cuBLASLt call with the epilogue fused; returns (out, aux, a_sum).

    a [M, K], b [N, K] (float16 / bfloat16 on CUDA), each with stride 1 along one dimension (a
    transposed view is taken as is); bias [N] or None; activation 'none', 'relu' or 'gelu_tanh'
    (torch.nn.functional.gelu(approximate='tanh')). ``aux=True`` also returns the pre-activation a @ b.T
    + bias (gelu_tanh only; cuBLASLt wants N % 8 == 0 for it), ``a_sum=True`` the row sums of a (no
    bias, no activation), else those outputs are empty. Not differentiable: ``linear`` is the layer.
    """
    return _ops.gemm(a, b, bias, activation, aux, a_sum)


class _LinearAct(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, w, bias, activation):
        k, n = w.shape[1], w.shape[0]
        x2 = x.reshape(math.prod(x.shape[:-1]), k)
        need_pre = activation == "gelu_tanh" and any(ctx.needs_input_grad[:3])
        if need_pre and n % 8 != 0:
            # cuBLASLt writes no aux for N % 8 != 0: the pre-activation from a bias-only GEMM, then the
            # activation (kernelforge.gelu), two passes instead of one
            pre = _ops.gemm(x2, w, bias, "none", False, False)[0]
            y = _ops.gelu(pre, "tanh")
        else:
            y, pre, _ = _ops.gemm(x2, w, bias, activation, need_pre, False)
        ctx.activation = activation
        ctx.has_bias = bias is not None
        ctx.bias_dtype = bias.dtype if bias is not None else None
        ctx.x_shape = x.shape
        ctx.save_for_backward(x2, w, pre if activation == "gelu_tanh" else y if activation == "relu" else None)
        return y.view(*x.shape[:-1], n)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, dy):
        x2, w, saved = ctx.saved_tensors
        n = w.shape[0]
        g = dy.reshape(-1, n)
        if g.dim() == 2 and g.size(1) > 1 and g.stride(1) != 1:
            g = g.contiguous()
        want_db = ctx.has_bias and ctx.needs_input_grad[2]
        db = None
        if ctx.activation == "gelu_tanh" and want_db:
            # g and its column sums in one pass over dy and pre (float32 sums of the unrounded g)
            g, db = _ops.gelu_backward_bias_grad(g, saved, "tanh", ctx.bias_dtype)
        elif ctx.activation == "gelu_tanh":
            g = _ops.gelu_backward(g, saved, "tanh")
        elif ctx.activation == "relu":
            g = torch.where(saved > 0, g, torch.zeros((), dtype=g.dtype, device=g.device))
        dx = dw = None
        if ctx.needs_input_grad[0]:
            dx = _ops.gemm(g, w.t(), None, "none", False, False)[0].view(ctx.x_shape)
        if ctx.needs_input_grad[1]:
            dw = _ops.gemm(g.t(), x2.t(), None, "none", False, False)[0]
        if want_db and db is None:
            # a column sum of its own: cuBLASLt's bias-gradient epilogue (gemm's a_sum) slows the weight
            # gradient's GEMM by more than the separate pass costs (H100, 16384 x 4096 x 4096: 887 us
            # against 710 + 72)
            db = g.sum(0)
        return dx, dw, db, None


def linear_act(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None = None,
               activation: str = "none") -> torch.Tensor:
    """act(x @ w.T + bias), differentiable in x, w and bias: the forward is one GEMM with the bias and the
    activation in its epilogue, the backward two GEMMs and the bias gradient's column sum (fused with
    GELU's derivative for 'gelu_tanh'). x [..., K], w [N, K] (nn.Linear's weight), bias [N] or None;
    y [..., N] contiguous."""
    if activation not in ACTIVATIONS:
        raise ValueError(f"linear: activation must be one of {', '.join(repr(a) for a in ACTIVATIONS)} or None, "
                         f"got {activation!r}" + (" (the erf GELU has no fused epilogue in cuBLASLt: "
                                                  "'gelu_tanh' is F.gelu(approximate='tanh'))"
                                                  if activation == "gelu" else ""))
    if x.dim() < 1:
        raise ValueError("linear: x must have at least 1 dimension [..., K], got a scalar")
    if w.dim() != 2:
        raise ValueError(f"linear: w must have 2 dimensions [N, K] (nn.Linear's weight), got {w.dim()}")
    return _LinearAct.apply(x, w, bias, activation)


# ---- batched products: bmm and matmul ----------------------------------------------------------------


class _Bmm(torch.autograd.Function):
    """a @ b for a [B, M, K] or [M, K] and b [B, K, N] or [K, N] (torch's convention), at least one 3-D: one
    strided-batched cuBLASLt call (b passed as the transposed view [B, N, K], no copy; a 2-D operand is
    shared by every batch, batch stride 0).
      da = dy b^T       [B, M, K]; summed over the batch when a is shared
      db = a^T dy       [B, K, N]; when b is shared, one 2-D GEMM over the B M rows: (a as [B M, K])^T dy
    """

    @staticmethod
    def forward(ctx, a, b):
        ctx.save_for_backward(a, b)
        return _ops.gemm(a, b.transpose(-1, -2), None, "none", False, False)[0]

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, dy):
        a, b = ctx.saved_tensors
        da = db = None
        if ctx.needs_input_grad[0]:
            da = _ops.gemm(dy, b, None, "none", False, False)[0]
            if a.dim() == 2:
                da = da.sum(0)
        if ctx.needs_input_grad[1]:
            if b.dim() == 2:
                k, n = a.shape[-1], dy.shape[-1]
                db = _ops.gemm(a.reshape(-1, k).t(), dy.reshape(-1, n).t(), None, "none", False, False)[0]
            else:
                db = _ops.gemm(a.transpose(-1, -2), dy.transpose(-1, -2), None, "none", False, False)[0]
        return da, db


def _check_pair(name: str, a: torch.Tensor, b: torch.Tensor) -> None:
    if not isinstance(a, torch.Tensor) or not isinstance(b, torch.Tensor):
        raise TypeError(f"{name}: a and b must be tensors, got {type(a).__name__} and {type(b).__name__}")
    if a.dtype != b.dtype:
        raise ValueError(f"{name}: a and b must share one dtype, got {a.dtype} and {b.dtype}")
    if a.device != b.device:
        raise ValueError(f"{name}: a and b must be on one device, got {a.device} and {b.device}")


def bmm(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """torch.bmm: a [B, M, K] @ b [B, K, N] -> [B, M, N], one strided-batched cuBLASLt call (float16 /
    bfloat16 on CUDA; the float64 reference on CPU), differentiable in a and b. Transposed views of either
    operand pass without a copy."""
    _check_pair("bmm", a, b)
    if a.dim() != 3 or b.dim() != 3:
        raise ValueError(f"bmm: a and b must have 3 dimensions [B, M, K] and [B, K, N], got shapes "
                         f"{tuple(a.shape)} and {tuple(b.shape)}")
    if a.shape[0] != b.shape[0] or a.shape[2] != b.shape[1]:
        raise ValueError(f"bmm: shapes {tuple(a.shape)} and {tuple(b.shape)} do not multiply ([B, M, K] @ [B, K, N])")
    return _Bmm.apply(a, b)


def matmul(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """torch.matmul's semantics (1-D operands, broadcast batch dimensions) on kernelforge's GEMM:
      [..., M, K] @ [K, N]      the leading dimensions fold into M: one 2-D GEMM
      [M, K] @ [..., K, N]      a shared by every batch (batch stride 0): one batched GEMM
      [..., M, K] @ [..., K, N] batch dimensions broadcast (an operand broadcast along a dimension is
                                expanded, as torch.matmul does), one batched GEMM
    Differentiable in a and b."""
    _check_pair("matmul", a, b)
    if a.dim() == 0 or b.dim() == 0:
        raise ValueError("matmul: both arguments need at least 1 dimension, got a scalar")
    squeeze_m, squeeze_n = a.dim() == 1, b.dim() == 1
    if squeeze_m:
        a = a.unsqueeze(0)
    if squeeze_n:
        b = b.unsqueeze(-1)
    if a.shape[-1] != b.shape[-2]:
        raise ValueError(f"matmul: shapes {tuple(a.shape)} and {tuple(b.shape)} do not multiply "
                         f"(a's last dimension must equal b's second to last)")
    m, k, n = a.shape[-2], a.shape[-1], b.shape[-1]
    if b.dim() == 2:
        lead = a.shape[:-2]
        out = _Bmm.apply(a.reshape(1, -1, k), b).reshape(*lead, m, n) if a.dim() > 2 else \
            _Bmm.apply(a.unsqueeze(0), b)[0]
    else:
        batch = torch.broadcast_shapes(a.shape[:-2], b.shape[:-2])
        bb = b.expand(*batch, k, n).reshape(-1, k, n)
        aa = a if a.dim() == 2 else a.expand(*batch, m, k).reshape(-1, m, k)
        out = _Bmm.apply(aa, bb).reshape(*batch, m, n)
    if squeeze_m:
        out = out.squeeze(-2)
    if squeeze_n:
        out = out.squeeze(-1)
    return out


__all__ = ["gemm", "bmm", "matmul"]
