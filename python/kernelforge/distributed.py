"""kernelforge under torch.distributed: DTensor sharding rules for the ops that are local per shard, and
the vocabulary-parallel cross-entropy of tensor parallelism (Megatron's), plain and fused with the
lm_head GEMM.

**DTensor.** The ops below accept DTensor arguments: each one computes on the local shards, and DTensor
redistributes the arguments first when their placements are not among the op's rules (one rule per
line: the placements of the outputs, then of the inputs, on one mesh dimension; every op also runs on
all-replicated arguments). Row-wise means any dimension but the last (the normalized / softmax /
gated-concat one); weight gradients of sharded rows are partial sums (``Partial()``), which DTensor
reduces when they are used.

    norms        rms_norm, add_rms_norm, layer_norm (+ backward)   x, residual row-wise; weight, bias replicated
    activations  silu_and_mul, gelu_and_mul (+ backward)            row-wise (the last dim holds [gate | up])
                 swiglu, geglu, gelu (+ backward)                   any dimension (elementwise)
    softmax      softmax, log_softmax (+ backward)                  row-wise
    rope         apply_rope (+ backward)                            heads (tensor parallelism), batch, or sequence
                                                                    (cos/sin sharded alike; a position_ids cache
                                                                    replicated)

The rules are registered when ``torch.distributed.tensor`` is imported (before or after kernelforge;
importing it costs half a second, so kernelforge does not import it itself). ``register_dtensor_sharding()``
registers them explicitly. The other ops (attention, GEMMs, decode, ada_norm, the LTX rope) take plain
tensors: call them on ``x.to_local()``. Under FSDP2 none of this is needed: ``fully_shard`` gathers the
parameters into plain tensors before each forward, so ``kf.patch`` works as it does on one GPU.

**Vocabulary-parallel cross-entropy.** With the lm_head sharded by vocabulary over a process group, each
rank holds the logits of classes [start, start + V_r) of V. The loss needs the log-sum-exp over every
class; no rank gathers the logits:

    rank r:   lse_r, s_r = the shard's log-sum-exp, and its linear terms (1 - eps) z_t [t in shard]
              + (eps / V) sum_shard z_j: one read of the logits (the cross-entropy forward kernel)
    all-reduce MAX  m = max_r lse_r                                    [T] float32
    all-reduce SUM  (sum_r exp(lse_r - m), sum_r s_r)                  [2, T] float32
    lse = m + log(first), loss = lse - second + z_loss * lse^2

and the backward writes each rank's columns of softmax - target from the global lse (one read, one write;
no communication). The fused form takes the hidden states and the lm_head shard and processes the tokens
in chunks (GEMM, the forward kernel, the two all-reduces of the chunk's rows, the gradient written over
the chunk's logits, two GEMMs for the gradients): the ``[T, V]`` logits never exist anywhere, and each
rank holds at most one ``[chunk, V_r]`` block. The hidden states are the same on every rank of the group
(replicated, as the input of a column-parallel lm_head); their gradient is all-reduced over the group.
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import sys
import warnings

import torch
import torch.distributed as dist

from ._ops import _ops
from .cross_entropy import _softcap

# ---- DTensor sharding rules ------------------------------------------------------------------------------------

_registered = False


def _rules():
    """{op overload: function(*args) -> [(output placements, input placements), ...]} (register_sharding's form)."""
    from torch.distributed.tensor import Partial, Replicate, Shard  # noqa: PLC0415

    R, P = Replicate(), Partial()

    def opt(t, p):  # the placement of an optional tensor argument (None when it is absent)
        return None if t is None else p

    def rows(ndim, last=False):  # the dimensions a row-wise (or, with last, elementwise) op may shard
        return range(ndim if last else ndim - 1)

    def norm(x, w, eps):
        return [([R], [R, opt(w, R), None])] + [([Shard(d)], [Shard(d), opt(w, R), None]) for d in rows(x.ndim)]

    def norm_bwd(dy, x, w, eps):
        return [([R, R], [R, R, opt(w, R), None])] + [
            ([Shard(d), P if w is not None else R], [Shard(d), Shard(d), opt(w, R), None]) for d in rows(x.ndim)]

    def add_norm(x, r, w, eps):
        return [([R, R], [R, R, opt(w, R), None])] + [
            ([Shard(d), Shard(d)], [Shard(d), Shard(d), opt(w, R), None]) for d in rows(x.ndim)]

    def add_norm_bwd(dy, dsum, s, w, eps):
        return [([R, R], [R, opt(dsum, R), R, opt(w, R), None])] + [
            ([Shard(d), P if w is not None else R], [Shard(d), opt(dsum, Shard(d)), Shard(d), opt(w, R), None])
            for d in rows(s.ndim)]

    def layer_norm(x, w, b, eps):
        return [([R], [R, opt(w, R), opt(b, R), None])] + [
            ([Shard(d)], [Shard(d), opt(w, R), opt(b, R), None]) for d in rows(x.ndim)]

    def layer_norm_bwd(dy, x, w, b, eps):
        return [([R, R, R], [R, R, opt(w, R), opt(b, R), None])] + [
            ([Shard(d), P if w is not None else R, P if b is not None else R],
             [Shard(d), Shard(d), opt(w, R), opt(b, R), None]) for d in rows(x.ndim)]

    def same(n_out, n_tensors, n_scalars, last):  # every tensor sharded alike (row-wise or elementwise)
        def rule(*args):
            dims = [None] + list(rows(args[0].ndim, last))
            return [([Shard(d) if d is not None else R] * n_out,
                     [Shard(d) if d is not None else R] * n_tensors + [None] * n_scalars) for d in dims]
        return rule

    def rope(q, k, cos, sin, pos, interleaved, layout, rotary_dim):
        heads, seq = (2, 1) if layout == "bshd" else (1, 2)
        k_out = lambda p: p if k is not None else R  # noqa: E731  (no k: the op returns an empty tensor)
        out = [([R, R], [R, opt(k, R), R, R, opt(pos, R), None, None, None])]
        out.append(([Shard(heads), k_out(Shard(heads))], [Shard(heads), opt(k, Shard(heads)), R, R, opt(pos, R),
                                                          None, None, None]))
        cs = Shard(0) if pos is None and cos.ndim == 3 else R  # batch: per-batch cos/sin are sharded alike
        out.append(([Shard(0), k_out(Shard(0))], [Shard(0), opt(k, Shard(0)), cs, cs, opt(pos, Shard(0)),
                                                  None, None, None]))
        cs = R if pos is not None else Shard(cos.ndim - 2)  # sequence: cos/sin rows (or positions) alike
        out.append(([Shard(seq), k_out(Shard(seq))], [Shard(seq), opt(k, Shard(seq)), cs, cs, opt(pos, Shard(1)),
                                                      None, None, None]))
        return out

    k = torch.ops.kernelforge
    return {
        k.rms_norm.default: norm,
        k.rms_norm_backward.default: norm_bwd,
        k.add_rms_norm.default: add_norm,
        k.add_rms_norm_backward.default: add_norm_bwd,
        k.layer_norm.default: layer_norm,
        k.layer_norm_backward.default: layer_norm_bwd,
        k.silu_and_mul.default: same(1, 1, 0, last=False),
        k.silu_and_mul_backward.default: same(1, 2, 0, last=False),
        k.gelu_and_mul.default: same(1, 1, 2, last=False),
        k.gelu_and_mul_backward.default: same(1, 2, 2, last=False),
        k.swiglu.default: same(1, 2, 0, last=True),
        k.swiglu_backward.default: same(2, 3, 0, last=True),
        k.geglu.default: same(1, 2, 1, last=True),
        k.geglu_backward.default: same(2, 3, 1, last=True),
        k.gelu.default: same(1, 1, 1, last=True),
        k.gelu_backward.default: same(1, 2, 1, last=True),
        k.softmax.default: same(1, 1, 0, last=False),
        k.softmax_backward.default: same(1, 2, 0, last=False),
        k.log_softmax.default: same(1, 1, 0, last=False),
        k.log_softmax_backward.default: same(1, 2, 0, last=False),
        k.apply_rope.default: rope,
        k.apply_rope_backward.default: rope,
    }


def register_dtensor_sharding() -> None:
    """Registers the DTensor sharding rules of the ops listed in the module docstring (idempotent).
    Done automatically when ``torch.distributed.tensor`` is imported; imports it."""
    global _registered
    if _registered:
        return
    from torch.distributed.tensor import DTensor  # noqa: PLC0415
    from torch.distributed.tensor.experimental import register_sharding  # noqa: PLC0415

    for op, rule in _rules().items():
        register_sharding(op)(rule)
        # register_sharding hashes only int arguments into its cache key; the strings and floats of these
        # ops (rope's layout) choose the rule too, so every non-tensor argument goes into the key.
        try:
            from torch.distributed.tensor._op_schema import RuntimeSchemaInfo  # noqa: PLC0415

            first = next((i for i, a in enumerate(op._schema.arguments)
                          if "Tensor" not in str(a.type)), len(op._schema.arguments))
            DTensor._op_dispatcher.sharding_propagator.op_to_schema_info[op] = RuntimeSchemaInfo(
                first, needs_pytree=True)
        except (ImportError, AttributeError):  # a torch without these internals: the public default
            pass
    _registered = True


class _RegisterAfterImport(importlib.abc.MetaPathFinder):
    """Registers the sharding rules right after ``torch.distributed.tensor`` is first imported."""

    name = "torch.distributed.tensor"

    def find_spec(self, fullname, path, target=None):
        if fullname != self.name:
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(fullname)
        loader = getattr(spec, "loader", None)
        if loader is None or not hasattr(loader, "exec_module"):
            return spec
        exec_module = loader.exec_module

        def exec_then_register(module):
            exec_module(module)
            try:
                register_dtensor_sharding()
            except Exception as e:  # noqa: BLE001  (never break the user's import)
                warnings.warn(f"kernelforge: could not register the DTensor sharding rules: {e}", stacklevel=2)

        loader.exec_module = exec_then_register
        return spec


def _install_registration() -> None:
    if not dist.is_available():
        return
    if _RegisterAfterImport.name in sys.modules:
        register_dtensor_sharding()
    elif not any(isinstance(f, _RegisterAfterImport) for f in sys.meta_path):
        sys.meta_path.insert(0, _RegisterAfterImport())


# ---- vocabulary-parallel cross-entropy ---------------------------------------------------------------------------


def _group_rank_size(group):
    if not dist.is_available() or not dist.is_initialized():
        raise RuntimeError("vocab-parallel cross-entropy: torch.distributed is not initialized "
                           "(call torch.distributed.init_process_group first)")
    return dist.get_rank(group), dist.get_world_size(group)


def _shard_range(local_vocab: int, group, class_start, num_classes) -> tuple[int, int]:
    """(class_start, num_classes): given, or equal shards in rank order (Megatron's layout)."""
    rank, size = _group_rank_size(group)
    if (class_start is None) != (num_classes is None):
        raise ValueError("vocab-parallel cross-entropy: pass both class_start and num_classes, or neither "
                         "(equal shards in rank order)")
    if class_start is None:
        return rank * local_vocab, size * local_vocab
    if not (0 <= class_start and class_start + local_vocab <= num_classes):
        raise ValueError(f"vocab-parallel cross-entropy: the shard [class_start, class_start + V_r) = "
                         f"[{class_start}, {class_start + local_vocab}) must lie in [0, num_classes = {num_classes})")
    return int(class_start), int(num_classes)


def _vocab_shard(t, dim: int, what: str):
    """A DTensor sharded on the class dimension `dim` over a 1-D mesh: (local tensor, group, class_start,
    num_classes); a clear error for any other placement."""
    from torch.distributed.tensor import Shard  # noqa: PLC0415
    from torch.distributed.tensor._utils import compute_local_shape_and_global_offset  # noqa: PLC0415

    mesh, placements = t.device_mesh, tuple(t.placements)
    dim %= t.ndim
    if mesh.ndim != 1 or not (isinstance(placements[0], Shard) and placements[0].dim % t.ndim == dim):
        raise ValueError(f"{what} must be sharded on the class dimension ({dim}) over a 1-D mesh, got "
                         f"placements {placements} on a {mesh.ndim}-D mesh")
    _, offset = compute_local_shape_and_global_offset(t.shape, mesh, placements)
    return t.to_local(), mesh.get_group(), int(offset[dim]), int(t.shape[dim])


def _full(t):
    """A DTensor's whole value (the targets are replicated: no communication then), else t."""
    return t.full_tensor() if type(t).__name__ == "DTensor" else t


def _combine(row_loss, lse_r, valid_rows, group, z_loss_scale):
    """The global lse and row losses from each shard's (row_loss, lse): two all-reduces of [T] floats."""
    linear = lse_r - row_loss  # (1 - eps) z_t [t in shard] + (eps / V) sum_shard z (the kernel's z-loss is 0)
    m = lse_r.clone()
    dist.all_reduce(m, op=dist.ReduceOp.MAX, group=group)
    m_safe = torch.where(torch.isfinite(m), m, torch.zeros_like(m))  # every logit -inf: keep lse -inf, not NaN
    sums = torch.stack([torch.exp(lse_r - m_safe), linear])
    dist.all_reduce(sums, op=dist.ReduceOp.SUM, group=group)
    lse = m_safe + torch.log(sums[0])
    loss = lse - sums[1]
    if z_loss_scale:
        loss = loss + z_loss_scale * lse * lse
    return torch.where(valid_rows, loss, torch.zeros_like(loss)), lse


class _VocabParallelCE(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logits, target, group, start, n, ignore_index, eps, z, cap):
        row_loss, lse_r = _ops.cross_entropy_shard(logits, target, start, n, ignore_index, eps, cap)
        valid_rows = target != ignore_index
        # Shards see a NaN row for a target outside [0, V) (the device-side check); the sums spread it.
        loss, lse = _combine(row_loss, lse_r, valid_rows, group, z)
        ctx.save_for_backward(logits, target, lse)
        ctx.args = (start, n, ignore_index, eps, z, cap)
        ctx.mark_non_differentiable(lse)
        return loss, lse

    @staticmethod
    def backward(ctx, dloss, _dlse):
        logits, target, lse = ctx.saved_tensors
        dlogits = torch.empty_like(logits)
        _ops.cross_entropy_shard_backward(dloss.float(), logits, target, lse, *ctx.args, dlogits)
        return dlogits, None, None, None, None, None, None, None, None


def _reduce(rows, target, ignore_index, reduction):
    if reduction == "none":
        return rows
    total = rows.sum()
    if reduction == "sum":
        return total
    return total / (target != ignore_index).sum()  # 0 / 0 = NaN when every row is ignored, as PyTorch


def _check_reduction(name, reduction):
    if reduction not in ("mean", "sum", "none"):
        raise ValueError(f"{name}: reduction must be 'mean', 'sum' or 'none', got {reduction!r}")


def vocab_parallel_cross_entropy(
    logits: torch.Tensor,
    target: torch.Tensor,
    group=None,
    *,
    class_start: int | None = None,
    num_classes: int | None = None,
    ignore_index: int = -100,
    label_smoothing: float = 0.0,
    reduction: str = "mean",
    z_loss_scale: float = 0.0,
    softcap: float | None = None,
    return_lse: bool = False,
):
    """Cross-entropy of logits sharded by class over ``group`` (default: the world), without gathering them.

    ``logits [..., V_r]``: this rank's classes [class_start, class_start + V_r) of ``num_classes``
    (default: equal shards in rank order, Megatron's layout: class_start = rank * V_r). A DTensor sharded
    on its last dimension over a 1-D mesh also works (its group and offsets are used). ``target [...]``:
    global class indices, the same on every rank. The loss (and the options) are those of
    ``kernelforge.cross_entropy`` of the gathered logits, on every rank. Communication: two all-reduces
    of [T] float32 in the forward, none in the backward. Differentiable w.r.t. ``logits``.
    """
    name = "vocab_parallel_cross_entropy"
    _check_reduction(name, reduction)
    if type(logits).__name__ == "DTensor":
        if group is not None or class_start is not None or num_classes is not None:
            raise ValueError(f"{name}: DTensor logits carry their group and class range; do not pass group, "
                             "class_start or num_classes")
        logits, group, class_start, num_classes = _vocab_shard(logits, -1, f"{name}: DTensor logits")
        target = _full(target)
    if logits.dim() < 1 or tuple(target.shape) != tuple(logits.shape[:-1]):
        raise ValueError(f"{name}: target must have the shape of logits without its last (class) dimension, "
                         f"{tuple(logits.shape[:-1])}; got {tuple(target.shape)}")
    start, n = _shard_range(logits.shape[-1], group, class_start, num_classes)
    rows = logits.reshape(-1, logits.shape[-1])
    t = target.reshape(-1)
    loss_rows, lse = _VocabParallelCE.apply(rows, t, group, start, n, int(ignore_index), float(label_smoothing),
                                            float(z_loss_scale), _softcap(softcap))
    loss = _reduce(loss_rows, t, ignore_index, reduction)
    loss = loss.view(target.shape) if reduction == "none" else loss
    loss = loss.to(logits.dtype)
    return (loss, lse.view(target.shape)) if return_lse else loss


# ---- the fused linear form ----------------------------------------------------------------------------------------

_CHUNK_BYTES = 512 << 20  # logits per chunk: at most this many bytes on each rank


def _chunk_tokens(tokens: int, local_vocab: int, elem: int, chunk_tokens: int) -> int:
    if chunk_tokens > 0:
        return chunk_tokens
    return max(1, min(tokens, _CHUNK_BYTES // max(1, local_vocab * elem)))


def _logits(h, w, b):
    return torch.addmm(b, h, w.t()) if b is not None else h @ w.t()


class _VocabParallelFLCE(torch.autograd.Function):
    """Mean / sum: the gradients are computed in the forward (each chunk's logits are overwritten by their
    gradient right away) and scaled by the loss gradient in the backward (once: a second backward through the
    same graph, like "none", recomputes the chunks with the saved global lse)."""

    @staticmethod
    def forward(ctx, hidden, weight, bias, target, group, start, n, ignore_index, eps, z, cap, reduction, chunk):
        tokens = hidden.shape[0]
        valid_rows = target != ignore_index
        eager_grads = any(ctx.needs_input_grad[:3]) and reduction != "none"
        loss_rows = torch.empty(tokens, dtype=torch.float32, device=hidden.device)
        lse = torch.empty(tokens, dtype=torch.float32, device=hidden.device)
        dh = torch.zeros_like(hidden) if eager_grads and ctx.needs_input_grad[0] else None
        dw = torch.zeros_like(weight, dtype=torch.float32) if eager_grads and ctx.needs_input_grad[1] else None
        db = torch.zeros_like(bias, dtype=torch.float32) if eager_grads and bias is not None \
            and ctx.needs_input_grad[2] else None
        if eager_grads:  # per unit loss gradient of every row; the backward scales by the real one (uniform)
            g = torch.ones((), dtype=torch.float32, device=hidden.device)
        for c0 in range(0, tokens, chunk):
            c1 = min(tokens, c0 + chunk)
            h, t = hidden[c0:c1], target[c0:c1]
            logits = _logits(h, weight, bias)
            rl, lse_r = _ops.cross_entropy_shard(logits, t, start, n, ignore_index, eps, cap)
            loss_rows[c0:c1], lse[c0:c1] = _combine(rl, lse_r, valid_rows[c0:c1], group, z)
            if eager_grads:
                _ops.cross_entropy_shard_backward(g.expand(c1 - c0), logits, t, lse[c0:c1], start, n, ignore_index,
                                                  eps, z, cap, logits)
                _accumulate(logits, h, weight, dh, dw, db, c0, c1)
        if dh is not None:
            dist.all_reduce(dh, group=group)  # the hidden states are replicated: their gradient sums the ranks
        ctx.save_for_backward(hidden, weight, bias, target, lse)
        ctx.args = (group, start, n, ignore_index, eps, z, cap, reduction, chunk)
        ctx.grads = (dh, dw, db) if eager_grads else None
        return loss_rows

    @staticmethod
    def backward(ctx, dloss):
        hidden, weight, bias, target, lse = ctx.saved_tensors
        group, start, n, ignore_index, eps, z, cap, reduction, chunk = ctx.args
        if ctx.grads is not None:  # mean / sum: every row's loss gradient is the same scalar
            dh, dw, db = ctx.grads
            ctx.grads = None
            s = dloss[:1].sum()  # mean / sum: _reduce gives every row one gradient (1/valid or 1); 0 rows: 0
            return (_scaled(dh, s, hidden), _scaled(dw, s, weight), _scaled(db, s, bias),
                    None, None, None, None, None, None, None, None, None, None)
        need_h, need_w, need_b = ctx.needs_input_grad[:3]
        dh = torch.zeros_like(hidden) if need_h else None
        dw = torch.zeros_like(weight, dtype=torch.float32) if need_w else None
        db = torch.zeros_like(bias, dtype=torch.float32) if need_b and bias is not None else None
        for c0 in range(0, hidden.shape[0], chunk):
            c1 = min(hidden.shape[0], c0 + chunk)
            h, t = hidden[c0:c1], target[c0:c1]
            logits = _logits(h, weight, bias)
            _ops.cross_entropy_shard_backward(dloss[c0:c1].float(), logits, t, lse[c0:c1], start, n, ignore_index,
                                              eps, z, cap, logits)
            _accumulate(logits, h, weight, dh, dw, db, c0, c1)
        if dh is not None:
            dist.all_reduce(dh, group=group)
        return (dh, _scaled(dw, None, weight), _scaled(db, None, bias),
                None, None, None, None, None, None, None, None, None, None)


def _accumulate(dlogits, h, weight, dh, dw, db, c0, c1):
    """The chunk's gradients from its dlogits [C, V_r]: dh = dlogits W, dW += dlogitsᵀ h, db += column sums."""
    if dh is not None:
        torch.mm(dlogits, weight, out=dh[c0:c1])
    if dw is not None:  # accumulated in float32 over the chunks
        dw.add_(torch.mm(dlogits.t(), h))
    if db is not None:
        db.add_(dlogits.float().sum(0))


def _scaled(g, s, like):
    if g is None:
        return None
    if s is not None:
        g = g * s.to(g.dtype)
    return g.to(like.dtype)


def vocab_parallel_fused_linear_cross_entropy(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    target: torch.Tensor,
    bias: torch.Tensor | None = None,
    group=None,
    *,
    class_start: int | None = None,
    num_classes: int | None = None,
    ignore_index: int = -100,
    label_smoothing: float = 0.0,
    reduction: str = "mean",
    z_loss_scale: float = 0.0,
    softcap: float | None = None,
    chunk_tokens: int = 0,
) -> torch.Tensor:
    """``vocab_parallel_cross_entropy(hidden @ weight.T + bias, target)`` with ``weight [V_r, H]`` this rank's
    rows of the lm_head (a column-parallel lm_head's shard; ``bias [V_r]`` or None), without the logits.

    ``hidden [..., H]`` and ``target [...]`` are the same on every rank of ``group``. Tokens run in chunks of
    ``chunk_tokens`` (0: at most 512 MiB of logits per chunk on each rank), two all-reduces of the chunk's
    [C] floats each, and one all-reduce of the hidden states' gradient. The loss is float32, on every rank.
    Differentiable w.r.t. hidden, weight and bias; for "mean"/"sum" the gradients are computed in the
    forward, "none" (and a second backward through the same graph) recomputes the chunks in the backward.
    """
    name = "vocab_parallel_fused_linear_cross_entropy"
    _check_reduction(name, reduction)
    if hidden.dim() < 1 or tuple(target.shape) != tuple(hidden.shape[:-1]):
        raise ValueError(f"{name}: target must have the shape of hidden without its last dimension, "
                         f"{tuple(hidden.shape[:-1])}; got {tuple(target.shape)}")
    if weight.dim() != 2 or weight.shape[1] != hidden.shape[-1]:
        raise ValueError(f"{name}: weight must be [V_r, {hidden.shape[-1]}] (this rank's lm_head rows), got "
                         f"{tuple(weight.shape)}")
    if bias is not None and tuple(bias.shape) != (weight.shape[0],):
        raise ValueError(f"{name}: bias must be [{weight.shape[0]}] or None, got {tuple(bias.shape)}")
    for t, what in ((weight, "weight"), (bias, "bias")):
        if t is not None and (t.dtype != hidden.dtype or t.device != hidden.device):
            raise ValueError(f"{name}: {what} must have hidden's dtype and device ({hidden.dtype}, {hidden.device}), "
                             f"got {t.dtype}, {t.device}")
    if target.dtype not in (torch.int64, torch.int32):
        raise ValueError(f"{name}: target must be int64 (or int32) class indices, got {target.dtype}")
    start, n = _shard_range(weight.shape[0], group, class_start, num_classes)
    rows = hidden.reshape(-1, hidden.shape[-1])
    t = target.reshape(-1).to(rows.device)
    chunk = _chunk_tokens(rows.shape[0], weight.shape[0], hidden.element_size(), int(chunk_tokens))
    loss_rows = _VocabParallelFLCE.apply(rows, weight, bias, t, group, start, n, int(ignore_index),
                                         float(label_smoothing), float(z_loss_scale), _softcap(softcap),
                                         reduction, chunk)
    loss = _reduce(loss_rows, t, ignore_index, reduction)
    return loss.view(target.shape) if reduction == "none" else loss


def _dtensor_fused_linear_cross_entropy(hidden, weight, target, bias=None, **kwargs):
    """kernelforge.fused_linear_cross_entropy with a DTensor weight sharded by rows (vocabulary) over a 1-D
    mesh: each rank's rows through vocab_parallel_fused_linear_cross_entropy (hidden and target replicated:
    plain tensors or replicated DTensors)."""
    from torch.distributed.tensor import Replicate  # noqa: PLC0415

    name = "fused_linear_cross_entropy"
    w, group, start, n = _vocab_shard(weight, 0, f"{name}: a DTensor weight (the lm_head's rows)")
    b = _vocab_shard(bias, 0, f"{name}: with a DTensor weight, the bias")[0] if bias is not None else None
    for t, what in ((hidden, "hidden"), (target, "target")):
        if type(t).__name__ == "DTensor" and any(p != Replicate() for p in t.placements):
            raise ValueError(f"{name}: {what} must be replicated over the weight's mesh, got {t.placements}")
    return vocab_parallel_fused_linear_cross_entropy(_full(hidden), w, _full(target), b, group, class_start=start,
                                                     num_classes=n, **kwargs)


__all__ = [
    "register_dtensor_sharding",
    "vocab_parallel_cross_entropy",
    "vocab_parallel_fused_linear_cross_entropy",
]
