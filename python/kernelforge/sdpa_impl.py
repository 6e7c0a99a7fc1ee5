"""kernelforge as a flash-attention implementation of torch's SDPA registry (torch >= 2.11).

Importing kernelforge registers the name ``"kernelforge"`` with
``torch.nn.attention.register_flash_attention_impl``; nothing changes until it is activated:

    torch.nn.attention.activate_flash_attention_impl("kernelforge")   # or kernelforge.sdpa_impl.activate()
    ...
    torch.nn.attention.restore_flash_attention_impl()                 # or kernelforge.sdpa_impl.restore()

Activation overrides, process-wide, the CUDA kernels of four aten ops with the functions below:
``_scaled_dot_product_flash_attention`` (+ ``_backward``), which every
``F.scaled_dot_product_attention`` call runs when SDPA picks its flash backend, and
``_flash_attention_forward`` / ``_flash_attention_backward``, which ``torch.nn.attention.varlen``
reaches. The overrides sit below autograd (aten's autograd kernel calls the backward op), so each
one is a plain call of ``kernelforge::attention`` / ``kernelforge::attention_backward``:

    SDPA ops: q, k, v [B, H, S, D] views                 -> layout "bhsd" (or "bshd" on the transposed
              views when that is the memory order: the output gets query's strides, as aten's meta)
    _flash_attention_forward: [B, S, H, D]                -> "bshd"; packed [T, H, D] + cum_seq_q / _k
              (int32 cu_seqlens)                          -> "varlen"
    lse: float32 [B, Hq, Sq] / [Hq, Tq], the shapes of torch's flash ops

Mask conventions. SDPA's ``is_causal`` is top-left aligned (key j visible from row i when j <= i);
the kernel's causal is bottom-right aligned (flash-attn's). Sq == Sk: the same mask. Sq > Sk: the
kernel runs ``window_right = Sq - Sk`` (j <= i + (Sk - Sq) + (Sq - Sk) = i). Sq < Sk: keys j >= Sq
are never visible, so the kernel runs bottom-right causal on the first Sq keys (square: j <= i) and
their dk / dv are zero. ``_flash_attention_forward``'s ``is_causal`` is bottom-right (flash-attn's),
``window_size_left`` / ``_right`` map to the kernel's window (None or negative: unbounded); causal
forces the right window to 0, as flash-attn does. scale None: 1 / sqrt(D). GQA passes through.

What the kernel cannot compute runs ``math_forward`` / ``math_backward`` (float32 math in plain
torch, float64 for float64 inputs; results rounded once to the input dtype), announced like every
kernelforge fallback (a warning once per reason, an error under KF_STRICT=1): ``dropout_p > 0``, a
head dim pair outside {64, 96, 128, 256} and 192/128, a dtype the op does not take (CUDA float32 /
float64), ``alibi_slopes``, ``seqused_k``. Dropout draws its keep mask from a
``torch.Generator(device)`` seeded with a seed drawn at forward time (torch's default CPU generator,
so ``torch.manual_seed`` makes it reproducible) and stored in the returned ``rng_state``; the
backward re-creates the same mask from it. ``alibi_slopes`` and ``seqused_k`` reach no backward op
(their schemas lack them), so with a gradient required they are an error, never a wrong gradient.
``return_debug_mask=True`` is an error (the provider keeps no attention-probability debug mask).
CPU tensors (reached only when the overrides are registered for the CPU key, as the tests do) run
the op's float64 reference.
"""

from __future__ import annotations

import math
import warnings

import torch
import torch.nn.attention

from ._ops import _ops
from .attention import head_dims_supported, reference_dtype, visible_keys

NAME = "kernelforge"

_SDPA_FWD = "aten::_scaled_dot_product_flash_attention"
_SDPA_BWD = "aten::_scaled_dot_product_flash_attention_backward"
_FLASH_FWD = "aten::_flash_attention_forward"
_FLASH_BWD = "aten::_flash_attention_backward"

_FORM = {"bhsd": "[B, H, S, D]", "bshd": "[B, S, H, D]", "varlen": "[T, H, D]"}
_HEAD_DIM = {"bhsd": 1, "bshd": 2, "varlen": 1}


