// kernelforge attention family: scaled dot-product attention for prefill and training (forward:
// out and logsumexp; backward: dq, dk, dv and dsinks).
//
// Tensors (element strides, as in tensor.h; every last dimension contiguous, stride 1; any other
// strides, e.g. slices of a fused qkv projection):
//   layout kBSHD   q [B, Sq, Hq, Dqk]   k [B, Sk, Hkv, Dqk]   v [B, Sk, Hkv, Dv]   out [B, Sq, Hq, Dv]
//   layout kBHSD   q [B, Hq, Sq, Dqk]   k [B, Hkv, Sk, Dqk]   v [B, Hkv, Sk, Dv]   out [B, Hq, Sq, Dv]
//   layout kVarlen q [Tq, Hq, Dqk]      k [Tk, Hkv, Dqk]      v [Tk, Hkv, Dv]      out [Tq, Hq, Dv]
//          packed sequences: sequence b holds query tokens cu_seqlens_q[b] .. cu_seqlens_q[b+1]-1
//          and key tokens cu_seqlens_k[b] .. cu_seqlens_k[b+1]-1 (int32 [B + 1] on the device,
//          non-decreasing, starting at 0; read only by the kernels, never by the host).
//   lse    optional float32 logsumexp of every query row, natural log: [B, Hq, Sq] (kBSHD, kBHSD) or
//          [Hq, Tq] (kVarlen), any strides with the last one 1.
//   sinks  optional per-query-head logit [Hq], float32 or q's dtype (gpt-oss "attention sinks").
// GQA / MQA: Hq is a multiple of Hkv; query head h reads key/value head h / (Hq / Hkv).
// Head dims: Dqk in {64, 96, 128, 256} with Dv = Dqk, or Dqk = 192 with Dv = 128 (MLA prefill).
// dtypes: q, k, v, out share one dtype, float16 or bfloat16; math in float32.
//
// Formula, for every batch b, query head h, query row i < Sq_b (Sq_b, Sk_b: this sequence's lengths):
//   s_ij = scale * q_i . k_j                              scale defaults to 1 / sqrt(Dqk)
//   s_ij = softcap * tanh(s_ij / softcap)                  only when softcap > 0 (Gemma 2)
//   key j is visible from row i when, with the offset d = Sk_b - Sq_b (bottom-right alignment),
//     (window_left  < 0 or j >= i + d - window_left) and (window_right < 0 or j <= i + d + window_right)
//   causal is window_right = 0 (with window_left as given)
//   m_i  = max(max over visible j of s_ij, sink_h)         (sink_h = -inf without sinks)
//   l_i  = sum over visible j of exp(s_ij - m_i) + exp(sink_h - m_i)
//   out_i = sum over visible j of exp(s_ij - m_i) / l_i * v_j
//   lse_i = m_i + log(l_i)
// A row that sees no key gets out_i = 0 (never NaN) and lse_i = -inf, or lse_i = sink_h with sinks.
// FLOPs (the standard count): 2 * Sq * Sk * (Dqk + Dv) per (b, h), over visible pairs only for
// causal (about half).
//
// Plan and run (FlashInfer's split): attention_plan() reads only shapes, strides and options (no
// device memory: safe to call before a CUDA-graph capture, cheap enough to call per step) and returns
// a printable plan and the workspace it needs; attention_forward() runs it. The one-call entry plans
// itself and follows CUB's convention: with workspace == nullptr it writes the bytes it needs to
// *workspace_bytes and launches nothing. Every run function launches on `stream`, never synchronizes
// or allocates. An empty problem (B, Hq, Sq or Tq = 0) launches nothing; Sk = 0 writes zeros.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <string>

#include "kernelforge/status.h"
#include "kernelforge/tensor.h"

