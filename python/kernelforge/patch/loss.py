"""The loss entries of the patch table (family "loss"); see __init__.py for the machinery.

Patched: a transformers causal LM (a ``model`` submodule, a plain ``torch.nn.Linear`` ``lm_head``
without hooks, transformers' ``ForCausalLMLoss`` as ``loss_function``) whose forward, given labels,
computes from the hidden states ``h`` its ``model`` returns

    logits = lm_head(h)                                  (optionally softcapped: tanh(logits / c) * c)
    loss = loss_function(logits, labels, vocab_size, ...)

whatever else it does and however its source reads (Llama, Mistral, Qwen2/3, Gemma 1/2/3, Phi, ... in
any transformers version that keeps this computation).

How: the patched forward runs the class's own forward (its decorators included) with ``self`` a
stand-in (``_match.StandIn``) whose ``lm_head`` returns deferred logits (``_Deferred``: the hidden
states and the elementwise softcap ops applied to them, nothing multiplied) and whose ``loss_function``
computes ``ForCausalLMLoss`` with ``kernelforge.fused_linear_cross_entropy`` from them, without ever
materializing the ``[tokens, vocab]`` logits. The output is the forward's own, with ``logits=None`` (with
``patch(model, logits_with_loss=True)``: the logits, computed as the original computes them). Calls
without labels run the original forward unchanged.

Verified when patching, on a CPU probe: the class's forward runs on a stand-in whose ``model`` returns
small random hidden states and whose ``lm_head`` is a small random Linear with the real vocabulary,
once as it is and once with the deferred logits and the fused loss; the losses and logits must agree
and the fused loss must have been used. A forward that does something else with the logits (another
loss, another use of the logits) is skipped with the reason.

ForCausalLMLoss semantics (``fixed_cross_entropy``): labels padded on the right with ``ignore_index``
and shifted by one, unless ``shift_labels`` is passed; reduction "mean" over the non-ignored tokens
(NaN when every label is ignored), or "sum" divided by ``num_items_in_batch`` when that is passed; the
loss is float32. Under ``torch.autocast`` the hidden states, weight and bias are cast to the autocast
dtype first, as autocast does for the original ``lm_head``.

At run time, when the fused op cannot give the original's result (a dtype or device the op does not
take, ``lm_head`` or ``loss_function`` replaced or hooked after patching, labels that are not int64,
...), the original ``lm_head`` and ``loss_function`` run on the hidden states, with the one-time warning
(KF_STRICT=1: an error). The op is looked up as ``kernelforge.fused_linear_cross_entropy`` at call time.

Numerics: the original rounds the logits to the model dtype (bf16: ~3 significant digits) and, with
softcapping, rounds three more times before upcasting; the fused op accumulates the logits in float32
and applies the softcap in float32. In float32 both agree to rounding.
"""

from __future__ import annotations

import functools
import inspect
import sys
from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn

from ._match import StandIn, hooked, probe_generator
from ._registry import STATE_ATTR, Replacement, register_replacement
from ._runtime import warn_fallback

_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
_DEVICES = ("cpu", "cuda")
_OP = "kernelforge.fused_linear_cross_entropy"
_FALLBACK_HINT = ("Keep lm_head a plain torch.nn.Linear of the hidden states' dtype and device, the model's "
                  "loss_function transformers' ForCausalLMLoss, and pass int64 labels.")


# ---- deferred logits -------------------------------------------------------------------------------------