# ---- registration ---------------------------------------------------------------------------------


class _Handle:
    """What activate_flash_attention_impl keeps: remove() drops the overrides (restore calls it)."""

    def __init__(self, library: torch.library.Library):
        self.library = library

    def remove(self) -> None:
        if self.library is not None:
            self.library._destroy()
            self.library = None


def _register(dispatch_key: str = "CUDA") -> _Handle:
    """Override the four aten flash ops for ``dispatch_key`` ("CUDA"; the tests also use "CPU")."""
    lib = torch.library.Library("aten", "IMPL", dispatch_key)  # noqa: TOR901
    with warnings.catch_warnings():
        # the dispatcher's note that a kernel is overridden: overriding is what activation asks for
        warnings.filterwarnings("ignore", message="Warning only once for all operators")
        lib.impl("_scaled_dot_product_flash_attention", sdpa_flash_forward, dispatch_key)
        lib.impl("_scaled_dot_product_flash_attention_backward", sdpa_flash_backward, dispatch_key)
        lib.impl("_flash_attention_forward", flash_attention_forward, dispatch_key)
        lib.impl("_flash_attention_backward", flash_attention_backward, dispatch_key)
    return _Handle(lib)


def _registry():
    attn = torch.nn.attention
    return attn if hasattr(attn, "register_flash_attention_impl") else None


def available() -> bool:
    """Whether this torch has the flash attention registry (torch >= 2.11)."""
    return _registry() is not None


def activate() -> None:
    """``torch.nn.attention.activate_flash_attention_impl("kernelforge")``."""
    if not available():
        raise RuntimeError(f"kernelforge.sdpa_impl: torch {torch.__version__} has no flash attention registry "
                           "(torch.nn.attention.activate_flash_attention_impl needs torch >= 2.11)")
    torch.nn.attention.activate_flash_attention_impl(NAME)


def restore() -> None:
    """Restore torch's flash attention when "kernelforge" is the active implementation (another
    provider's activation is left alone)."""
    if available() and torch.nn.attention.current_flash_attention_impl() == NAME:
        torch.nn.attention.restore_flash_attention_impl()


if available():
    torch.nn.attention.register_flash_attention_impl(NAME, register_fn=_register)


# ---- checks and small helpers -----------------------------------------------------------------------


def _check(op: str, q, k, v, layout: str) -> None:
    """The input errors every path shares (the math path has no C++ validation behind it)."""
    rank = 3 if layout == "varlen" else 4
    for name, t in (("query", q), ("key", k), ("value", v)):
        if t.dim() != rank:
            raise ValueError(f"{op}: {name} must have {rank} dimensions {_FORM[layout]}, got {t.dim()}")
    if not (q.device == k.device == v.device):
        raise ValueError(f"{op}: query, key and value must be on one device, got {q.device}, {k.device}, {v.device}")
    if not (q.dtype == k.dtype == v.dtype) or not q.is_floating_point():
        raise ValueError(f"{op}: query, key and value must have one floating dtype, got {q.dtype}, {k.dtype}, "
                         f"{v.dtype}")
    if k.shape[:-1] != v.shape[:-1]:
        raise ValueError(f"{op}: key and value must agree in every dimension but the last, got {tuple(k.shape)} and "
                         f"{tuple(v.shape)}")
    hd = _HEAD_DIM[layout]
    hq, hkv = q.shape[hd], k.shape[hd]
    if hkv == 0 or hq % hkv != 0:
        raise ValueError(f"{op}: the query heads ({hq}) must be a multiple of the key/value heads ({hkv})")


def _why_math(q, v, dropout_p: float) -> str | None:
    """Why the kernel cannot compute this call (None: it can)."""
    if dropout_p > 0.0:
        return f"dropout_p={dropout_p}"
    if reference_dtype(q) is None:
        return f"{q.dtype} {q.device.type} tensors"
    if not head_dims_supported(q, v):
        return f"head dims {q.shape[-1]}/{v.shape[-1]} (the kernels take 64, 96, 128, 256 and 192/128)"
    return None