namespace kernelforge {

enum class AttentionLayout : int { kBSHD = 0, kBHSD = 1, kVarlen = 2 };

struct AttentionOptions {
  AttentionLayout layout = AttentionLayout::kBSHD;
  bool causal = false;        // bottom-right aligned when Sq != Sk; the same as window_right = 0
  int64_t window_left = -1;   // keys at most window_left before the diagonal; -1: unbounded
  int64_t window_right = -1;  // keys at most window_right after the diagonal; -1: unbounded
  float softcap = 0.0f;       // > 0: logits pass through softcap * tanh(s / softcap)
  float scale = 0.0f;         // 0: 1 / sqrt(Dqk)
  // kVarlen only: upper bounds of every sequence's query and key length (host values: they size the
  // grid without reading cu_seqlens). 0: the total token count, always safe, more idle blocks.
  int64_t max_seqlen_q = 0;
  int64_t max_seqlen_k = 0;
  // Backward only: dq (and dsinks) summed in a fixed order, so reruns are bit-identical. The default
  // adds dq with float atomics (fewer passes, order-dependent rounding).
  bool deterministic = false;
};

// The tensors of one forward call. q, k, v, out are required; the others are optional (nullptr).
struct AttentionTensors {
  const TensorView* q = nullptr;
  const TensorView* k = nullptr;
  const TensorView* v = nullptr;
  const TensorView* out = nullptr;
  const TensorView* lse = nullptr;
  const TensorView* sinks = nullptr;
  const TensorView* cu_seqlens_q = nullptr;  // kVarlen only, then required
  const TensorView* cu_seqlens_k = nullptr;  // kVarlen only, then required
};

// The tensors of one backward call: the forward's tensors (q, k, v, out, sinks, cu_seqlens as in
// the forward; lse is required: the forward's float32 logsumexp), dout (out's shape and dtype), and
// the gradients: dq, dk, dv with the shapes and dtype of q, k, v (any strides, last one 1);
// dsinks float32 [Hq], required when sinks is given, null otherwise. Gradients are overwritten, not
// accumulated; they must not overlap each other nor any input.
struct AttentionGradTensors {
  AttentionTensors fwd;
  const TensorView* dout = nullptr;
  const TensorView* dq = nullptr;
  const TensorView* dk = nullptr;
  const TensorView* dv = nullptr;
  const TensorView* dsinks = nullptr;
};
// Backward formula, with s_ij the (capped) logit and lse_i the forward's logsumexp:
//   p_ij = exp(s_ij - lse_i) for visible j (0 otherwise), p_sink_i = exp(sink_h - lse_i)
//   D_i   = dout_i . out_i                           (= sum_j p_ij dp_ij: the sink carries no value)
//   dv_j  = sum_i p_ij dout_i
//   dp_ij = dout_i . v_j,  ds_ij = p_ij (dp_ij - D_i)
//   du_ij = ds_ij (1 - (s_ij / softcap)^2) with softcap (d/du of softcap tanh(u / softcap)), else ds_ij
//   dq_i  = scale sum_j du_ij k_j,  dk_j = scale sum_i du_ij q_i
//   dk, dv of a key/value head sum over the query heads that read it (GQA)
//   dsinks_h = -sum over every (b, i) of p_sink_i D_i
// A row with lse_i = -inf (it saw no key and there is no sink) contributes nothing.
// FLOPs: 2.5 x the forward's (five GEMMs of the forward's two: S, dP, dV, dQ, dK).

// Which kernel runs a plan.
enum class AttentionKernel : int {
  kMma = 0,       // attention_fwd_mma: mma.sync tensor cores with cp.async loads (sm_80 and later)
  kWgmma = 1,     // attention_fwd_wgmma: wgmma with TMA loads, warp-specialized (sm_90a)
  kBwdMma = 2,    // attention_bwd_mma: the backward on mma.sync (sm_80 and later), with its
                  // preprocessing (D = rowsum(dout * out)) and dq conversion passes
  kBwdWgmma = 3,  // attention_bwd_wgmma: the backward on wgmma with TMA loads, warp-specialized
                  // (sm_90a), with the same preprocessing and dq conversion passes
};

// Tile order of the grid.
enum class AttentionOrder : int {
  kRowMajor = 0,      // blockIdx.x walks query tiles of one (batch, head)
  kLongestFirst = 1,  // causal / windowed: the query tiles with the most visible keys start first
  kPaired = 2,        // backward (wgmma kernel): a block takes key tiles t and T - 1 - t of its sequence
                      // (T key tiles), one after the other: causal grids of even work per block
};

// A plan: the kernel and every launch parameter chosen for a problem. A small printable value.
struct AttentionPlan {
  AttentionKernel kind = AttentionKernel::kMma;
  int head_dim_qk = 0;  // the kernel's compiled head dims
  int head_dim_v = 0;
  int block_m = 0;  // query rows per tile
  int block_n = 0;  // key rows per inner step
  int warps = 0;    // warps per block (wgmma: including the producer warpgroup)
  int stages = 0;   // K/V shared-memory pipeline stages
  int splits = 1;   // key splits (1: none; more: split-KV with a merge pass in the workspace)
  AttentionOrder order = AttentionOrder::kRowMajor;
};

std::string to_string(const AttentionPlan& plan);  // e.g. "attn_fwd_mma d=128/128 tile=128x64 warps=4 stages=2"

// ---- CUDA ------------------------------------------------------------------------------------
// The plan for a call on the current device, and the workspace bytes it needs (often 0).
Status attention_plan(const AttentionTensors& t, const AttentionOptions& opts, AttentionPlan* plan,
                      size_t* workspace_bytes);
// Runs `plan` (from attention_plan for the same shapes and options). workspace: at least the bytes
// attention_plan reported, 256-byte aligned, on the tensors' device; may be nullptr when 0 bytes.
Status attention_forward(const AttentionPlan& plan, const AttentionTensors& t, const AttentionOptions& opts,
                         void* workspace, size_t workspace_bytes, cudaStream_t stream);
// Plans and runs; with workspace == nullptr only writes the bytes needed to *workspace_bytes.
Status attention_forward(const AttentionTensors& t, const AttentionOptions& opts, void* workspace,
                         size_t* workspace_bytes, cudaStream_t stream);

// The backward: the same plan / run split and workspace convention. The workspace holds the float32
// dq accumulator and the row sums D (a few times q's bytes), so it is rarely 0.
Status attention_backward_plan(const AttentionGradTensors& t, const AttentionOptions& opts, AttentionPlan* plan,
                               size_t* workspace_bytes);
Status attention_backward(const AttentionPlan& plan, const AttentionGradTensors& t, const AttentionOptions& opts,
                          void* workspace, size_t workspace_bytes, cudaStream_t stream);
Status attention_backward(const AttentionGradTensors& t, const AttentionOptions& opts, void* workspace,
                          size_t* workspace_bytes, cudaStream_t stream);

// ---- float64 CPU reference -------------------------------------------------------------------
// The same call on CPU tensors (float64 also accepted for q, k, v, out, sinks; lse float32 or
// float64): computes in double and rounds each output once. The test oracle and the CPU
// implementation of the PyTorch op.
namespace ref {
Status attention_forward(const AttentionTensors& t, const AttentionOptions& opts);
Status attention_backward(const AttentionGradTensors& t, const AttentionOptions& opts);
}  // namespace ref

}  // namespace kernelforge