class _Deferred:
    """What the stand-in's lm_head returns: ``head(hidden)`` followed by ``ops`` (elementwise
    ("div", c), ("tanh",), ("mul", c)), not computed. Any other use computes the real logits."""

    def __init__(self, hidden: torch.Tensor, head: nn.Linear, ops: tuple = ()):
        self.hidden, self.head, self.ops = hidden, head, ops

    def materialize(self) -> torch.Tensor:
        t = self.head(self.hidden)
        for op in self.ops:
            t = t / op[1] if op[0] == "div" else (torch.tanh(t) if op[0] == "tanh" else t * op[1])
        return t

    def softcap(self) -> "tuple[bool, float | None]":
        """(True, c) for tanh(logits / c) * c, (True, None) for the bare logits, (False, None) otherwise."""
        if not self.ops:
            return True, None
        if len(self.ops) == 3 and self.ops[0][0] == "div" and self.ops[1] == ("tanh",) and self.ops[2][0] == "mul" \
                and self.ops[0][1] == self.ops[2][1]:
            return True, self.ops[0][1]
        return False, None

    def _then(self, op):
        return _Deferred(self.hidden, self.head, (*self.ops, op))

    def __truediv__(self, c):
        return self._then(("div", c)) if isinstance(c, (int, float)) else self.materialize() / c

    def __mul__(self, c):
        return self._then(("mul", c)) if isinstance(c, (int, float)) else self.materialize() * c

    __rmul__ = __mul__

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is torch.tanh and len(args) == 1 and not kwargs:
            return args[0]._then(("tanh",))
        real = [a.materialize() if isinstance(a, _Deferred) else a for a in args]
        return func(*real, **kwargs)

    def __getattr__(self, name):  # logits.float(), logits.shape, ...: the real logits
        if name in ("hidden", "head", "ops"):
            raise AttributeError(name)
        return getattr(self.materialize(), name)

    def __getitem__(self, index):
        return self.materialize()[index]


# ---- the loss computed from deferred logits -----------------------------------------------------------------


def _shift_labels(labels, ignore_index=-100, shift_labels=None) -> torch.Tensor:
    """ForCausalLMLoss's targets: labels padded with ignore_index and shifted left by one, or shift_labels."""
    if shift_labels is None:
        labels = F.pad(labels, (0, 1), value=ignore_index)
        shift_labels = labels[..., 1:].contiguous()
    return shift_labels


def _column_parallel(head) -> "tuple | None":
    """(mesh, input layouts) when lm_head is tensor-parallel by vocabulary: its weight (and bias) a DTensor
    sharded by rows over a 1-D mesh and its only hooks the ones ``parallelize_module`` installs for one
    ``ColwiseParallel`` style (the hidden states' layout in, the logits' out); else None."""
    if "torch.distributed.tensor" not in sys.modules:  # no DTensor in this process
        return None
    from torch.distributed.tensor import DTensor, Shard  # noqa: PLC0415
    from torch.distributed.tensor.parallel import ColwiseParallel  # noqa: PLC0415

    w, b = head.weight, head.bias
    if not isinstance(w, DTensor) or w.device_mesh.ndim != 1 or tuple(w.placements) != (Shard(0),):
        return None
    if b is not None and not (isinstance(b, DTensor) and tuple(b.placements) == (Shard(0),)):
        return None
    if head._backward_hooks or head._backward_pre_hooks or len(head._forward_pre_hooks) != 1 \
            or len(head._forward_hooks) != 1:
        return None
    def style_partial(hook, fn):  # distribute_module's hooks close over partial(<the style's fn>, layouts, ...)
        for cell in getattr(hook, "__closure__", None) or ():
            c = cell.cell_contents
            if isinstance(c, functools.partial) and c.func is fn:
                return c
        return None

    pre = style_partial(next(iter(head._forward_pre_hooks.values())), ColwiseParallel._prepare_input_fn)
    post = style_partial(next(iter(head._forward_hooks.values())), ColwiseParallel._prepare_output_fn)
    if pre is None or post is None or not pre.args:
        return None
    return w.device_mesh, tuple(pre.args[0])  # the hidden states' layout (Replicate, or Shard(1) for SP)


def _head_unsupported(head) -> str | None:
    if not isinstance(head, nn.Linear) or type(head).forward is not nn.Linear.forward:
        return f"lm_head is {type(head).__name__}, not a plain torch.nn.Linear"
    if hooked(head) and _column_parallel(head) is None:
        return "lm_head has hooks (the fused loss does not call lm_head)"
    if "forward" in head.__dict__:
        return "lm_head's forward is overridden on the instance (e.g. by an accelerate hook)"
    if torch.nn.modules.module._global_forward_hooks or torch.nn.modules.module._global_forward_pre_hooks:
        return "global module forward hooks (the fused loss does not call lm_head)"
    return None