def _announce(op: str, why: str) -> None:
    from .patch._runtime import announce_fallback  # noqa: PLC0415  (the patch package imports attention)

    announce_fallback(f"the '{NAME}' flash attention impl of {op}", why, "attention formula in plain torch (math)",
                      "Float16 / bfloat16 CUDA tensors, head dims 64, 96, 128, 256 (or 192/128) and dropout_p=0 "
                      "run the kernel.", 4)


def _no_grad_feature(op: str, q, k, v, feature: str) -> None:
    if torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad):
        raise NotImplementedError(f"{op}: gradients with {feature} are not supported: {_FLASH_BWD} does not receive "
                                  f"{feature}, so its gradients could not be right. Call it under torch.no_grad(), or "
                                  "restore torch's implementation (torch.nn.attention.restore_flash_attention_impl()).")


def _no_debug_mask(op: str, return_debug_mask: bool) -> None:
    if return_debug_mask:
        raise NotImplementedError(f"{op}: return_debug_mask=True is not supported by the '{NAME}' flash attention "
                                  "impl (it keeps no debug attention mask); restore torch's implementation "
                                  "(torch.nn.attention.restore_flash_attention_impl()) for it")


def _window(left, right, causal: bool) -> tuple[int, int]:
    """flash-attn's window: None or negative = unbounded (-1); causal forces right = 0."""
    left = -1 if left is None or left < 0 else int(left)
    right = -1 if right is None or right < 0 else int(right)
    return left, (0 if causal else right)


def _top_left(sq: int, sk: int, is_causal: bool) -> tuple[int, bool, int]:
    """SDPA's top-left causal mask as (keys the kernel reads, its causal flag, its window_right)."""
    if not is_causal:
        return sk, False, -1
    if sq > sk:
        return sk, False, sq - sk
    return sq, True, 0  # keys j >= Sq are never visible: bottom-right causal on the first Sq keys


def _unit_last(t):
    return t if t.shape[-1] <= 1 or t.stride(-1) == 1 else t.contiguous()


def _like(out, like):
    """out with the strides of torch.empty_like(like) (aten's meta of these ops), copied only when
    they differ in a dimension longer than 1."""
    if out.shape != like.shape:
        return out
    want = torch.empty_like(like, device="meta").stride()
    if all(a == b for a, b, n in zip(out.stride(), want, out.shape) if n > 1):
        return out
    return torch.empty_like(like).copy_(out)


def _rng(seed: int, device):
    """rng_state (uint64 [2]: the dropout seed, 0) and the unused philox offset (uint64 [])."""
    state = torch.tensor([seed, 0], dtype=torch.int64, device=device).view(torch.uint64)
    return state, torch.zeros((), dtype=torch.uint64, device=device)


def _seed_of(rng_state) -> int:
    return int(rng_state.reshape(-1).view(torch.int64)[0].item())


def _generator(device, seed: int) -> torch.Generator:
    return torch.Generator(device=device).manual_seed(seed)


# ---- the kernel path ------------------------------------------------------------------------------


def _kernel_forward(q, k, v, layout, *, causal, scale, left, right, cu_q=None, cu_k=None, max_q=0, max_k=0):
    dtype = reference_dtype(q)  # the input's dtype; CPU float32: the float64 reference
    q, k, v = (_unit_last(t.to(dtype)) for t in (q, k, v))
    out, lse = _ops.attention(q, k, v, causal=causal, scale=scale, window_left=left, window_right=right, softcap=0.0,
                              sinks=None, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, max_seqlen_q=int(max_q or 0),
                              max_seqlen_k=int(max_k or 0), layout=layout, return_lse=True, deterministic=False)
    return out, lse


def _dense_forward(q, k, v, layout, **kw):
    """q, k, v 4-D in ``layout`` ("bhsd" or "bshd"): the kernel on whichever view of them is dense
    in memory order, so out is already laid out like torch.empty_like(q)."""
    other = "bshd" if layout == "bhsd" else "bhsd"
    if not q.is_contiguous() and q.transpose(1, 2).is_contiguous():
        out, lse = _kernel_forward(*(t.transpose(1, 2) for t in (q, k, v)), other, **kw)
        out = out.transpose(1, 2)
    else:
        out, lse = _kernel_forward(q, k, v, layout, **kw)
    return _like(out.to(q.dtype), q), lse


