"""kernelforge: fast CUDA kernels for transformer workloads, with a thin PyTorch front end.

    import kernelforge as kf
    y = kf.rms_norm(x, weight, eps=1e-6)
    h = kf.silu_and_mul(gate_up)  # silu(gate_up[..., :I]) * gate_up[..., I:]
    q, k = kf.apply_rope(q, k, cos, sin)  # HF Llama rotate-half RoPE on q and k in one call
    p = kf.softmax(scores, dim=-1)  # torch.softmax semantics, one fused kernel per direction
    report = kf.patch(model)      # route a transformers / diffusers model's norms, MLPs, RoPE and
                                  # causal-LM loss (fused_linear_cross_entropy when labels are passed)
    print(report)

Importing needs the compiled extension (libkernelforge_torch.so next to this file) but no GPU:
on CPU the ops run the float64 C++ reference.
"""

from . import nn
from ._ops import ada_norm, add_rms_norm, layer_norm, rms_norm
from .activation import geglu, gelu, gelu_and_mul, silu_and_mul, swiglu
from .cross_entropy import cross_entropy, fused_linear_cross_entropy
from .patch import PatchReport, patch, unpatch
from .rope import apply_rope, apply_rope_bsc, ltx_video_rope
from .softmax import log_softmax, softmax

__version__ = "0.1.0"

__all__ = [
    "rms_norm",
    "add_rms_norm",
    "layer_norm",
    "ada_norm",
    "silu_and_mul",
    "swiglu",
    "gelu_and_mul",
    "geglu",
    "gelu",
    "apply_rope",
    "apply_rope_bsc",
    "ltx_video_rope",
    "cross_entropy",
    "fused_linear_cross_entropy",
    "softmax",
    "log_softmax",
    "patch",
    "unpatch",
    "PatchReport",
    "nn",
    "__version__",
]
