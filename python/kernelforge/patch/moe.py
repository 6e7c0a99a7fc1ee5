"""The mixture-of-experts entries of the patch table (family "moe"): transformers' expert MLPs on
``kernelforge.grouped_mm``; see __init__.py for the machinery.

Patched: transformers (5.x) experts modules, the class of Mixtral, Qwen2-MoE, Qwen3-MoE, DeepSeek-V2/V3,
gpt-oss, OLMoE, ... that holds the stacked expert weights (``gate_up_proj`` [E, 2I, H] or ``up_proj``,
``down_proj``; [E, in, out] when ``is_transposed``) and whose forward is transformers'
``@use_experts_implementation`` dispatch: ``forward(hidden_states [T, H], top_k_index [T, k],
top_k_weights [T, k]) -> [T, H]``, the contract of transformers' ExpertsInterface, whose every
implementation (``eager``, ``grouped_mm``, ``batched_mm``, ...) computes the same thing. The patched
forward computes it as:

- the (token, expert) pairs sorted by expert (a stable sort: ties keep token order), each expert's rows
  gathered; the group ends from ``searchsorted`` on the sorted ids (no histogram, no host
  synchronization: the call is CUDA-graph safe);
- up (gate and up) projection: one ``grouped_mm`` over all experts; the gate through the module's own
  ``_apply_gate`` (its layout: concatenated or interleaved, gpt-oss's clamped GLU), or
  ``kernelforge.silu_and_mul`` when the module uses transformers' default concatenated gate with SiLU;
  down projection: one more ``grouped_mm``;
- biases gathered per row (``has_bias``), the routing weights applied, the rows put back in token
  order and the top-k contributions summed in float32 (as transformers' grouped_mm implementation).

Expert-parallel sentinel ids (>= num_experts) sort past the last group: grouped_mm writes their rows
as 0 (forward and dx), so no masking is needed. Calls the kernels cannot reproduce (an input dtype that
is not the weights', float32 on CUDA) run the module's original forward, announced once
(``KF_STRICT=1``: an error).
"""

from __future__ import annotations

import sys

import torch

from ._match import hooked
from ._registry import Replacement, register_replacement
from ._runtime import original, warn_fallback

_HALF = (torch.bfloat16, torch.float16)


def _default_gate_is_swiglu(module) -> bool:
    """The module gates with transformers' default ``act(gate) * up`` over concatenated halves, act = SiLU."""
    moe, acts = sys.modules.get("transformers.integrations.moe"), sys.modules.get("transformers.activations")
    default_gate = getattr(moe, "_default_apply_gate", None)
    act = type(getattr(module, "act_fn", None))
    silu = act is torch.nn.SiLU or (acts is not None and act is getattr(acts, "SiLUActivation", None))
    return (default_gate is not None and getattr(type(module), "_apply_gate", None) is default_gate and
            getattr(module, "is_concatenated", True) and silu)


def _weights(w: torch.Tensor, transposed: bool) -> torch.Tensor:
    """[E, out, in] for grouped_mm: a transposed ([E, in, out]) stack as its transposed view (no copy)."""
    return w.transpose(1, 2) if transposed else w


def experts_forward(self, hidden_states: torch.Tensor, top_k_index: torch.Tensor,
                    top_k_weights: torch.Tensor) -> torch.Tensor:
    """transformers' ExpertsInterface contract on kernelforge.grouped_mm (the module docstring), for inputs
    the kernels take."""
    import kernelforge as kf  # noqa: PLC0415

    up_w = self.gate_up_proj if self.has_gate else self.up_proj
    num_experts, k = up_w.shape[0], top_k_index.size(-1)
    tokens, hidden = hidden_states.shape
    expert_ids = top_k_index.reshape(-1)
    ids_sorted, perm = torch.sort(expert_ids, stable=True)
    bounds = torch.arange(1, num_experts + 1, device=ids_sorted.device, dtype=ids_sorted.dtype)
    offsets = torch.searchsorted(ids_sorted, bounds).to(torch.int32)  # group ends, sentinels past the last
    x = hidden_states[perm // k]
    row_expert = ids_sorted.clamp(max=num_experts - 1) if self.has_bias else None

    h = kf.grouped_mm(x, _weights(up_w, self.is_transposed), offsets)
    if self.has_bias:
        h = h + (self.gate_up_proj_bias if self.has_gate else self.up_proj_bias)[row_expert]
    if not self.has_gate:
        h = self.act_fn(h)
    elif _default_gate_is_swiglu(self):
        h = kf.silu_and_mul(h)
    else:
        h = self._apply_gate(h)
    y = kf.grouped_mm(h, _weights(self.down_proj, self.is_transposed), offsets)
    if self.has_bias:
        y = y + self.down_proj_bias[row_expert]
    y = y * top_k_weights.reshape(-1)[perm].unsqueeze(-1).to(y.dtype)
    back = torch.empty_like(y)
    back[perm] = y  # token order again (perm is a permutation: each row written once)
    return back.view(tokens, k, hidden).sum(dim=1, dtype=torch.float32).to(hidden_states.dtype)


def _match_experts(m: torch.nn.Module) -> "bool | str | None":
    """transformers experts modules (the module docstring); None for anything else."""
    fwd = getattr(type(m), "forward", None)
    if fwd is None or not hasattr(fwd, "__wrapped__") or not all(
            hasattr(m, a) for a in ("has_gate", "has_bias", "is_transposed", "down_proj")):
        return None
    up = getattr(m, "gate_up_proj" if m.has_gate else "up_proj", None)
    if not isinstance(up, torch.Tensor) or up.dim() != 3 or m.down_proj.dim() != 3:
        return "expert weights that are not [E, out, in] stacks (quantized or sharded experts)"
    if hooked(m):
        return "forward hooks on the experts module"
    if not m.has_gate and not hasattr(m, "act_fn"):
        return "an ungated experts module without act_fn"
    return True


def _experts_forward(self, hidden_states, top_k_index, top_k_weights):
    up_w = self.gate_up_proj if self.has_gate else self.up_proj
    why = None
    if hidden_states.dtype != up_w.dtype:
        why = f"input dtype {hidden_states.dtype} and expert weight dtype {up_w.dtype}"
    elif hidden_states.is_cuda and hidden_states.dtype not in _HALF:
        why = f"{hidden_states.dtype} on CUDA (the grouped GEMM takes bfloat16 and float16)"
    if why is not None:
        warn_fallback(self, why)
        return original(self)(hidden_states, top_k_index, top_k_weights)
    return experts_forward(self, hidden_states, top_k_index, top_k_weights)


register_replacement(Replacement("hf_experts", "kernelforge.grouped_mm", _match_experts, _experts_forward, "moe"))
