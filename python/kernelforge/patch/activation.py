"""The activation entries of the patch table (family "activation"); see __init__.py for the machinery.

Patched, each only when its computation is exactly the module's (activation, order of the halves,
approximate mode), which the matchers verify on the class's code (its normalized syntax tree, see _match.py), not on
its name:

- transformers gated MLPs (LlamaMLP, MistralMLP, Qwen2MLP, Qwen3MLP, GemmaMLP and the ~120
  classes written the same way): ``down_proj(act_fn(gate_proj(x)) * up_proj(x))``
  * act_fn SiLU (``hidden_act`` "silu" / "swish"): ``down_proj(swiglu(gate_proj(x), up_proj(x)))``
  * act_fn F.gelu-based GELU ("gelu", "gelu_pytorch_tanh"):
    ``down_proj(geglu(up_proj(x), gate_proj(x), approximate))`` (geglu(hidden, gate) is
    ``hidden * gelu(gate)``, so up is the first argument)
- transformers fc1 / act / fc2 MLPs (ViTMLP, Dinov2MLP, CLIPMLP, SiglipMLP and the ~75 classes written
  the same way, the activation ``activation_fn`` or ``activation``) with a GELU activation:
  ``fc2(gelu(fc1(x), approximate))``
- diffusers ``GELU``: ``gelu(proj(x), approximate)``; with approximate="tanh" and a plain ``nn.Linear`` proj,
  one GEMM with the bias and the GELU in its epilogue (kernelforge.linear(..., activation="gelu_tanh"))
- diffusers ``GEGLU``: ``hidden, gate = proj(x).chunk(2, -1); hidden * gelu(gate)`` (exact GELU)
  -> ``gelu_and_mul(proj(x), "none", gate_first=False)``
- diffusers ``SwiGLU``: ``hidden, gate = proj(x).chunk(2, -1); hidden * silu(gate)``
  -> ``swiglu(gate, hidden)``
- diffusers ``LinearActivation`` with an ``nn.GELU``: ``gelu(proj(x), approximate)``

The submodules (projections) are still called, in the original order, so their hooks, quantized
linears and LoRA wrappers keep working; only the activation module (``act_fn`` / ``activation``) is
no longer called: one with hooks is not patched, and one replaced or hooked after patching makes the
forward compute the original way, with a warning (an error with KF_STRICT=1).

Numerics: the kernels round once where eager code rounds act(gate) before the multiply; results
differ by at most that rounding (see notes/activation.md).
"""

from __future__ import annotations

import functools
import sys

import torch
import torch.nn.functional as F
from torch import nn

from .. import activation as _act
from ..gemm import linear_act as _linear_act
from ._match import diffusers_class, hooked, qualname, same_as
from ._registry import STATE_ATTR, Replacement, register_replacement, register_unsupported
from ._runtime import original, warn_fallback

_DTYPES = (torch.float32, torch.bfloat16, torch.float16, torch.float64)
_DEVICES = ("cpu", "cuda")
_REPLACED_HINT = "Call kernelforge.unpatch(model) and patch again after changing the activation."


def _kernel_unsupported(*ts: torch.Tensor) -> str | None:
    """Why the op cannot take these tensors (which the original computation accepts), or None."""
    t0 = ts[0]
    for t in ts:
        if t.dtype not in _DTYPES:
            return f"dtype {t.dtype}"
        if t.device.type not in _DEVICES:
            return f"a tensor on {t.device}"
        if t.dtype != t0.dtype:
            return f"gate/up dtypes {t0.dtype} and {t.dtype}"
        if t.shape != t0.shape:
            return f"gate/up shapes {list(t0.shape)} and {list(t.shape)}"
    return None


# ---- activation modules: what exactly they compute -----------------------------------------------


_REF_HF_SILU = r'''
def forward(self, input):
    return nn.functional.silu(input)
'''


_REF_HF_ACT = r'''
def forward(self, input):
    return self.act(input)
'''


