"""The loss entries of the patch table (family "loss"); see __init__.py for the machinery.

Patched: transformers causal LMs whose forward is, up to names and docstring, one of the two forwards
kernelforge verified (transformers 5.17):

- Llama-style (LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM and ~45 other
  classes written the same way)::

      outputs = self.model(input_ids=..., ..., **kwargs)
      logits = self.lm_head(outputs.last_hidden_state[:, slice_indices, :])
      loss = self.loss_function(logits=logits, labels=labels, vocab_size=self.config.vocab_size, **kwargs)

- Gemma-2-style (Gemma2, Gemma3, Gemma3n, VaultGemma, NanoChat ForCausalLM): the same, with
  ``logits = tanh(logits / c) * c`` for ``c = config.final_logit_softcapping`` when it is not None, and
  ``self.loss_function(logits, labels, self.vocab_size, **kwargs)``.

Each only when ``loss_function`` is transformers' ``ForCausalLMLoss``, ``lm_head`` a plain
``torch.nn.Linear`` (bias allowed; its weight may be tied to the input embedding) without hooks, its
``out_features`` the vocab size the loss is told, and the forward wrapped by transformers'
``can_return_tuple`` (so ``return_dict=False`` still gives a tuple).

When the forward is called with ``labels``, the patched one runs ``self.model`` exactly as the original
and computes the loss as ``kernelforge.fused_linear_cross_entropy(hidden, lm_head.weight, shift_labels,
lm_head.bias, ignore_index=..., reduction=..., softcap=c)``, without ever materializing the
``[tokens, vocab]`` logits. Semantics are those of ``ForCausalLMLoss`` / ``fixed_cross_entropy``:

- ``labels`` are padded on the right with ``ignore_index`` and shifted by one
  (``pad(labels, (0, 1), value=ignore_index)[..., 1:]``), unless ``shift_labels`` is passed, which is
  used as it is; ``ignore_index`` (default -100) may be passed as a keyword;
- reduction "mean" over the non-ignored tokens (NaN when every label is ignored, as F.cross_entropy),
  or, when ``num_items_in_batch`` is passed, "sum" divided by ``num_items_in_batch`` (a tensor is moved
  to the loss's device first);
- the loss is float32 (the original upcasts the logits to float32 before the cross-entropy);
- ``logits_to_keep`` slices the hidden states as the original slices them before ``lm_head``: with the
  default 0 every position is used; any other value computes the loss on the kept positions only,
  which, as in the original, needs labels (or shift_labels) of that many positions (otherwise the same
  "Expected input batch_size (N) to match target batch_size (M)" ValueError F.cross_entropy raises);
- under ``torch.autocast`` the hidden states, weight and bias are cast to the autocast dtype first, as
  autocast does for the original ``lm_head``.

The output is the original's ``CausalLMOutputWithPast`` with ``loss``, ``past_key_values``,
``hidden_states`` and ``attentions`` from the inner model and ``logits=None``; with
``patch(model, logits_with_loss=True)`` the logits are also computed (``lm_head``, softcapped as the
original) and returned, next to the fused loss. Calls without labels run the original forward
unchanged (logits as before).

At run time, when the fused op cannot give the original's result (a dtype or device the op does not
take, ``lm_head`` or ``loss_function`` replaced or hooked after patching, integer labels that are not
int64, ...), the patched forward computes the original ``lm_head`` + ``loss_function`` tail on the
hidden states it already has, with the one-time warning (KF_STRICT=1: an error). The op is looked up
as ``kernelforge.fused_linear_cross_entropy`` at call time.

Numerics: the original rounds the logits to the model dtype (bf16: ~3 significant digits) and, with
softcapping, rounds three more times before upcasting; the fused op accumulates the logits in float32
and applies the softcap in float32. In float32 both agree to rounding.
"""

from __future__ import annotations

import inspect
import sys
from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn

from ._match import hooked, same_as
from ._registry import STATE_ATTR, Replacement, register_replacement
from ._runtime import warn_fallback

_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
_DEVICES = ("cpu", "cuda")
_OP = "kernelforge.fused_linear_cross_entropy"
_FALLBACK_HINT = ("Keep lm_head a plain torch.nn.Linear of the hidden states' dtype and device, the model's "
                  "loss_function transformers' ForCausalLMLoss, and pass int64 labels.")

# The parameters of both verified forwards, in order (the syntax-tree key ignores names; the patched
# forward takes these names, so they are checked too).
_PARAMS = ("self", "input_ids", "attention_mask", "position_ids", "past_key_values", "inputs_embeds", "labels",
           "use_cache", "logits_to_keep", "kwargs")
