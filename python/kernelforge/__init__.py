"""kernelforge: fast CUDA kernels for transformer workloads, with a thin PyTorch front end.

    import kernelforge as kf
    y = kf.rms_norm(x, weight, eps=1e-6)
    h = kf.silu_and_mul(gate_up)  # silu(gate_up[..., :I]) * gate_up[..., I:]
    q, k = kf.apply_rope(q, k, cos, sin)  # HF Llama rotate-half RoPE on q and k in one call
    loss = kf.vocab_parallel_cross_entropy(logits_shard, target, group)  # tensor-parallel lm_head loss
    p = kf.softmax(scores, dim=-1)  # torch.softmax semantics, one fused kernel per direction
    o = kf.attention(q, k, v, causal=True)  # flash attention forward, [B, S, H, D] (GQA, varlen, ...)
    kf.kv_append(k_cache, v_cache, k, v, seq_lens, block_table)   # new keys/values into a paged cache
    q = kf.rope_kv_append(q, k, v, cos, sin, k_cache, v_cache, seq_lens, block_table)  # RoPE fused in
    o = kf.decode_attention(q, k_cache, v_cache, seq_lens, block_table)  # decode against that cache
    o = kf.cascade_decode_attention(q, prefix_k, prefix_v, k_cache, v_cache, seq_lens, block_table)  # shared prefix
    y = kf.linear(x, w, bias)     # nn.Linear's product: a skinny GEMM for <= 16 rows, else cuBLASLt
    y = kf.linear(x, w, bias, activation="gelu_tanh")  # the activation fused into the GEMM's epilogue
    s = kf.fused_linear_rowsum(x, w, bias)  # F.linear(x, w, bias).sum(-1), the product never exists
    h = kf.gather_scatter(x, src, dst, num_nodes, reduce="mean")  # GNN aggregation, no atomics
    report = kf.patch(model)      # route a transformers / diffusers model's norms, MLPs, RoPE and
                                  # causal-LM loss (fused_linear_cross_entropy when labels are passed)
    print(report)
    out = kf.generate(model, input_ids, max_new_tokens=128)  # HF causal LM: decode step in one CUDA graph
                                  # (Llama / Mistral / Qwen2: the fused step of decode_step.py, 10 kernels a layer)
    kf.last_plan()                # the plan (kernel and launch parameters) of the last launch

Importing needs the compiled extension (libkernelforge_torch.so next to this file) but no GPU:
on CPU the ops run the float64 C++ reference.
"""

from . import layers, nn
from ._ops import _ops as _library
from .activation import geglu, gelu, gelu_and_mul, silu_and_mul, swiglu
from .attention import attention, scaled_dot_product_attention
from .cross_entropy import cross_entropy, fused_linear_cross_entropy
from .decode import decode_attention, decode_workspace, kv_append, mla_decode, rope_kv_append
from .decode import cascade_decode_attention, merge_attention_states, prefetch_l2
from .diagonal_matmul import diagonal_matmul
from .dropout import dropout, dropout_add
from .distributed import vocab_parallel_cross_entropy, vocab_parallel_fused_linear_cross_entropy
from .distributed import _install_registration as _install_dtensor_rules
from .fused_linear_rowsum import fused_linear_rowsum
from .generate import generate
from .gemm import bmm, gemm, matmul
from .grouped_mm import grouped_mm, grouped_mm_wgrad
from .graph import gather_scatter, scatter_add, segment_max, segment_mean, segment_sum
from .linear import linear
from .norm import ada_norm, add_rms_norm, layer_norm, rms_norm
from .patch import PatchReport, patch, unpatch
from .rope import apply_rope, apply_rope_bsc, ltx_video_rope
from . import sdpa_impl  # registers "kernelforge" with torch's flash attention registry when torch has one
from .softmax import log_softmax, softmax

__version__ = "0.1.0"

_install_dtensor_rules()  # DTensor sharding rules, registered when torch.distributed.tensor is imported


def last_plan() -> str:
    """The plan of the last kernelforge kernel launch on this thread: the kernel and its launch
    parameters, e.g. ``"fwd_row vec=8 iters=2 threads=256 rows/block=1"``; ``""`` before the first.
    CPU tensors run the reference and launch nothing. Autograd runs CUDA backward passes on its own
    threads, so after ``loss.backward()`` this is still the last forward's plan."""
    return _library.last_plan()


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
    "fused_linear_rowsum",
    "vocab_parallel_cross_entropy",
    "vocab_parallel_fused_linear_cross_entropy",
    "softmax",
    "log_softmax",
    "dropout",
    "dropout_add",
    "attention",
    "scaled_dot_product_attention",
    "decode_attention",
    "decode_workspace",
    "kv_append",
    "rope_kv_append",
    "prefetch_l2",
    "mla_decode",
    "merge_attention_states",
    "cascade_decode_attention",
    "linear",
    "gemm",
    "bmm",
    "matmul",
    "grouped_mm",
    "grouped_mm_wgrad",
    "diagonal_matmul",
    "segment_sum",
    "segment_mean",
    "segment_max",
    "gather_scatter",
    "scatter_add",
    "patch",
    "unpatch",
    "generate",
    "PatchReport",
    "nn",
    "last_plan",
    "__version__",
]