def _act_kind(act) -> "tuple[str, str] | str":
    """("silu", "") or ("gelu", approximate) when ``act`` computes exactly that (F.silu / F.gelu),
    otherwise the reason it is not patched."""
    if not isinstance(act, nn.Module):
        return f"activation is {type(act).__name__}, not a module kernelforge knows"
    cls = type(act)
    if hooked(act):
        return "the activation module has hooks (a fused kernel would bypass them)"
    if "forward" in act.__dict__:
        return "the activation module's forward is overridden on the instance"
    if isinstance(act, nn.SiLU) and cls.forward is nn.SiLU.forward:
        return ("silu", "")
    if isinstance(act, nn.GELU) and cls.forward is nn.GELU.forward and act.approximate in ("none", "tanh"):
        return ("gelu", act.approximate)
    hf = sys.modules.get("transformers.activations")  # loaded whenever a transformers model exists
    if hf is not None:
        if isinstance(act, hf.SiLUActivation) and same_as(cls.forward, _REF_HF_SILU):
            return ("silu", "")
        fn = act.__dict__.get("act")
        if isinstance(act, hf.GELUActivation) and same_as(cls.forward, _REF_HF_ACT) and fn is F.gelu:
            return ("gelu", "none")
        if (isinstance(act, hf.GELUTanh) and same_as(cls.forward, _REF_HF_ACT) and isinstance(fn, functools.partial)
                and fn.func is F.gelu and not fn.args and fn.keywords == {"approximate": "tanh"}):
            return ("gelu", "tanh")
    return f"activation {qualname(cls)}: no kernelforge kernel computes exactly it"


def _act_setup(attr: str):
    """setup: keep the verified activation module and its approximate mode for the runtime check."""

    def setup(m: nn.Module):
        act = getattr(m, attr)
        return act, _act_kind(act)[1]

    return setup


def _act_changed(self, act) -> str | None:
    """Runtime: why the activation submodule is no longer the one verified at patch time, or None."""
    verified, approximate = self.__dict__[STATE_ATTR].extra
    if act is not verified:
        return f"an activation module replaced after patching ({type(act).__name__})"
    if hooked(act) or "forward" in act.__dict__:
        return "an activation module hooked or given an instance forward after patching"
    if getattr(act, "approximate", approximate) != approximate:
        return f"approximate changed after patching ({act.approximate!r})"
    return None


# ---- transformers gated MLPs ---------------------------------------------------------------------


_REF_HF_MLP_A = r'''
def forward(self, x):
    down_proj = self.down_proj(self.act_fn(self.gate_proj(x)) * self.up_proj(x))
    return down_proj
'''


_REF_HF_MLP_B = r'''
def forward(self, x):
    return self.down_proj(self.act_fn(self.gate_proj(x)) * self.up_proj(x))
'''


def _hf_mlp_verdict(m: nn.Module) -> "tuple[str, str] | str | None":
    """None: not a gate/up/down MLP; a string: the reason it is skipped; else the activation kind."""
    if not all(isinstance(getattr(m, a, None), nn.Module) for a in ("gate_proj", "up_proj", "down_proj")):
        return None
    if not same_as(type(m).forward, _REF_HF_MLP_A, _REF_HF_MLP_B):
        return "forward differs from LlamaMLP's down_proj(act_fn(gate_proj(x)) * up_proj(x))"
    return _act_kind(getattr(m, "act_fn", None))


def _match_hf_mlp(kind: str):
    def match(m: nn.Module):
        v = _hf_mlp_verdict(m)
        if v is None or isinstance(v, str):
            return v if kind == "silu" else None  # the first entry reports the skip
        return True if v[0] == kind else None

    return match


def _one_input(self, args, kwargs):
    """The single input of a one-argument forward, positional or by its name; None if the call
    does not have that form (then the original forward runs and raises its own error)."""
    if len(args) == 1 and not kwargs:
        return args[0]
    code = type(self).forward.__code__
    if not args and len(kwargs) == 1 and code.co_argcount >= 2 and code.co_varnames[1] in kwargs:
        return kwargs[code.co_varnames[1]]
    return None


def _hf_mlp_forward(kind: str):
    def forward(self, *args, **kwargs):
        x = _one_input(self, args, kwargs)
        if x is None:
            return original(self)(*args, **kwargs)
        changed = _act_changed(self, self.act_fn)
        if changed is not None:
            warn_fallback(self, changed, _REPLACED_HINT, 3)
            return original(self)(x)
        gate = self.gate_proj(x)
        up = self.up_proj(x)
        why = _kernel_unsupported(gate, up)
        if why is not None:
            warn_fallback(self, why, stacklevel=3)
            return self.down_proj(self.act_fn(gate) * up)
        if kind == "silu":
            return self.down_proj(_act.swiglu(gate, up))
        approximate = self.__dict__[STATE_ATTR].extra[1]
        return self.down_proj(_act.geglu(up, gate, approximate))  # act_fn(gate) * up = up * gelu(gate)

    return forward