def _fused_unsupported(hidden, weight, bias, target, vocab_size, cap) -> str | None:
    """Why the fused op cannot compute what ForCausalLMLoss of the logits would, or None."""
    if vocab_size != weight.shape[0]:
        return f"lm_head with {weight.shape[0]} outputs and vocab_size {vocab_size}"
    if not isinstance(target, torch.Tensor) or target.dtype != torch.int64:
        return f"labels of type {getattr(target, 'dtype', type(target).__name__)} (the op takes int64)"
    for t, name in ((hidden, "hidden states"), (weight, "lm_head.weight"), (bias, "lm_head.bias")):
        if t is None:
            continue
        if t.dtype not in _DTYPES:
            return f"{name} of dtype {t.dtype}"
        if t.device.type not in _DEVICES or t.device != hidden.device:
            return f"hidden states on {hidden.device} and {name} on {t.device}"
        if t.dtype != hidden.dtype:
            return f"hidden states of dtype {hidden.dtype} and {name} of dtype {t.dtype}"
    if cap is not None and not (isinstance(cap, (int, float)) and cap > 0):
        return f"a softcap of {cap!r} (the op takes a positive number)"
    return None


def _fused_loss(deferred: _Deferred, cap, labels, vocab_size, num_items_in_batch=None, ignore_index=-100,
                shift_labels=None) -> "torch.Tensor | str":
    """ForCausalLMLoss(softcap(lm_head(hidden)), labels, vocab_size, ...) by the fused op, or why it cannot."""
    h, weight, bias = deferred.hidden, deferred.head.weight, deferred.head.bias
    dev = h.device.type
    if torch.is_autocast_enabled(dev):  # autocast would run lm_head in its dtype
        dt = torch.get_autocast_dtype(dev)
        h, weight = h.to(dt), weight.to(dt)
        bias = bias.to(dt) if bias is not None else None
    target = _shift_labels(labels, ignore_index, shift_labels)
    why = _fused_unsupported(h, weight, bias, target, vocab_size, cap)
    if why is not None:
        return why
    tp = _column_parallel(deferred.head)
    if tp is not None:
        h = _replicated(tp, h)
        target = target.full_tensor() if type(target).__name__ == "DTensor" else target
    target = target.reshape(-1).to(h.device)
    rows = h.reshape(-1, h.shape[-1])
    if rows.shape[0] != target.shape[0]:
        raise ValueError(f"Expected input batch_size ({rows.shape[0]}) to match target batch_size "
                         f"({target.shape[0]}).")
    reduction = "sum" if num_items_in_batch is not None else "mean"
    # a column-parallel lm_head's DTensor weight: the op runs its vocabulary-parallel form (no logits)
    op = sys.modules["kernelforge"].fused_linear_cross_entropy  # looked up at call time
    loss = op(rows, weight, target, bias, ignore_index=ignore_index, reduction=reduction, softcap=cap)
    if reduction == "sum":
        if torch.is_tensor(num_items_in_batch):
            num_items_in_batch = num_items_in_batch.to(loss.device)
        loss = loss / num_items_in_batch
    return loss


def _replicated(tp, h):
    """The hidden states as every rank of a column-parallel lm_head sees them before its GEMM: laid out as its
    input style says (e.g. sequence-sharded), gathered, local."""
    from torch.distributed.tensor import DTensor, Replicate  # noqa: PLC0415

    mesh, layouts = tp
    if not isinstance(h, DTensor) and layouts == (Replicate(),):
        return h
    x = h if isinstance(h, DTensor) else DTensor.from_local(h, mesh, layouts, run_check=False)
    return x.redistribute(mesh, [Replicate()]).to_local()