_LABELS_POS = _PARAMS.index("labels") - 1  # position of labels in *args (after self)


# ---- what the forward computes: transformers 5.17 --------------------------------------------------------


_REF_LLAMA_FORWARD = r'''
def forward(
    self,
    input_ids: torch.LongTensor | None = None,
    attention_mask: torch.Tensor | None = None,
    position_ids: torch.LongTensor | None = None,
    past_key_values: Cache | None = None,
    inputs_embeds: torch.FloatTensor | None = None,
    labels: torch.LongTensor | None = None,
    use_cache: bool | None = None,
    logits_to_keep: int | torch.Tensor = 0,
    **kwargs: Unpack[TransformersKwargs],
) -> CausalLMOutputWithPast:
    outputs: BaseModelOutputWithPast = self.model(
        input_ids=input_ids,
        attention_mask=attention_mask,
        position_ids=position_ids,
        past_key_values=past_key_values,
        inputs_embeds=inputs_embeds,
        use_cache=use_cache,
        **kwargs,
    )

    hidden_states = outputs.last_hidden_state
    slice_indices = slice(-logits_to_keep, None) if isinstance(logits_to_keep, int) else logits_to_keep
    logits = self.lm_head(hidden_states[:, slice_indices, :])

    loss = None
    if labels is not None:
        loss = self.loss_function(logits=logits, labels=labels, vocab_size=self.config.vocab_size, **kwargs)

    return CausalLMOutputWithPast(
        loss=loss,
        logits=logits,
        past_key_values=outputs.past_key_values,
        hidden_states=outputs.hidden_states,
        attentions=outputs.attentions,
    )
'''


_REF_GEMMA2_FORWARD = r'''
def forward(
    self,
    input_ids: torch.LongTensor | None = None,
    attention_mask: torch.Tensor | None = None,
    position_ids: torch.LongTensor | None = None,
    past_key_values: Cache | None = None,
    inputs_embeds: torch.FloatTensor | None = None,
    labels: torch.LongTensor | None = None,
    use_cache: bool | None = None,
    logits_to_keep: int | torch.Tensor = 0,
    **kwargs: Unpack[TransformersKwargs],
) -> CausalLMOutputWithPast:
    outputs: BaseModelOutputWithPast = self.model(
        input_ids=input_ids,
        attention_mask=attention_mask,
        position_ids=position_ids,
        past_key_values=past_key_values,
        inputs_embeds=inputs_embeds,
        use_cache=use_cache,
        **kwargs,
    )

    hidden_states = outputs.last_hidden_state
    slice_indices = slice(-logits_to_keep, None) if isinstance(logits_to_keep, int) else logits_to_keep
    logits = self.lm_head(hidden_states[:, slice_indices, :])
    if self.config.final_logit_softcapping is not None:
        logits = logits / self.config.final_logit_softcapping
        logits = torch.tanh(logits)
        logits = logits * self.config.final_logit_softcapping

    loss = None
    if labels is not None:
        loss = self.loss_function(logits, labels, self.vocab_size, **kwargs)

    return CausalLMOutputWithPast(
        loss=loss,
        logits=logits,
        past_key_values=outputs.past_key_values,
        hidden_states=outputs.hidden_states,
        attentions=outputs.attentions,
    )
'''


@dataclass(frozen=True)
class _LossPlan:
    """What setup verified for one patched model: the forward's style ("llama" or "softcap"), the loss
    function the original calls, the output class it returns, and the fused forward (ours, wrapped by
    transformers' can_return_tuple as the original is)."""

    style: str
    loss_function: Callable
    output_cls: type
    forward: Callable

    def __deepcopy__(self, memo):  # shared by copies of a patched model (no per-model state)
        return self


def _transformers_parts():
    """(ForCausalLMLoss, can_return_tuple) of the loaded transformers, or None. Never imports transformers
    when it is not loaded (then no model in the process is a transformers model)."""
    if "transformers" not in sys.modules:
        return None
    try:
        from transformers.loss.loss_utils import ForCausalLMLoss
        from transformers.utils.generic import can_return_tuple
    except Exception:
        return None
    return ForCausalLMLoss, can_return_tuple


def _style(raw) -> str | None:
    if same_as(raw, _REF_LLAMA_FORWARD):
        return "llama"
    if same_as(raw, _REF_GEMMA2_FORWARD):
        return "softcap"
    return None


