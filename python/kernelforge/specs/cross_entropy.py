"""The loss family: cross_entropy (logits [T, V]) and fused_linear_cross_entropy (hidden [T, H] @
weight[V, H].T without materializing the logits).

cross_entropy shapes are (tokens, vocab); fused_linear_cross_entropy bench shapes FlceShapes
(t{T}h{H}v{V}), check shapes (T, H, V).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from ._spec import FlceShape, OpSpec, check_out, f64, kf, poison, randn

IGNORE_INDEX = -100

# ---- float64 references ---------------------------------------------------------------------------


def cross_entropy_ref(x, target, *, ignore_index=IGNORE_INDEX, label_smoothing=0.0, reduction="mean",
                      z_loss_scale=0.0, softcap=None):
    """(loss, lse [T]) of cross_entropy.h's formula on logits x [T, V] (any dtype) in float64:
    z = softcap * tanh(x / softcap) (or x), lse = logsumexp(z), per valid row
    lse - (1 - eps) z_t - (eps / V) sum_j z_j + z_loss * lse^2, 0 for an ignored row; the mean divides
    by the number of valid rows (0 / 0 = NaN when there is none, as F.cross_entropy)."""
    x = x.to(f64)
    z = softcap * torch.tanh(x / softcap) if softcap else x
    lse = torch.logsumexp(z, dim=-1)
    valid = target != ignore_index
    safe = torch.where(valid, target, torch.zeros_like(target))
    z_t = z.gather(-1, safe.unsqueeze(-1)).squeeze(-1)
    eps = label_smoothing
    row = lse - (1 - eps) * z_t - (eps / x.shape[-1]) * z.sum(-1) + z_loss_scale * lse * lse
    row = torch.where(valid, row, torch.zeros_like(row))
    if reduction == "none":
        return row, lse
    if reduction == "sum":
        return row.sum(), lse
    return row.sum() / valid.sum(), lse


def fused_linear_cross_entropy_ref(hidden, weight, target, bias=None, **opts):
    """The loss of cross_entropy_ref on float64 logits hidden @ weight.T (+ bias)."""
    logits = hidden.to(f64) @ weight.to(f64).t()
    if bias is not None:
        logits = logits + bias.to(f64)
    return cross_entropy_ref(logits, target, **opts)[0]


# ---- traffic and arithmetic -----------------------------------------------------------------------
# cross_entropy, in units of T*V logits: fwd reads them once; fwd+bwd reads them twice and writes the
# gradient once. fused_linear_cross_entropy, in units of T*H + V*H (hidden and weight): read once
# (fwd); read twice and both gradients written (fwd+bwd); its speed is in TFLOP/s (GEMM-bound).
CE_TENSORS = {"fwd": 1, "fwdbwd": 3}
CE_FLOPS_PER_LOGIT = {"fwd": 5, "fwdbwd": 10}  # max, *log2e, sub, ex2, sum; + fma, ex2, *g, -eps/V, target
FLCE_GEMMS = {"fwd": 1, "fwdbwd": 3}  # 2*T*H*V each: the logits; + dhidden, dweight


def _ce_bytes(shape, mode, elt):
    return CE_TENSORS[mode] * shape[0] * shape[1] * elt


def _flce_bytes(shape, mode, elt):
    return CE_TENSORS[mode] * (shape.t + shape.v) * shape.h * elt


# ---- bench ----------------------------------------------------------------------------------------


def _inputs(op):
    """Targets uniform over the classes, every 20th token ignored; dy = 1 (the loss gradient)."""
    def inputs(shape, dtype, device, gen):
        t = {}
        if op == "cross_entropy":
            tokens, vocab = shape
            t["logits"] = randn(gen, device, dtype, tokens, vocab, scale=2.0)
        else:  # hidden ~ N(0, 1), weight ~ N(0, 1/H): logits of std ~1
            tokens, vocab = shape.t, shape.v
            t["hidden"] = randn(gen, device, dtype, tokens, shape.h)
            t["weight"] = randn(gen, device, dtype, vocab, shape.h, scale=shape.h ** -0.5)
        t["target"] = torch.randint(0, vocab, (tokens,), generator=gen, device=device)
        t["target"][::20] = IGNORE_INDEX
        t["dy"] = torch.ones((), device=device)
        return t
    return inputs


def _liger(op):
    """Liger's cross-entropy / fused linear cross-entropy (liger_kernel.transformers.functional). Its
    cross-entropy computes the gradient in the forward and stores it in the logits buffer (Liger's
    design): later timed calls then run on gradient values, which changes no timing; each mode's
    correctness check runs first, and Liger runs last of the providers."""
    def factory():
        try:
            from liger_kernel.transformers import functional as lf  # noqa: PLC0415
        except Exception:  # noqa: BLE001
            return None
        if op == "cross_entropy":
            return lambda t: (lf.liger_cross_entropy(t["logits"], t["target"]),)
        return lambda t: (lf.liger_fused_linear_cross_entropy(t["hidden"], t["weight"], t["target"]),)
    return factory


# ---- kforge check ---------------------------------------------------------------------------------
# cross_entropy (T, V): one row of 7 classes, a vocab no multiple of the vector width, just over 2^14, a
# Llama-2 batch, Llama-3's and Gemma's vocabularies on few rows (long rows: many segments).
CE_CHECK_SHAPES = ((1, 7), (7, 4099), (3, 16385), (64, 32000), (2, 128256), (1, 262144))
# fused_linear_cross_entropy (T, H, V): odd sizes, a few hundred tokens (several GEMM tiles), one token.
FLCE_CHECK_SHAPES = ((13, 64, 1031), (300, 128, 5000), (1, 32, 77))
VARIANTS = {
    # reduction and options; scale: the logits' standard deviation (default 3; x20 with the softcap so
    # that tanh saturates); ignore "all": every target is ignore_index (the mean is NaN, 0 / 0, as in
    # PyTorch: compared as NaN)
    "cross_entropy": (
        {"reduction": "mean"},
        {"reduction": "sum", "label_smoothing": 0.1},
        {"reduction": "none", "z_loss_scale": 1e-4},
        {"reduction": "mean", "softcap": 30.0, "scale": 20.0},
        {"reduction": "mean", "ignore": "all"},
    ),
    # bias or not; "none" takes the backward op's path (the chunks are recomputed for the per-row loss
    # gradient; with a softcap as Gemma 2's patched loss, logits x10 only: the GEMM rounds them to the
    # dtype, an absolute error that grows with them); chunk_tokens 7 forces several chunks (the weight
    # gradient accumulated over them); 0 = chosen by the op (about T / 4 tokens in 16-bit dtypes, T / 8 in float32)
    "fused_linear_cross_entropy": (
        {"reduction": "mean", "bias": False},
        {"reduction": "sum", "bias": True, "label_smoothing": 0.1},
        {"reduction": "none", "bias": True, "softcap": 30.0, "scale": 10.0},
        {"reduction": "mean", "bias": False, "chunk_tokens": 7, "z_loss_scale": 1e-4},
    ),
}


def _opts(v: dict) -> dict:
    """The Python API's keyword arguments of a variant (also cross_entropy_ref's)."""
    return {"ignore_index": IGNORE_INDEX, "label_smoothing": v.get("label_smoothing", 0.0),
            "reduction": v["reduction"], "z_loss_scale": v.get("z_loss_scale", 0.0), "softcap": v.get("softcap")}


def _grad_names(op: str, t: dict) -> list[str]:
    if op == "cross_entropy":
        return ["logits"]
    return [k for k in ("hidden", "weight", "bias") if t.get(k) is not None]


def _check_inputs(op):
    """Logits (cross_entropy) or hidden, weight and bias, int64 targets with ignored rows (2, 7, 12, ...:
    a one-row call keeps its row), and the loss gradient dloss in the loss's dtype (the logits' for
    cross_entropy, float32 for the fused op).

    dloss: N(0, 1) per row for "none"; for "mean" and "sum" a scalar in [0.5, 1.5), times the number of
    valid rows for "mean". The gradient of a mean is otherwise ~1 / rows per row, and check's errors are
    floored at 1: scaled, the gradients are O(1) as for the other ops and a wrong one cannot pass as
    "small"."""
    def inputs(shape, v, dtype, device):
        T, V = shape[0], shape[-1]
        scale = v.get("scale", 3.0)
        target = torch.randint(0, V, (T,))
        if v.get("ignore") == "all":
            target.fill_(IGNORE_INDEX)
        else:
            target[2::5] = IGNORE_INDEX
        valid = int((target != IGNORE_INDEX).sum())
        t = {"target": target.to(device)}
        if op == "cross_entropy":
            t["logits"] = randn(None, device, dtype, T, V, scale=scale)
            loss_dtype = dtype
        else:
            H = shape[1]  # logits = hidden @ weight.T (+ bias) with standard deviation ~scale
            t["hidden"] = randn(None, device, dtype, T, H)
            t["weight"] = randn(None, device, dtype, V, H, scale=scale / math.sqrt(H))
            t["bias"] = randn(None, device, dtype, V) if v.get("bias") else None
            loss_dtype = torch.float32
        if v["reduction"] == "none":
            dloss = torch.randn(T)
        else:
            dloss = (torch.rand(()) + 0.5) * (max(valid, 1) if v["reduction"] == "mean" else 1)
        t["dloss"] = dloss.to(device=device, dtype=loss_dtype)
        return t
    return inputs


def _check_run(op):
    """cross_entropy: loss (the logits' dtype), lse (float32, return_lse=True) and dlogits;
    fused_linear_cross_entropy: loss (float32) and the gradients of hidden, weight and bias."""
    def run(kfm, t, v):
        names = _grad_names(op, t)
        leaves = {k: t[k].detach().clone().requires_grad_(True) for k in names}
        target, dloss = t["target"], t["dloss"]
        T = target.shape[0]
        loss_shape = (T,) if v["reduction"] == "none" else ()
        if op == "cross_entropy":
            x = leaves["logits"]
            poison([x.shape], x.dtype, x.device)
            poison([(T,), (T,), (), ()], torch.float32, x.device)
            loss, lse = kfm.cross_entropy(x, target, return_lse=True, **_opts(v))
            check_out("loss", loss, loss_shape, x.dtype)
            check_out("lse", lse, (T,), torch.float32)
            (dx,) = torch.autograd.grad([loss], [x], [dloss])
            check_out("dlogits", dx, x.shape, x.dtype)
            return {"loss": loss.detach(), "lse": lse, "dlogits": dx}
        h = leaves["hidden"]
        poison([leaves[k].shape for k in names], h.dtype, h.device)
        poison([(T,), (T,), ()], torch.float32, h.device)
        loss = kfm.fused_linear_cross_entropy(h, leaves["weight"], target, leaves.get("bias"),
                                              chunk_tokens=v.get("chunk_tokens", 0), **_opts(v))
        check_out("loss", loss, loss_shape, torch.float32)
        grads = torch.autograd.grad([loss], [leaves[k] for k in names], [dloss])
        res = {"loss": loss.detach()}
        for k, g in zip(names, grads):
            check_out("d" + k, g, t[k].shape, t[k].dtype)
            res["d" + k] = g
        return res
    return run


def _cpp_reference(op):
    """The ops on float64 CPU tensors (the reference computes in double; its row losses and lse pass
    through float32, well inside fp32's tolerance)."""
    def ref(a, v):
        ops = torch.ops.kernelforge
        opts = (IGNORE_INDEX, v.get("label_smoothing", 0.0), v.get("z_loss_scale", 0.0), v.get("softcap") or 0.0)
        red = v["reduction"]
        if op == "cross_entropy":
            loss, lse, valid = ops.cross_entropy(a["logits"], a["target"], *opts, red)
            dx = ops.cross_entropy_backward(a["dloss"], a["logits"], a["target"], lse, valid, *opts, red)
            return {"loss": loss, "lse": lse, "dlogits": dx}
        h, w, tg, b = a["hidden"], a["weight"], a["target"], a["bias"]
        has_bias = b is not None
        chunk = v.get("chunk_tokens", 0)
        # mean / sum: the gradients for a loss gradient of 1, computed with the loss; "none": the backward op
        loss, lse, dh, dw, db = ops.fused_linear_cross_entropy_forward(h, w, tg, b, *opts, red, chunk, True, True,
                                                                       has_bias)
        if red == "none":
            dh, dw, db = ops.fused_linear_cross_entropy_backward(a["dloss"], h, w, tg, b, lse, *opts, chunk, True,
                                                                 True, has_bias)
        else:
            dh, dw, db = dh * a["dloss"], dw * a["dloss"], db * a["dloss"]
        res = {"loss": loss, "dhidden": dh, "dweight": dw}
        if has_bias:
            res["dbias"] = db
        return res
    return ref


def _matches_torch(loss, x, target, v) -> None:
    """The formula is F.cross_entropy where PyTorch has the options (no z-loss, no softcap)."""
    if v.get("z_loss_scale") or v.get("softcap"):
        return
    with torch.no_grad():
        want = F.cross_entropy(x, target, ignore_index=IGNORE_INDEX, reduction=v["reduction"],
                               label_smoothing=v.get("label_smoothing", 0.0))
    if not torch.allclose(loss.detach(), want, rtol=1e-9, atol=1e-9, equal_nan=True):
        raise AssertionError("the float64 reference differs from F.cross_entropy (reference bug)")


def _reference(op):
    def ref(a, v):
        names = _grad_names(op, a)
        for k in names:
            a[k].requires_grad_(True)
        if op == "cross_entropy":
            x = a["logits"]
        else:  # the logits in float64, then the same formula
            x = a["hidden"] @ a["weight"].t()
            if a["bias"] is not None:
                x = x + a["bias"]
        loss, lse = cross_entropy_ref(x, a["target"], **_opts(v))
        _matches_torch(loss, x, a["target"], v)
        grads = torch.autograd.grad([loss], [a[k] for k in names], [a["dloss"]])
        res = {"loss": loss.detach(), **{"d" + k: g for k, g in zip(names, grads)}}
        if op == "cross_entropy":
            res["lse"] = lse.detach()
        return res
    return ref


CROSS_ENTROPY = OpSpec(
    name="cross_entropy", family="loss", shape_kind="rows",
    inputs=_inputs("cross_entropy"), run=lambda t: (kf().cross_entropy(t["logits"], t["target"]),),
    grad_inputs=("logits",), outputs=("loss",),
    row_bytes=_ce_bytes, flops=lambda shape, mode: CE_FLOPS_PER_LOGIT[mode] * shape[0] * shape[1],
    # tokens x vocab: Llama 3's 128256, Llama 2 / Mistral's 32000
    shapes=((4096, 128256), (8192, 32000)),
    # eager: the HF causal-LM loss path (F.cross_entropy of the logits upcast to float32)
    eager=lambda: (lambda t: (F.cross_entropy(t["logits"].float(), t["target"]),)),
    liger=_liger("cross_entropy"), providers=("kernelforge", "eager", "compile", "liger"),
    measure_memory=True,
    check_shapes=CE_CHECK_SHAPES, variants=VARIANTS["cross_entropy"], check_inputs=_check_inputs("cross_entropy"),
    check_run=_check_run("cross_entropy"), cpp_reference=_cpp_reference("cross_entropy"),
    reference=_reference("cross_entropy"),
)

FUSED_LINEAR_CROSS_ENTROPY = OpSpec(
    name="fused_linear_cross_entropy", family="loss", shape_kind="flce",
    inputs=_inputs("fused_linear_cross_entropy"),
    run=lambda t: (kf().fused_linear_cross_entropy(t["hidden"], t["weight"], t["target"]),),
    grad_inputs=("hidden", "weight"), outputs=("loss",),
    row_bytes=_flce_bytes, flops=lambda shape, mode: 2 * shape.t * shape.h * shape.v * FLCE_GEMMS[mode],
    shapes=(FlceShape(8192, 4096, 128256),),
    # eager: the lm_head GEMM, then the HF loss on float32 logits
    eager=lambda: (lambda t: (F.cross_entropy((t["hidden"] @ t["weight"].t()).float(), t["target"]),)),
    liger=_liger("fused_linear_cross_entropy"), providers=("kernelforge", "eager", "compile", "liger"),
    measure_memory=True,
    check_shapes=FLCE_CHECK_SHAPES, variants=VARIANTS["fused_linear_cross_entropy"],
    check_inputs=_check_inputs("fused_linear_cross_entropy"), check_run=_check_run("fused_linear_cross_entropy"),
    cpp_reference=_cpp_reference("fused_linear_cross_entropy"), reference=_reference("fused_linear_cross_entropy"),
    check_label=lambda s: f"t{s[0]}h{s[1]}v{s[2]}",
    # each gradient is a GEMM over the logits' gradient rounded to the dtype (two roundings, and the
    # sum over the vocabulary cancels: a row's softmax gradient sums to zero, so its terms' rounding
    # errors are large against the result; bf16, 1 token x hidden 32 x vocab 77: rel_l2 up to ~1e-2),
    # and the weight gradient is also accumulated in the dtype over chunks of tokens
    grad_tol_factor=2.0,
)

SPECS = (CROSS_ENTROPY, FUSED_LINEAR_CROSS_ENTROPY)