# ---- transformers fc1 / act / fc2 MLPs (vision transformers, CLIP-style encoders) ------------------


_REF_HF_FC_MLP_A = r'''
def forward(self, hidden_states):
    hidden_states = self.fc1(hidden_states)
    hidden_states = self.activation_fn(hidden_states)
    hidden_states = self.fc2(hidden_states)
    return hidden_states
'''

_REF_HF_FC_MLP_B = r'''
def forward(self, hidden_state):
    hidden_state = self.fc1(hidden_state)
    hidden_state = self.activation(hidden_state)
    hidden_state = self.fc2(hidden_state)
    return hidden_state
'''


def _fc_mlp_act_attr(m: nn.Module) -> str | None:
    """The attribute that holds the activation of an fc1 / act / fc2 MLP, by its forward's code."""
    if not all(isinstance(getattr(m, a, None), nn.Module) for a in ("fc1", "fc2")):
        return None
    if same_as(type(m).forward, _REF_HF_FC_MLP_A):
        return "activation_fn"
    if same_as(type(m).forward, _REF_HF_FC_MLP_B):
        return "activation"
    return None


def _match_hf_fc_mlp(m: nn.Module):
    if type(m).__module__.split(".")[0] != "transformers":
        return None
    attr = _fc_mlp_act_attr(m)
    if attr is None:
        return None
    act = _act_kind(getattr(m, attr, None))
    if isinstance(act, str):
        return act
    if act[0] != "gelu":
        return f"activation is {type(getattr(m, attr)).__name__}: kernelforge has no ungated {act[0]} op"
    return True


_FC_MLP_ACT: dict[type, str] = {}  # class -> the attribute holding its activation


def _fc_mlp_setup(m: nn.Module):
    attr = _fc_mlp_act_attr(m)
    _FC_MLP_ACT[type(m)] = attr
    return _act_setup(attr)(m)


def _hf_fc_mlp_forward(self, *args, **kwargs):
    x = _one_input(self, args, kwargs)
    if x is None:
        return original(self)(*args, **kwargs)
    act = getattr(self, _FC_MLP_ACT[type(self)])
    changed = _act_changed(self, act)
    if changed is not None:
        warn_fallback(self, changed, _REPLACED_HINT, 3)
        return original(self)(x)
    h = self.fc1(x)
    why = _kernel_unsupported(h)
    if why is not None:
        warn_fallback(self, why, stacklevel=3)
        return self.fc2(act(h))
    return self.fc2(_act.gelu(h, self.__dict__[STATE_ATTR].extra[1]))


# ---- diffusers (diffusers.models.activations, 0.42) ----------------------------------------------
# Reference copies (source text) of the diffusers 0.42.1 methods, compared by syntax tree: a class
# whose code differs (another diffusers version, a subclass) is not patched.


_REF_DIFF_GELU_GELU = r'''
def gelu(self, gate: torch.Tensor) -> torch.Tensor:
    if gate.device.type == "mps" and is_torch_version("<", "2.0.0"):
        # fp16 gelu not supported on mps before torch 2.0
        return F.gelu(gate.to(dtype=torch.float32), approximate=self.approximate).to(dtype=gate.dtype)
    return F.gelu(gate, approximate=self.approximate)
'''


_REF_DIFF_GELU_FORWARD = r'''
def forward(self, hidden_states) -> torch.Tensor:
    hidden_states = self.proj(hidden_states)
    hidden_states = self.gelu(hidden_states)
    return hidden_states
'''


_REF_DIFF_GEGLU_GELU = r'''
def gelu(self, gate: torch.Tensor) -> torch.Tensor:
    if gate.device.type == "mps" and is_torch_version("<", "2.0.0"):
        # fp16 gelu not supported on mps before torch 2.0
        return F.gelu(gate.to(dtype=torch.float32)).to(dtype=gate.dtype)
    return F.gelu(gate)
'''


_SCALE_DEPRECATION = (
    "The `scale` argument is deprecated and will be ignored. Please remove it, as passing it will raise an error "
    "in the future. `scale` should directly be passed while calling the underlying pipeline component i.e., via "
    "`cross_attention_kwargs`."
)