def _vocab_size(m: nn.Module, style: str):
    """The vocab size the original passes to the loss function."""
    return m.config.vocab_size if style == "llama" else getattr(m, "vocab_size", None)


def _lm_head_unsupported(head) -> str | None:
    if not isinstance(head, nn.Linear) or type(head).forward is not nn.Linear.forward:
        return f"lm_head is {type(head).__name__}, not a plain torch.nn.Linear"
    if hooked(head):
        return "lm_head has hooks (the fused loss does not call lm_head)"
    if "forward" in head.__dict__:
        return "lm_head's forward is overridden on the instance (e.g. by an accelerate hook)"
    return None


def _match_causal_lm(m: nn.Module):
    cls = type(m)
    fwd = cls.forward
    raw = inspect.unwrap(fwd) if inspect.isfunction(fwd) else None
    looks_like = cls.__name__.endswith("ForCausalLM")
    if raw is None or not (looks_like or isinstance(getattr(m, "lm_head", None), nn.Module)):
        return None
    parts = _transformers_parts()
    style = _style(raw) if parts is not None else None
    if style is None:
        if looks_like:
            return ("forward differs from the Llama-style self.model -> self.lm_head -> self.loss_function "
                    "(or Gemma-2 softcapped) forward of transformers 5.17 kernelforge verified")
        return None
    ForCausalLMLoss, can_return_tuple = parts
    if raw.__code__.co_varnames[: len(_PARAMS)] != _PARAMS:
        return f"forward names its parameters {raw.__code__.co_varnames[:len(_PARAMS)]}, not {_PARAMS}"
    if fwd is raw or getattr(fwd, "__wrapped__", None) is not raw \
            or fwd.__code__ is not can_return_tuple(raw).__code__:
        return "forward is not wrapped exactly once by transformers' can_return_tuple"
    if not isinstance(getattr(m, "model", None), nn.Module):
        return "has no `model` submodule"
    why = _lm_head_unsupported(getattr(m, "lm_head", None))
    if why is not None:
        return why
    loss_fn = m.loss_function
    if loss_fn is not ForCausalLMLoss:
        return (f"loss_function is {getattr(loss_fn, '__qualname__', type(loss_fn).__name__)} "
                f"(loss_type {getattr(m, 'loss_type', None)!r}), not transformers' ForCausalLMLoss")
    vocab = _vocab_size(m, style)
    if vocab != m.lm_head.out_features:
        return f"lm_head has {m.lm_head.out_features} outputs but the loss is told vocab_size {vocab}"
    if "CausalLMOutputWithPast" not in raw.__globals__:
        return f"{raw.__module__} has no CausalLMOutputWithPast"
    return True


def _causal_lm_setup(m: nn.Module) -> _LossPlan:
    raw = inspect.unwrap(type(m).forward)
    ForCausalLMLoss, can_return_tuple = _transformers_parts()
    return _LossPlan(_style(raw), ForCausalLMLoss, raw.__globals__["CausalLMOutputWithPast"],
                     can_return_tuple(_fused_forward))


# ---- the patched forward ---------------------------------------------------------------------------------


def _causal_lm_forward(self, *args, **kwargs):
    """Installed as the model's forward: the original when no labels are given, else the fused loss."""
    state = self.__dict__[STATE_ATTR]
    labels = args[_LABELS_POS] if len(args) > _LABELS_POS else kwargs.get("labels")
    if labels is None:
        return state.original(*args, **kwargs)
    return state.extra.forward(self, *args, **kwargs)


def _softcap(self, plan: _LossPlan):
    return self.config.final_logit_softcapping if plan.style == "softcap" else None


def _logits(self, plan: _LossPlan, hidden: torch.Tensor) -> torch.Tensor:
    """The original's logits: lm_head, then (Gemma-2 style) the softcap in the logits' dtype."""
    logits = self.lm_head(hidden)
    cap = _softcap(self, plan)
    if cap is not None:
        logits = logits / cap
        logits = torch.tanh(logits)
        logits = logits * cap
    return logits


def _original_loss(self, plan: _LossPlan, logits: torch.Tensor, labels, kwargs):
    if plan.style == "llama":
        return self.loss_function(logits=logits, labels=labels, vocab_size=self.config.vocab_size, **kwargs)
    return self.loss_function(logits, labels, self.vocab_size, **kwargs)


