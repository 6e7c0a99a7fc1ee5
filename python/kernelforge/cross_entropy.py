"""The cross-entropy family: fake (meta) implementations of its ops and the functional API.

The ops live in C++ (`torch/kf_cross_entropy.cpp`, which holds the schemas; the kernels in
`src/cross_entropy/`). Formulas (cross_entropy.h), per row with target t, z the (softcapped) logits,
eps = label_smoothing, lse = log sum_j exp(z_j):

    z_j      = softcap * tanh(x_j / softcap)                 (Gemma 2; softcap=None: z = x)
    row_loss = lse - (1 - eps) z_t - (eps / V) sum_j z_j + z_loss_scale * lse^2
    mean     = sum of row losses / number of rows whose target != ignore_index   (NaN if none)

Without z-loss and softcap this is ``F.cross_entropy(logits, target, ignore_index=...,
label_smoothing=..., reduction=...)`` with the class dimension last (logits [..., V], target [...]).
The math is float32 whatever the logits' dtype (as ``F.cross_entropy(logits.float(), ...)``); the
loss is returned in the logits' dtype as F.cross_entropy does, lse in float32.
"""

from __future__ import annotations

import torch

from ._ops import _ops

def _softcap(softcap: float | None) -> float:
    if softcap is None:
        return 0.0
    if not softcap > 0:
        raise ValueError(f"softcap must be None or > 0, got {softcap!r}")
    return float(softcap)


# ---- fake implementations ---------------------------------------------------------------------------


@torch.library.register_fake("kernelforge::cross_entropy")
def _cross_entropy_fake(logits, target, ignore_index, label_smoothing, z_loss_scale, softcap, reduction):
    rows = logits.shape[0] if logits.dim() >= 1 else 0
    loss = logits.new_empty((rows,) if reduction == "none" else ())
    lse = logits.new_empty((rows,), dtype=torch.float32)
    return loss, lse, logits.new_empty((), dtype=torch.float32)


@torch.library.register_fake("kernelforge::cross_entropy_backward")
def _cross_entropy_backward_fake(dloss, logits, target, lse, valid, ignore_index, label_smoothing, z_loss_scale,
                                 softcap, reduction):
    return logits.new_empty(logits.shape)


@torch.library.register_fake("kernelforge::cross_entropy_shard")
def _cross_entropy_shard_fake(logits, target, class_start, num_classes, ignore_index, label_smoothing, softcap):
    rows = logits.shape[0] if logits.dim() >= 1 else 0
    return logits.new_empty((rows,), dtype=torch.float32), logits.new_empty((rows,), dtype=torch.float32)


@torch.library.register_fake("kernelforge::cross_entropy_shard_backward")
def _cross_entropy_shard_backward_fake(dloss, logits, target, lse, class_start, num_classes, ignore_index,
                                       label_smoothing, z_loss_scale, softcap, dlogits):
    return None


@torch.library.register_fake("kernelforge::fused_linear_cross_entropy")
def _flce_fake(hidden, weight, target, bias, ignore_index, label_smoothing, z_loss_scale, softcap, reduction,
               chunk_tokens):
    return hidden.new_empty((hidden.shape[0],) if reduction == "none" else (), dtype=torch.float32)


def _grad_or_empty(want: bool, like: torch.Tensor | None, hidden: torch.Tensor) -> torch.Tensor:
    return like.new_empty(like.shape) if want and like is not None else hidden.new_empty((0,))


@torch.library.register_fake("kernelforge::fused_linear_cross_entropy_forward")
def _flce_forward_fake(hidden, weight, target, bias, ignore_index, label_smoothing, z_loss_scale, softcap, reduction,
                       chunk_tokens, grad_hidden, grad_weight, grad_bias):
    grads = reduction != "none"
    loss = _flce_fake(hidden, weight, target, bias, ignore_index, label_smoothing, z_loss_scale, softcap, reduction,
                      chunk_tokens)
    lse = hidden.new_empty((hidden.shape[0],), dtype=torch.float32)
    return (loss, lse, _grad_or_empty(grads and grad_hidden, hidden, hidden),
            _grad_or_empty(grads and grad_weight, weight, hidden), _grad_or_empty(grads and grad_bias, bias, hidden))


@torch.library.register_fake("kernelforge::fused_linear_cross_entropy_backward")
def _flce_backward_fake(dloss, hidden, weight, target, bias, lse, ignore_index, label_smoothing, z_loss_scale, softcap,
                        chunk_tokens, grad_hidden, grad_weight, grad_bias):
    return (_grad_or_empty(grad_hidden, hidden, hidden), _grad_or_empty(grad_weight, weight, hidden),
            _grad_or_empty(grad_bias, bias, hidden))


# ---- functional API -------------------------------------------------------------------------------