_REF_DIFF_GEGLU_FORWARD = r'''
def forward(self, hidden_states, *args, **kwargs) -> torch.Tensor:
    if len(args) > 0 or kwargs.get("scale", None) is not None:
        deprecation_message = "The `scale` argument is deprecated and will be ignored. Please remove it, as passing it will raise an error in the future. `scale` should directly be passed while calling the underlying pipeline component i.e., via `cross_attention_kwargs`."
        deprecate("scale", "1.0.0", deprecation_message)
    hidden_states = self.proj(hidden_states)
    if is_torch_npu_available():
        return torch_npu.npu_geglu(hidden_states, dim=-1, approximate=1)[0]
    else:
        hidden_states, gate = hidden_states.chunk(2, dim=-1)
        return hidden_states * self.gelu(gate)
'''


_REF_DIFF_SWIGLU_FORWARD = r'''
def forward(self, hidden_states) -> torch.Tensor:
    hidden_states = self.proj(hidden_states)
    hidden_states, gate = hidden_states.chunk(2, dim=-1)
    return hidden_states * self.activation(gate)
'''


_REF_DIFF_LINEAR_ACT_FORWARD = r'''
def forward(self, hidden_states) -> torch.Tensor:
    hidden_states = self.proj(hidden_states)
    return self.activation(hidden_states)
'''


_ACTS = "diffusers.models.activations"


def _same_code(cls: type, **methods) -> str | None:
    """None when every named method of cls has the reference's code, else the first that differs."""
    for name, ref in methods.items():
        if not same_as(getattr(cls, name, None), ref):
            return f"{name} differs from the diffusers 0.42 code kernelforge verified (subclass or other version)"
    return None


def _match_diffusers_gelu(m: nn.Module):
    cls = diffusers_class(_ACTS, "GELU")
    if cls is None or not isinstance(m, cls):
        return None
    why = _same_code(type(m), forward=_REF_DIFF_GELU_FORWARD, gelu=_REF_DIFF_GELU_GELU)
    if why is not None:
        return why
    if m.approximate not in ("none", "tanh"):
        return f"approximate={m.approximate!r}"
    return True


def _fusable_linear(proj: nn.Module, x: torch.Tensor) -> bool:
    """Whether ``proj(x)`` is exactly F.linear(x, proj.weight, proj.bias) in a dtype and on a device the GEMM
    family takes: a plain nn.Linear (no subclass, hook or instance forward: LoRA, quantized and hooked
    projections keep being called), its parameters in x's dtype and on x's device."""
    if type(proj) is not nn.Linear or hooked(proj) or "forward" in proj.__dict__:
        return False
    ok_dtypes = (torch.float16, torch.bfloat16) if x.is_cuda else (torch.float16, torch.bfloat16, torch.float32,
                                                                    torch.float64)
    if x.dtype not in ok_dtypes or x.dim() < 1:
        return False
    return all(p is None or (p.dtype == x.dtype and p.device == x.device) for p in (proj.weight, proj.bias))


def _diffusers_gelu_forward(self, hidden_states):
    if self.approximate == "tanh" and _fusable_linear(self.proj, hidden_states):
        # the projection and its tanh-GELU as one GEMM: bias and GELU in cuBLASLt's epilogue (gemm.py)
        return _linear_act(hidden_states, self.proj.weight, self.proj.bias, "gelu_tanh")
    h = self.proj(hidden_states)
    why = _kernel_unsupported(h)
    if why is not None:
        warn_fallback(self, why, stacklevel=3)
        return self.gelu(h)
    return _act.gelu(h, self.approximate)


def _match_diffusers_geglu(m: nn.Module):
    cls = diffusers_class(_ACTS, "GEGLU")
    if cls is None or not isinstance(m, cls):
        return None
    why = _same_code(type(m), forward=_REF_DIFF_GEGLU_FORWARD, gelu=_REF_DIFF_GEGLU_GELU)
    if why is not None:
        return why
    npu = getattr(sys.modules[_ACTS], "is_torch_npu_available", None)
    if npu is None or npu():
        return "torch_npu is available: GEGLU then calls npu_geglu (tanh approximation)"
    return True