def _kernel_backward(dout, q, k, v, out, lse, layout, *, causal, scale, left, right, cu_q=None, cu_k=None, max_q=0,
                     max_k=0):
    """dq, dk, dv (empty_like of q, k, v: aten's meta) from kernelforge::attention_backward."""
    dtype = reference_dtype(q)
    args = [_unit_last(t.to(dtype)) for t in (dout, q, k, v, out)]
    dq, dk, dv, _ = _ops.attention_backward(
        *args, lse.float(), causal=causal, scale=scale, window_left=left, window_right=right, softcap=0.0, sinks=None,
        cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, max_seqlen_q=int(max_q or 0), max_seqlen_k=int(max_k or 0),
        layout=layout, deterministic=torch.are_deterministic_algorithms_enabled())
    return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype)


# ---- the math path ----------------------------------------------------------------------------------


def _compute_dtype(t) -> torch.dtype:
    return torch.float64 if t.dtype == torch.float64 else torch.float32


def _visible(sq: int, sk: int, device, *, causal: bool, top_left: bool, window: tuple[int, int]):
    """Boolean [Sq, Sk] mask of the visible keys, or None when every key is visible."""
    if top_left:  # SDPA: j <= i
        if not causal:
            return None
        return torch.arange(sk, device=device)[None, :] <= torch.arange(sq, device=device)[:, None]
    if window[0] < 0 and window[1] < 0 and not causal:
        return None
    return visible_keys(sq, sk, causal, window, device)


def _probs(q, k, *, scale, causal, top_left, window, alibi_slopes, lse=None):
    """s = scale q k^T (+ alibi), masked; lse = logsumexp_j s (-inf for a row that sees no key);
    p = exp(s - lse) (0 where masked). q [B, Hq, Sq, D], k [B, Hq, Sk, D] in the compute dtype."""
    sq, sk = q.shape[-2], k.shape[-2]
    s = torch.matmul(q, k.transpose(-1, -2)) * scale
    if alibi_slopes is not None:  # flash-attn's ALiBi: -slope * |i + Sk - Sq - j|
        rel = (torch.arange(sk, device=q.device)[None, :] - torch.arange(sq, device=q.device)[:, None] - (sk - sq))
        slopes = alibi_slopes.to(s.dtype)
        slopes = slopes.view(-1, 1, 1) if slopes.dim() == 1 else slopes.view(slopes.shape[0], -1, 1, 1)
        s = s - slopes * rel.abs().to(s.dtype)
    mask = _visible(sq, sk, q.device, causal=causal, top_left=top_left, window=window)
    if mask is not None:
        s = s.masked_fill(~mask, float("-inf"))
    if lse is None:
        lse = torch.logsumexp(s, dim=-1)
    safe = torch.where(torch.isinf(lse), torch.zeros_like(lse), lse)  # rows that see no key: p = 0, not NaN
    return torch.exp(s - safe[..., None]), lse


def _keep(shape, dropout_p: float, generator, device, dtype):
    """The dropout keep mask scaled by 1 / (1 - p): one uniform draw per attention weight."""
    u = torch.rand(shape, generator=generator, device=device, dtype=torch.float32)
    return (u >= dropout_p).to(dtype) * (0.0 if dropout_p >= 1.0 else 1.0 / (1.0 - dropout_p))


def math_forward(q, k, v, *, scale=None, causal=False, top_left=False, window=(-1, -1), dropout_p=0.0,
                 generator=None, alibi_slopes=None):
    """The attention formula in plain torch on [B, Hq, Sq, D] q and [B, Hkv, Sk, D] k, v (Hq a
    multiple of Hkv; query head h reads key/value head h // (Hq // Hkv)). Computes in float32
    (float64 for float64 inputs): s = scale q k^T, the mask (``top_left``: SDPA's causal j <= i;
    otherwise flash-attn's bottom-right causal / ``window``), lse = logsumexp(s), out = softmax(s)
    (times the dropout keep mask / (1 - p), drawn from ``generator``) v. Returns out in q's dtype and
    lse in the compute dtype; a row that sees no key gets out 0, lse -inf (the kernel's convention)."""
    ct = _compute_dtype(q)
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)
    g = q.shape[1] // k.shape[1]
    qc = q.to(ct)
    kc, vc = (t.to(ct).repeat_interleave(g, dim=1) for t in (k, v))
    p, lse = _probs(qc, kc, scale=scale, causal=causal, top_left=top_left, window=window, alibi_slopes=alibi_slopes)
    if dropout_p > 0.0:
        p = p * _keep(p.shape, dropout_p, generator, q.device, ct)
    return torch.matmul(p, vc).to(q.dtype), lse