class _Run:
    """One call of the patched forward: the stand-in's lm_head and loss_function, and the output fix-up."""

    def __init__(self, module: nn.Module, loss_function: Callable, logits_with_loss: bool):
        self.module, self.loss_function, self.logits_with_loss = module, loss_function, logits_with_loss
        self.fused = False

    def head(self, hidden):
        head = self.module.lm_head
        why = _head_unsupported(head)
        if why is not None:
            warn_fallback(self.module, why, _FALLBACK_HINT, 4)
            return head(hidden)
        return _Deferred(hidden, head)

    def loss(self, logits, labels, vocab_size, **kwargs):
        current = self.module.loss_function
        if isinstance(logits, _Deferred):
            ok, cap = logits.softcap()
            if current is not self.loss_function:
                why = "a loss_function replaced after patching"
            elif not ok:
                why = f"logits transformed by {logits.ops} before the loss"
            else:
                known = {k: kwargs[k] for k in ("num_items_in_batch", "ignore_index", "shift_labels") if k in kwargs}
                loss = _fused_loss(logits, cap, labels, vocab_size, **known)
                if isinstance(loss, torch.Tensor):
                    self.fused = True
                    return loss
                why = loss
            warn_fallback(self.module, why, _FALLBACK_HINT, 4)
            logits = logits.materialize()
        return current(logits, labels, vocab_size, **kwargs)

    def finish(self, out):
        """The forward's output with the deferred logits replaced: None, or the real logits."""
        def fix(v):
            return (v.materialize() if self.logits_with_loss else None) if isinstance(v, _Deferred) else v

        if isinstance(out, tuple):
            return tuple(v for v in (fix(v) for v in out) if v is not None)
        if hasattr(out, "keys") and any(isinstance(v, _Deferred) for v in out.values()):
            return type(out)(**{k: fix(v) for k, v in out.items()})
        return out


# ---- matching ------------------------------------------------------------------------------------------------


def _for_causal_lm_loss():
    """transformers' ForCausalLMLoss, or None. Never imports transformers when it is not loaded (then no
    model in the process is a transformers model)."""
    if "transformers" not in sys.modules:
        return None
    try:
        from transformers.loss.loss_utils import ForCausalLMLoss
    except Exception:
        return None
    return ForCausalLMLoss


class _StubModel:
    """The probe's ``model``: returns small hidden states whatever it is called with."""

    def __init__(self, hidden: torch.Tensor):
        self.hidden = hidden

    def __call__(self, *args, **kwargs):
        from transformers.modeling_outputs import BaseModelOutputWithPast

        return BaseModelOutputWithPast(last_hidden_state=self.hidden)


def _loss_and_logits(out):
    if isinstance(out, tuple):
        return out[0], (out[1] if len(out) > 1 else None)
    return out.loss, out.logits


def _probe(m: nn.Module, loss_function: Callable) -> "bool | str":
    """Run the class's forward on CPU stand-ins, as it is and with the fused loss: True when both agree."""
    what = "forward differs from lm_head -> loss_function"
    g = probe_generator()
    vocab, hidden_size, tokens = m.lm_head.out_features, 8, 6
    hidden = torch.randn(1, tokens, hidden_size, generator=g)
    head = nn.Linear(hidden_size, vocab, bias=m.lm_head.bias is not None)
    with torch.no_grad():
        head.weight.copy_(torch.randn(head.weight.shape, generator=g) * 0.5)
        if head.bias is not None:
            head.bias.copy_(torch.randn(head.bias.shape, generator=g))
    labels = torch.randint(0, vocab, (1, tokens), generator=g)
    labels[0, 1] = -100
    ids = torch.zeros(1, tokens, dtype=torch.long)
    fwd = type(m).forward
    run = _Run(m, loss_function, logits_with_loss=True)
    kf_head = lambda h: _Deferred(h, head)  # noqa: E731
    try:
        with torch.no_grad():
            want = fwd(StandIn(m, model=_StubModel(hidden), lm_head=head, loss_function=loss_function),
                       input_ids=ids, labels=labels, return_dict=True)
            got = fwd(StandIn(m, model=_StubModel(hidden), lm_head=kf_head, loss_function=_ProbeLoss(run)),
                      input_ids=ids, labels=labels, return_dict=True)
            got = run.finish(got)
    except Exception as e:  # noqa: BLE001  (whatever the forward raises on the probe: not verified)
        return f"{what} (a CPU probe of it raised {type(e).__name__}: {e})"
    (loss0, logits0), (loss1, logits1) = _loss_and_logits(want), _loss_and_logits(got)
    if not run.fused:
        return f"{what}: on a CPU probe the loss is not computed from lm_head's logits by loss_function"
    if not (isinstance(loss0, torch.Tensor) and isinstance(loss1, torch.Tensor) and loss0.shape == loss1.shape
            and torch.allclose(loss0.double(), loss1.double(), rtol=1e-5, atol=1e-6)):
        return f"{what}: on a CPU probe the losses differ ({loss0} vs kernelforge {loss1})"
    if not (isinstance(logits0, torch.Tensor) and isinstance(logits1, torch.Tensor) and torch.equal(logits0, logits1)):
        return f"{what}: on a CPU probe the returned logits differ"
    return True