def _shift_labels(labels, ignore_index=-100, shift_labels=None, **_ignored) -> torch.Tensor:
    """ForCausalLMLoss's targets: labels padded with ignore_index and shifted left by one, or shift_labels."""
    if shift_labels is None:
        labels = F.pad(labels, (0, 1), value=ignore_index)
        shift_labels = labels[..., 1:].contiguous()
    return shift_labels


def _fused_unsupported(self, plan: _LossPlan, hidden, weight, bias, target, cap) -> str | None:
    """Why the fused op cannot compute what the original tail would, or None."""
    if not callable(getattr(sys.modules["kernelforge"], "fused_linear_cross_entropy", None)):
        return "a kernelforge build without fused_linear_cross_entropy"
    if self.loss_function is not plan.loss_function:
        return "a loss_function replaced after patching"
    why = _lm_head_unsupported(self.lm_head)
    if why is not None:
        return f"{why} (changed after patching)"
    if torch.nn.modules.module._global_forward_hooks or torch.nn.modules.module._global_forward_pre_hooks:
        return "global module forward hooks (the fused loss does not call lm_head)"
    if _vocab_size(self, plan.style) != weight.shape[0]:
        return f"lm_head with {weight.shape[0]} outputs and vocab_size {_vocab_size(self, plan.style)}"
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
        return f"final_logit_softcapping={cap!r} (the op takes a positive number)"
    return None


def _fused_forward(self, input_ids=None, attention_mask=None, position_ids=None, past_key_values=None,
                   inputs_embeds=None, labels=None, use_cache=None, logits_to_keep=0, **kwargs):
    """The verified forward with the lm_head + loss_function tail replaced by the fused loss (labels given).
    Wrapped by can_return_tuple in setup, as the original."""
    state = self.__dict__[STATE_ATTR]
    plan: _LossPlan = state.extra
    outputs = self.model(
        input_ids=input_ids,
        attention_mask=attention_mask,
        position_ids=position_ids,
        past_key_values=past_key_values,
        inputs_embeds=inputs_embeds,
        use_cache=use_cache,
        **kwargs,
    )
    hidden_states = outputs.last_hidden_state
    slice_indices = slice(-logits_to_keep, None) if isinstance(logits_to_keep, int) else logits_to_keep
    kept = hidden_states[:, slice_indices, :]

    # ForCausalLMLoss(logits, labels, vocab_size, num_items_in_batch=None, ignore_index=-100,
    # shift_labels=None, **kwargs) -> fixed_cross_entropy
    num_items_in_batch = kwargs.get("num_items_in_batch")
    ignore_index = kwargs.get("ignore_index", -100)
    target = _shift_labels(labels, **kwargs)
    head = self.lm_head
    weight, bias = head.weight, head.bias
    h = kept
    dev = kept.device.type
    if torch.is_autocast_enabled(dev):  # autocast would run lm_head in its dtype
        dt = torch.get_autocast_dtype(dev)
        h, weight = h.to(dt), weight.to(dt)
        bias = bias.to(dt) if bias is not None else None
    cap = _softcap(self, plan)
    why = _fused_unsupported(self, plan, h, weight, bias, target, cap)
    if why is not None:
        warn_fallback(self, why, _FALLBACK_HINT, 3)
        logits = _logits(self, plan, kept)
        loss = _original_loss(self, plan, logits, labels, kwargs)
    else:
        target = target.view(-1).to(kept.device)
        rows = h.reshape(-1, h.shape[-1])
        if rows.shape[0] != target.shape[0]:
            raise ValueError(f"Expected input batch_size ({rows.shape[0]}) to match target batch_size "
                             f"({target.shape[0]}).")
        reduction = "sum" if num_items_in_batch is not None else "mean"
        op = sys.modules["kernelforge"].fused_linear_cross_entropy  # looked up at call time
        loss = op(rows, weight, target, bias, ignore_index=ignore_index, reduction=reduction, softcap=cap)
        if reduction == "sum":
            if torch.is_tensor(num_items_in_batch):
                num_items_in_batch = num_items_in_batch.to(loss.device)
            loss = loss / num_items_in_batch
        logits = _logits(self, plan, kept) if state.options.get("logits_with_loss") else None

    return plan.output_cls(
        loss=loss,
        logits=logits,
        past_key_values=outputs.past_key_values,
        hidden_states=outputs.hidden_states,
        attentions=outputs.attentions,
    )


register_replacement(Replacement("transformers causal-LM loss", _OP, _match_causal_lm, _causal_lm_forward, "loss",
                                 _causal_lm_setup))