def math_backward(dout, q, k, v, out, lse, *, scale=None, causal=False, top_left=False, window=(-1, -1),
                  dropout_p=0.0, generator=None):
    """The gradients of math_forward from its out and lse (``generator`` seeded as the forward's):
    p = exp(s - lse), dv = (p z)^T dout, dp = (dout v^T) z (z the keep mask / (1 - p)),
    D = rowsum(dout * out), ds = p (dp - D), dq = scale ds k, dk = scale ds^T q; GQA sums dk, dv over
    each key/value head's query heads. Returns dq, dk, dv in the dtypes of q, k, v."""
    ct = _compute_dtype(q)
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)
    B, hq, sq, _ = q.shape
    hkv, sk = k.shape[1], k.shape[2]
    g = hq // hkv
    qc, doc, oc = q.to(ct), dout.to(ct), out.to(ct)
    kc, vc = (t.to(ct).repeat_interleave(g, dim=1) for t in (k, v))
    p, _ = _probs(qc, kc, scale=scale, causal=causal, top_left=top_left, window=window, alibi_slopes=None,
                  lse=lse.to(ct))
    dp = torch.matmul(doc, vc.transpose(-1, -2))
    pz = p
    if dropout_p > 0.0:
        z = _keep(p.shape, dropout_p, generator, q.device, ct)
        pz, dp = p * z, dp * z
    dv = torch.matmul(pz.transpose(-1, -2), doc)
    ds = p * (dp - (doc * oc).sum(-1, keepdim=True))
    dq = torch.matmul(ds, kc) * scale
    dk = torch.matmul(ds.transpose(-1, -2), qc) * scale
    dk = dk.view(B, hkv, g, sk, -1).sum(2)
    dv = dv.view(B, hkv, g, sk, -1).sum(2)
    return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype)


def _views(t, layout, cu, per_row):
    """[1 or B, H, S, D] views of t (or [1 or B, H, S] views of an lse): the whole tensor for the
    dense layouts (one per batch row with ``per_row``), one per sequence of cu for varlen."""
    lse = t.dim() == (2 if layout == "varlen" else 3)
    if layout == "varlen":
        b = cu.tolist()
        if lse:  # [H, T]
            return [t[:, s:e][None] for s, e in zip(b[:-1], b[1:])]
        return [t[s:e].transpose(0, 1)[None] for s, e in zip(b[:-1], b[1:])]
    x = t.transpose(1, 2) if layout == "bshd" and not lse else t
    return [x[i:i + 1] for i in range(x.shape[0])] if per_row else [x]


def _math_run_forward(q, k, v, layout, *, cu_q=None, cu_k=None, scale, causal, top_left, window, dropout_p, seed,
                      alibi_slopes=None, seqused_k=None):
    """math_forward over the sequences of a call (one batched call for a dense layout)."""
    out = torch.empty_like(q) if q.shape[-1] == v.shape[-1] else q.new_empty((*q.shape[:-1], v.shape[-1]))
    out.zero_()  # varlen tokens outside every sequence stay 0
    hd = _HEAD_DIM[layout]
    if layout == "varlen":
        lse = q.new_full((q.shape[1], q.shape[0]), float("-inf"), dtype=torch.float32)
    else:
        lse = q.new_empty((q.shape[0], q.shape[hd], q.shape[3 - hd]), dtype=torch.float32)
    per_row = seqused_k is not None or (alibi_slopes is not None and alibi_slopes.dim() == 2)
    gen = _generator(q.device, seed) if dropout_p > 0.0 else None
    used = seqused_k.tolist() if seqused_k is not None else None
    parts = zip(_views(q, layout, cu_q, per_row), _views(k, layout, cu_k, per_row), _views(v, layout, cu_k, per_row),
                _views(out, layout, cu_q, per_row), _views(lse, layout, cu_q, per_row))
    for b, (qs, ks, vs, os_, ls) in enumerate(parts):
        if used is not None:
            ks, vs = ks[:, :, :used[b]], vs[:, :, :used[b]]
        slopes = alibi_slopes if alibi_slopes is None or alibi_slopes.dim() == 1 else alibi_slopes[b:b + 1]
        o, lb = math_forward(qs, ks, vs, scale=scale, causal=causal, top_left=top_left, window=window,
                             dropout_p=dropout_p, generator=gen, alibi_slopes=slopes)
        os_.copy_(o)
        ls.copy_(lb)
    return out, lse