class _ProbeLoss:
    """The probe's fused loss_function: the run's, with the module's loss_function check skipped (the
    probe's stand-in passes the verified one)."""

    def __init__(self, run: _Run):
        self.run = run

    def __call__(self, logits, labels, vocab_size, **kwargs):
        run = self.run
        if not isinstance(logits, _Deferred):
            return run.loss_function(logits, labels, vocab_size, **kwargs)
        ok, cap = logits.softcap()
        if not ok:
            return run.loss_function(logits.materialize(), labels, vocab_size, **kwargs)
        known = {k: kwargs[k] for k in ("num_items_in_batch", "ignore_index", "shift_labels") if k in kwargs}
        loss = _fused_loss(logits, cap, labels, vocab_size, **known)
        if not isinstance(loss, torch.Tensor):
            return run.loss_function(logits.materialize(), labels, vocab_size, **kwargs)
        run.fused = True
        return loss


def _labels_param(fwd) -> "inspect.Signature | None":
    try:
        sig = inspect.signature(fwd)
    except (TypeError, ValueError):
        return None
    return sig if "labels" in sig.parameters else None


def _match_causal_lm(m: nn.Module):
    cls = type(m)
    looks_like = cls.__name__.endswith("ForCausalLM")
    if not inspect.isfunction(cls.forward) or not (looks_like or isinstance(getattr(m, "lm_head", None), nn.Module)):
        return None
    for_causal_lm_loss = _for_causal_lm_loss()
    if for_causal_lm_loss is None or _labels_param(cls.forward) is None:
        return "forward takes no labels, or transformers' ForCausalLMLoss is not available" if looks_like else None
    if not isinstance(getattr(m, "model", None), nn.Module):
        return "has no `model` submodule"
    why = _head_unsupported(getattr(m, "lm_head", None))
    if why is not None:
        return why
    loss_fn = getattr(m, "loss_function", None)
    if loss_fn is not for_causal_lm_loss:
        return (f"loss_function is {getattr(loss_fn, '__qualname__', type(loss_fn).__name__)} "
                f"(loss_type {getattr(m, 'loss_type', None)!r}), not transformers' ForCausalLMLoss")
    return _probe(m, loss_fn)


@dataclass(frozen=True)
class _LossPlan:
    """What setup verified: the loss function the original calls and the forward's signature (to find labels)."""

    loss_function: Callable
    signature: inspect.Signature

    def __deepcopy__(self, memo):  # shared by copies of a patched model (no per-model state)
        return self


def _causal_lm_setup(m: nn.Module) -> _LossPlan:
    return _LossPlan(m.loss_function, _labels_param(type(m).forward))


def _causal_lm_forward(self, *args, **kwargs):
    """Installed as the model's forward: the original without labels, else the class's forward code on a
    stand-in whose lm_head defers the logits and whose loss_function is the fused loss."""
    state = self.__dict__[STATE_ATTR]
    plan: _LossPlan = state.extra
    try:
        labels = plan.signature.bind(self, *args, **kwargs).arguments.get("labels")
    except TypeError:  # the original raises its own error
        labels = None
    if labels is None:
        return state.original(*args, **kwargs)
    run = _Run(self, plan.loss_function, bool(state.options.get("logits_with_loss")))
    out = type(self).forward(StandIn(self, lm_head=run.head, loss_function=run.loss), *args, **kwargs)
    return run.finish(out)


register_replacement(Replacement("transformers causal-LM loss", _OP, _match_causal_lm, _causal_lm_forward, "loss",
                                 _causal_lm_setup))
