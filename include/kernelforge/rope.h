// kernelforge RoPE family: rotary position embedding applied to q and k in one call, forward and
// backward.
//
// Tensors (element strides, as in tensor.h; every last dimension contiguous, stride 1):
//   q      [B, S, Hq, D] (RopeLayout::kBSHD) or [B, Hq, S, D] (kBHSD), any strides otherwise (e.g. a
//          slice of a fused qkv projection)
//   k      the same layout with Hk heads (GQA/MQA: Hk may differ from Hq); may be absent (nullptr),
//          then only q is rotated
//   cos, sin  without position_ids: [S, R] (shared by the batch) or [B, S, R] / [1, S, R], as
//          computed per position (HF LlamaRotaryEmbedding returns [B, S, D] with R = D);
//          with position_ids: a cache [max_pos, R], row p holding position p
//   position_ids [B, S] or [1, S] int64 (optional): token (b, s) uses cos[position_ids[b, s]]
//   q_out, k_out  the shapes of q and k (any strides); each may be its input itself (in place:
//          the same data pointer and strides) or a tensor that does not overlap it
// R = rotary_dim (even, 2 <= R <= D): the first R columns of every head are rotated and the columns
// R..D-1 are passed through unchanged (partial rotary: GPT-NeoX, Phi, ...).
//
// Formula. cos/sin hold one value per rotated column j < R (HF and diffusers pass them at full
// width: HF's `emb = cat(freqs, freqs)`, diffusers' repeat_interleave(2)), and for every pair (a, b)
//   out[a] = x[a] cos[a] - x[b] sin[a]
//   out[b] = x[b] cos[b] + x[a] sin[b]
// with the pairs
//   interleaved = false (rotate-half, HF Llama `q * cos + rotate_half(q) * sin`): (i, i + R/2), i < R/2
//   interleaved = true  (GPT-J / diffusers apply_rotary_emb(use_real=True, use_real_unbind_dim=-1):
//                        `x * cos + stack([-x_imag, x_real]).flatten() * sin`): (2i, 2i + 1), i < R/2
// This is exactly both libraries' elementwise formula, column by column; it does not assume that
// the two halves (or the two members of a pair) of cos/sin are equal, though in every model they are.
//
// Backward (dq from dq_out, dk from dk_out): the transpose of that rotation,
//   dx[a] = g[a] cos[a] + g[b] sin[b]
//   dx[b] = g[b] cos[b] - g[a] sin[a]
// i.e. the same rotation with sin negated (and, for each pair, the sin of the other member: equal
// whenever the pair's cos/sin are equal, as in every model). Columns R..D-1 pass g through.
//
// dtypes: q, k, q_out, k_out share one dtype (float32, float16, bfloat16; bfloat16 needs sm_80+);
// cos and sin share one dtype, either q's or float32 (e.g. float32 tables with bfloat16 q/k). The
// math is float32 with one rounding of each output (diffusers computes in float32 and rounds once;
// HF computes `q * cos + rotate_half(q) * sin` in q's dtype, rounding three times: within two
// roundings of ours).
//
// position_ids out of range (< 0 or >= max_pos): the CUDA kernel does not read outside the cache;
// it writes NaN to the rotated columns of that token (passthrough columns are still copied). The
// CPU reference returns an InvalidArgument status instead (it can see the values).
//
// Every function launches on `stream`, never synchronizes or allocates. An empty q (and k) launches
// nothing.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "kernelforge/status.h"
#include "kernelforge/tensor.h"

namespace kernelforge {

enum class RopeLayout : int { kBSHD = 0, kBHSD = 1 };

struct RopeOptions {
  RopeLayout layout = RopeLayout::kBSHD;
  bool interleaved = false;  // false: rotate-half pairs (i, i + R/2); true: pairs (2i, 2i + 1)
  int64_t rotary_dim = 0;    // 0: cos.size(-1); otherwise it must equal cos.size(-1)
};

// ---- CUDA ------------------------------------------------------------------------------------
// k and k_out are both present or both nullptr; position_ids may be nullptr.
Status apply_rope(const TensorView& q, const TensorView* k, const TensorView& cos, const TensorView& sin,
                  const TensorView* position_ids, const RopeOptions& opts, const TensorView& q_out,
                  const TensorView* k_out, cudaStream_t stream);
// dq_out, dk_out: gradients of q_out, k_out; dq, dk receive the gradients of q, k (may alias
// dq_out, dk_out: in place).
Status apply_rope_backward(const TensorView& dq_out, const TensorView* dk_out, const TensorView& cos,
                           const TensorView& sin, const TensorView* position_ids, const RopeOptions& opts,
                           const TensorView& dq, const TensorView* dk, cudaStream_t stream);

// ---- float64 CPU reference -------------------------------------------------------------------
// Same arguments without the stream, for CPU tensors (float64 also accepted for q/k, and for
// cos/sin when q is float64): computes in double and rounds each output once. The test oracle and
// the CPU implementation of the PyTorch op.
namespace ref {
Status apply_rope(const TensorView& q, const TensorView* k, const TensorView& cos, const TensorView& sin,
                  const TensorView* position_ids, const RopeOptions& opts, const TensorView& q_out,
                  const TensorView* k_out);
Status apply_rope_backward(const TensorView& dq_out, const TensorView* dk_out, const TensorView& cos,
                           const TensorView& sin, const TensorView* position_ids, const RopeOptions& opts,
                           const TensorView& dq, const TensorView* dk);
}  // namespace ref

}  // namespace kernelforge