def _math_run_backward(dout, q, k, v, out, lse, layout, *, cu_q=None, cu_k=None, scale, causal, top_left, window,
                       dropout_p, seed):
    """math_backward over the sequences of a call; the dropout masks in the forward's order."""
    dq, dk, dv = (torch.zeros_like(t) for t in (q, k, v))
    gen = _generator(q.device, seed) if dropout_p > 0.0 else None
    parts = zip(*(_views(t, layout, cu_q, False) for t in (dout, q, out, lse, dq)),
                *(_views(t, layout, cu_k, False) for t in (k, v, dk, dv)))
    for do_s, qs, os_, ls, dqs, ks, vs, dks, dvs in parts:
        gq, gk, gv = math_backward(do_s, qs, ks, vs, os_, ls, scale=scale, causal=causal, top_left=top_left,
                                   window=window, dropout_p=dropout_p, generator=gen)
        dqs.copy_(gq)
        dks.copy_(gk)
        dvs.copy_(gv)
    return dq, dk, dv


# ---- the four overrides ---------------------------------------------------------------------------------


def sdpa_flash_forward(query, key, value, dropout_p=0.0, is_causal=False, return_debug_mask=False, *, scale=None):
    """aten::_scaled_dot_product_flash_attention: q, k, v [B, H, S, D]; SDPA's top-left causal.
    Returns (out, lse, cum_seq_q, cum_seq_k, max_q, max_k, rng_state, unused, debug_attn_mask)."""
    _check(_SDPA_FWD, query, key, value, "bhsd")
    _no_debug_mask(_SDPA_FWD, return_debug_mask)
    sq, sk = query.shape[2], key.shape[2]
    seed = 0
    why = _why_math(query, value, dropout_p)
    if why is None:
        keys, causal, right = _top_left(sq, sk, is_causal)
        out, lse = _dense_forward(query, key[:, :, :keys], value[:, :, :keys], "bhsd", causal=causal, scale=scale,
                                  left=-1, right=right)
    else:
        _announce(_SDPA_FWD, why)
        if dropout_p > 0.0:
            seed = int(torch.randint(0, 2**62, ()).item())
        out, lse = _math_run_forward(query, key, value, "bhsd", scale=scale, causal=is_causal, top_left=True,
                                     window=(-1, -1), dropout_p=dropout_p, seed=seed)
    rng_state, unused = _rng(seed, query.device)
    debug = torch.empty(0, dtype=query.dtype, device=query.device)
    return out, lse, None, None, sq, sk, rng_state, unused, debug


def sdpa_flash_backward(grad_out, query, key, value, out, logsumexp, cum_seq_q, cum_seq_k, max_q, max_k, dropout_p,
                        is_causal, philox_seed, philox_offset, *, scale=None):
    """aten::_scaled_dot_product_flash_attention_backward: dq, dk, dv (like query, key, value)."""
    why = _why_math(query, value, dropout_p)
    if why is None:
        sq, sk = query.shape[2], key.shape[2]
        keys, causal, right = _top_left(sq, sk, is_causal)
        dq, dk, dv = _kernel_backward(grad_out, query, key[:, :, :keys], value[:, :, :keys], out, logsumexp, "bhsd",
                                      causal=causal, scale=scale, left=-1, right=right)
        if keys < sk:  # keys never visible get no gradient
            dk_full, dv_full = torch.zeros_like(key), torch.zeros_like(value)
            dk_full[:, :, :keys] = dk
            dv_full[:, :, :keys] = dv
            dk, dv = dk_full, dv_full
        return dq, dk, dv
    _announce(_SDPA_BWD, why)
    seed = _seed_of(philox_seed) if dropout_p > 0.0 else 0
    return _math_run_backward(grad_out, query, key, value, out, logsumexp, "bhsd", scale=scale, causal=is_causal,
                              top_left=True, window=(-1, -1), dropout_p=dropout_p, seed=seed)