def _diffusers_geglu_forward(self, hidden_states, *args, **kwargs):
    if len(args) > 0 or kwargs.get("scale", None) is not None:
        sys.modules[_ACTS].deprecate("scale", "1.0.0", _SCALE_DEPRECATION)
    h = self.proj(hidden_states)
    why = _kernel_unsupported(h)
    if why is not None:
        warn_fallback(self, why, stacklevel=3)
        hidden, gate = h.chunk(2, dim=-1)
        return hidden * self.gelu(gate)
    return _act.gelu_and_mul(h, "none", False)  # first half * gelu(second half)


def _match_diffusers_swiglu(m: nn.Module):
    cls = diffusers_class(_ACTS, "SwiGLU")
    if cls is None or not isinstance(m, cls):
        return None
    why = _same_code(type(m), forward=_REF_DIFF_SWIGLU_FORWARD)
    if why is not None:
        return why
    act = _act_kind(getattr(m, "activation", None))
    if isinstance(act, str):
        return act
    if act[0] != "silu":
        return f"activation is {type(m.activation).__name__}, not SiLU"
    return True


def _diffusers_swiglu_forward(self, hidden_states):
    changed = _act_changed(self, self.activation)
    if changed is not None:
        warn_fallback(self, changed, _REPLACED_HINT, 3)
        return original(self)(hidden_states)
    h = self.proj(hidden_states)
    hidden, gate = h.chunk(2, dim=-1)
    why = _kernel_unsupported(h)
    if why is not None:
        warn_fallback(self, why, stacklevel=3)
        return hidden * self.activation(gate)
    return _act.swiglu(gate, hidden)  # silu(gate) * hidden


def _match_diffusers_linear_act(m: nn.Module):
    cls = diffusers_class(_ACTS, "LinearActivation")
    if cls is None or not isinstance(m, cls):
        return None
    why = _same_code(type(m), forward=_REF_DIFF_LINEAR_ACT_FORWARD)
    if why is not None:
        return why
    act = _act_kind(getattr(m, "activation", None))
    if isinstance(act, str):
        return act
    if act[0] != "gelu":
        return f"activation is {type(m.activation).__name__}: kernelforge has no ungated {act[0]} op"
    return True


def _diffusers_linear_act_forward(self, hidden_states):
    changed = _act_changed(self, self.activation)
    if changed is not None:
        warn_fallback(self, changed, _REPLACED_HINT, 3)
        return original(self)(hidden_states)
    h = self.proj(hidden_states)
    why = _kernel_unsupported(h)
    if why is not None:
        warn_fallback(self, why, stacklevel=3)
        return self.activation(h)
    return _act.gelu(h, self.__dict__[STATE_ATTR].extra[1])


def _unsupported_diffusers(m: nn.Module) -> str | None:
    cls = diffusers_class(_ACTS, "ApproximateGELU")
    if cls is not None and isinstance(m, cls):
        return "x * sigmoid(1.702 x) (sigmoid-approximated GELU): no kernelforge op computes it"
    return None


register_unsupported("activation", _unsupported_diffusers)

for _entry in (
    Replacement("transformers gated MLP (SiLU)", "kernelforge.swiglu", _match_hf_mlp("silu"), _hf_mlp_forward("silu"),
                "activation", _act_setup("act_fn")),
    Replacement("transformers gated MLP (GELU)", "kernelforge.geglu", _match_hf_mlp("gelu"), _hf_mlp_forward("gelu"),
                "activation", _act_setup("act_fn")),
    Replacement("transformers fc1/act/fc2 MLP (GELU)", "kernelforge.gelu", _match_hf_fc_mlp, _hf_fc_mlp_forward,
                "activation", _fc_mlp_setup),
    Replacement("diffusers GELU", "kernelforge.gelu", _match_diffusers_gelu, _diffusers_gelu_forward, "activation"),
    Replacement("diffusers GEGLU", "kernelforge.gelu_and_mul", _match_diffusers_geglu, _diffusers_geglu_forward,
                "activation"),
    Replacement("diffusers SwiGLU", "kernelforge.swiglu", _match_diffusers_swiglu, _diffusers_swiglu_forward,
                "activation", _act_setup("activation")),
    Replacement("diffusers LinearActivation", "kernelforge.gelu", _match_diffusers_linear_act,
                _diffusers_linear_act_forward, "activation", _act_setup("activation")),
):
    register_replacement(_entry)
del _entry