def cross_entropy(
    logits: torch.Tensor,
    target: torch.Tensor,
    *,
    ignore_index: int = -100,
    label_smoothing: float = 0.0,
    reduction: str = "mean",
    z_loss_scale: float = 0.0,
    softcap: float | None = None,
    return_lse: bool = False,
):
    """Cross-entropy of ``logits [..., V]`` against int64 class indices ``target [...]``.

    Differentiable w.r.t. ``logits``; the backward reads the logits once more and writes the
    gradient once (lse is saved from the forward). ``reduction`` is "mean" (over non-ignored
    rows; NaN when all are ignored, as PyTorch), "sum" or "none" (loss of ``target``'s shape,
    0 for ignored rows). ``return_lse=True`` also returns the float32 log-sum-exp of every row
    (of the softcapped logits). A target outside [0, V) that is not ``ignore_index`` gives a
    NaN loss on the GPU (checked on the device: no host sync) and an error on the CPU.
    DTensor logits sharded on the class dimension (a vocabulary-parallel lm_head's) run
    ``kernelforge.vocab_parallel_cross_entropy``: no logits are gathered.
    """
    if type(logits).__name__ == "DTensor":
        from .distributed import vocab_parallel_cross_entropy  # noqa: PLC0415

        return vocab_parallel_cross_entropy(logits, target, ignore_index=ignore_index, label_smoothing=label_smoothing,
                                            reduction=reduction, z_loss_scale=z_loss_scale, softcap=softcap,
                                            return_lse=return_lse)
    if logits.dim() < 1 or tuple(target.shape) != tuple(logits.shape[:-1]):
        raise ValueError(
            f"cross_entropy: target must have the shape of logits without its last (class) dimension, "
            f"{tuple(logits.shape[:-1])}; got {tuple(target.shape)}"
        )
    loss, lse, _ = _ops.cross_entropy(
        logits.reshape(-1, logits.shape[-1]), target.reshape(-1), int(ignore_index), float(label_smoothing),
        float(z_loss_scale), _softcap(softcap), reduction,
    )
    if reduction == "none":
        loss = loss.view(target.shape)
    if return_lse:
        return loss, lse.view(target.shape)
    return loss


def fused_linear_cross_entropy(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    target: torch.Tensor,
    bias: torch.Tensor | None = None,
    *,
    ignore_index: int = -100,
    label_smoothing: float = 0.0,
    reduction: str = "mean",
    z_loss_scale: float = 0.0,
    softcap: float | None = None,
    chunk_tokens: int = 0,
) -> torch.Tensor:
    """``cross_entropy(hidden @ weight.T + bias, target)`` without materializing the logits.

    ``hidden [..., H]``, ``weight [V, H]`` (e.g. ``lm_head.weight``), ``bias [V]`` or None,
    ``target [...]`` int64. Tokens are processed in chunks (``chunk_tokens``; 0 = chosen from free
    memory, at most 1 GiB of logits per chunk and an eighth of the float32 logits eager would hold): per chunk one cuBLAS GEMM for the logits, our
    cross-entropy kernels, and, when gradients are needed, the gradient written over the chunk's
    logits and two more GEMMs for the gradients of hidden and weight. The loss is float32 (as the
    HF loss, which upcasts the logits): a scalar for "mean"/"sum", ``target``'s shape for "none".
    Gradients of hidden, weight and bias. For "mean"/"sum" they are computed in the forward (the
    chunk's logits are not needed again) and scaled by the loss gradient in the backward; a second
    backward through the same graph (``retain_graph=True``) is an error. "none" recomputes the
    chunks in the backward (one more GEMM per chunk). A DTensor ``weight`` sharded by rows over a
    1-D mesh (a column-parallel lm_head) runs ``kernelforge.vocab_parallel_fused_linear_cross_entropy``
    on each rank's rows.
    """
    if type(weight).__name__ == "DTensor":  # a vocabulary-parallel lm_head: each rank's rows, no logits gathered
        from .distributed import _dtensor_fused_linear_cross_entropy  # noqa: PLC0415

        return _dtensor_fused_linear_cross_entropy(hidden, weight, target, bias, ignore_index=ignore_index,
                                                   label_smoothing=label_smoothing, reduction=reduction,
                                                   z_loss_scale=z_loss_scale, softcap=softcap,
                                                   chunk_tokens=chunk_tokens)
    if hidden.dim() < 1 or tuple(target.shape) != tuple(hidden.shape[:-1]):
        raise ValueError(
            f"fused_linear_cross_entropy: target must have the shape of hidden without its last dimension, "
            f"{tuple(hidden.shape[:-1])}; got {tuple(target.shape)}"
        )
    loss = _ops.fused_linear_cross_entropy(
        hidden.reshape(-1, hidden.shape[-1]), weight, target.reshape(-1), bias, int(ignore_index),
        float(label_smoothing), float(z_loss_scale), _softcap(softcap), reduction, int(chunk_tokens),
    )
    return loss.view(target.shape) if reduction == "none" else loss