def flash_attention_forward(query, key, value, cum_seq_q, cum_seq_k, max_q, max_k, dropout_p, is_causal,
                            return_debug_mask, *, scale=None, window_size_left=None, window_size_right=None,
                            seqused_k=None, alibi_slopes=None):
    """aten::_flash_attention_forward: [B, S, H, D] (cum_seq_q None) or packed [T, H, D] with int32
    cum_seq_q / cum_seq_k; flash-attn's bottom-right causal and window. Returns (out, lse,
    rng_state, unused, debug_attn_mask)."""
    layout = "bshd" if cum_seq_q is None else "varlen"
    _check(_FLASH_FWD, query, key, value, layout)
    _no_debug_mask(_FLASH_FWD, return_debug_mask)
    left, right = _window(window_size_left, window_size_right, is_causal)
    seed = 0
    why = _why_math(query, value, dropout_p)
    if why is None and alibi_slopes is not None:
        why = "alibi_slopes"
    if why is None and seqused_k is not None:
        why = "seqused_k"
    if alibi_slopes is not None:
        _no_grad_feature(_FLASH_FWD, query, key, value, "alibi_slopes")
    if seqused_k is not None:
        _no_grad_feature(_FLASH_FWD, query, key, value, "seqused_k")
    if why is None and layout == "bshd":
        out, lse = _dense_forward(query, key, value, "bshd", causal=is_causal, scale=scale, left=left, right=right)
    elif why is None:
        out, lse = _kernel_forward(query, key, value, "varlen", causal=is_causal, scale=scale, left=left, right=right,
                                   cu_q=cum_seq_q, cu_k=cum_seq_k, max_q=max_q, max_k=max_k)
        out = _like(out.to(query.dtype), query)
    else:
        _announce(_FLASH_FWD, why)
        if dropout_p > 0.0:
            seed = int(torch.randint(0, 2**62, ()).item())
        out, lse = _math_run_forward(query, key, value, layout, cu_q=cum_seq_q, cu_k=cum_seq_k, scale=scale,
                                     causal=is_causal, top_left=False, window=(left, right), dropout_p=dropout_p,
                                     seed=seed, alibi_slopes=alibi_slopes, seqused_k=seqused_k)
    rng_state, unused = _rng(seed, query.device)
    return out, lse, rng_state, unused, torch.empty(0, dtype=query.dtype, device=query.device)


def flash_attention_backward(grad_out, query, key, value, out, logsumexp, cum_seq_q, cum_seq_k, max_q, max_k,
                             dropout_p, is_causal, rng_state, unused, *, scale=None, window_size_left=None,
                             window_size_right=None):
    """aten::_flash_attention_backward: dq, dk, dv (like query, key, value)."""
    layout = "bshd" if cum_seq_q is None or query.dim() == 4 else "varlen"
    left, right = _window(window_size_left, window_size_right, is_causal)
    cu_q, cu_k = (cum_seq_q, cum_seq_k) if layout == "varlen" else (None, None)
    why = _why_math(query, value, dropout_p)
    if why is None:
        return _kernel_backward(grad_out, query, key, value, out, logsumexp, layout, causal=is_causal, scale=scale,
                                left=left, right=right, cu_q=cu_q, cu_k=cu_k, max_q=max_q, max_k=max_k)
    _announce(_FLASH_BWD, why)
    seed = _seed_of(rng_state) if dropout_p > 0.0 else 0
    return _math_run_backward(grad_out, query, key, value, out, logsumexp, layout, cu_q=cu_q, cu_k=cu_k, scale=scale,
                              causal=is_causal, top_left=False, window=(left, right), dropout_p=dropout_p, seed=seed)


__all__ = ["NAME", "activate", "restore", "available", "math_forward", "math_backward"]
