"""The GEMM family: the fake (meta) implementation of kernelforge::gemm, ``gemm`` and the layer built on it.

The op lives in C++ (`torch/kf_gemm.cpp`; the contract in include/kernelforge/gemm.h): out = act(a b^T +
bias) through cuBLASLt with the bias and the activation fused into the GEMM's epilogue, a [M, K] and b
[N, K] either row- or column-major (a transposed view passes without a copy), optionally the
pre-activation (``aux``, for the activation's backward) and the row sums of a (``a_sum``, the bias
gradient when a = dy^T). CPU tensors run the float64 C++ reference.

``linear_act`` is nn.Linear followed by an activation, forward and backward on that op:
  forward   y = act(x W^T + b)                      one GEMM, epilogue bias + act (+ aux for gelu_tanh)
  backward  g = dy * act'(pre)                      kernelforge.gelu's backward (relu: dy where y > 0)
            dx = g W                                one GEMM, W^T passed as a column-major view
            dW = g^T x                              one GEMM, both operands transposed views
            db = sum_rows(g)                        torch's column sum (faster than cuBLASLt's fused one)
"""

from __future__ import annotations

import math

import torch

from ._ops import _ops

ACTIVATIONS = ("none", "relu", "gelu_tanh")


# ---- fake implementation --------------------------------------------------------------------------


@torch.library.register_fake("kernelforge::gemm")
def _gemm_fake(a, b, bias=None, activation="none", aux=False, a_sum=False):
    # The C++ impl's shapes (kf_gemm.cpp): out [M, N] contiguous, aux [M, N] or [0, 0], a_sum [M] or [0].
    if a.dim() != 2:
        raise ValueError(f"gemm: a must have 2 dimensions [M, K], got {a.dim()}")
    if b.dim() != 2:
        raise ValueError(f"gemm: b must have 2 dimensions [N, K], got {b.dim()}")
    m, n = a.shape[0], b.shape[0]
    return (a.new_empty((m, n)), a.new_empty((m, n) if aux else (0, 0)), a.new_empty((m,) if a_sum else (0,)))


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
        if ctx.activation == "gelu_tanh":
            g = _ops.gelu_backward(g, saved, "tanh")
        elif ctx.activation == "relu":
            g = torch.where(saved > 0, g, torch.zeros((), dtype=g.dtype, device=g.device))
        dx = dw = db = None
        if ctx.needs_input_grad[0]:
            dx = _ops.gemm(g, w.t(), None, "none", False, False)[0].view(ctx.x_shape)
        if ctx.needs_input_grad[1]:
            dw = _ops.gemm(g.t(), x2.t(), None, "none", False, False)[0]
        if ctx.has_bias and ctx.needs_input_grad[2]:
            # a column sum of its own: cuBLASLt's bias-gradient epilogue (gemm's a_sum) slows the weight
            # gradient's GEMM by more than the separate pass costs (H100, 16384 x 4096 x 4096: 887 us
            # against 710 + 72)
            db = g.sum(0)
        return dx, dw, db, None


def linear_act(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None = None,
               activation: str = "none") -> torch.Tensor:
    """act(x @ w.T + bias), differentiable in x, w and bias: the forward is one GEMM with the bias and the
    activation in its epilogue, the backward two GEMMs and the bias gradient's column sum. x [..., K], w [N, K] (nn.Linear's weight), bias [N] or None; y [..., N] contiguous."""
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


__all__ = ["gemm"]
