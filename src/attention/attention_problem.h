// Internal description of one attention call, shared by the CUDA launchers and the float64 reference.
// validate_attention() fills it from the public TensorViews; it is the only place that checks
// arguments (dtype, shape, strides, device, head dims, options), so every error message comes from
// one file.
//
// Addressing (element offsets): row r of head h of batch b of q is at
//   q + b * q_sb + r * q_ss + h * q_sh           (columns contiguous)
// where r is the row within the sequence (kBSHD / kBHSD) or cu_seqlens_q[b] + row (kVarlen, with
// q_sb = 0). k, v, out alike (k and v with cu_seqlens_k); lse row r of head h of batch b is at
// lse + b * lse_sb + h * lse_sh + r (the same r).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "kernelforge/attention.h"

namespace kernelforge {

// Device-side parameters (passed by value to the kernels).
struct AttentionParams {
  const void* q = nullptr;
  const void* k = nullptr;
  const void* v = nullptr;
  void* out = nullptr;
  float* lse = nullptr;         // nullptr: not written
  const void* sinks = nullptr;  // nullptr: no sinks; else [Hq] of float32 (sinks_float) or q's dtype
  bool sinks_float = true;
  const int32_t* cu_seqlens_q = nullptr;  // kVarlen: [batch + 1]; nullptr otherwise
  const int32_t* cu_seqlens_k = nullptr;
  int64_t q_sb = 0, q_ss = 0, q_sh = 0;
  int64_t k_sb = 0, k_ss = 0, k_sh = 0;
  int64_t v_sb = 0, v_ss = 0, v_sh = 0;
  int64_t o_sb = 0, o_ss = 0, o_sh = 0;
  int64_t lse_sb = 0, lse_sh = 0;
  int32_t batch = 0;
  int32_t heads_q = 0;
  int32_t heads_kv = 0;
  int32_t group = 1;     // heads_q / heads_kv: query head h reads kv head h / group
  int32_t seqlen_q = 0;  // kBSHD / kBHSD: every sequence's length; kVarlen: an upper bound (max_seqlen_q)
  int32_t seqlen_k = 0;
  int64_t total_q = 0;  // rows of q over the batch: B * Sq, or Tq (kVarlen)
  int64_t total_k = 0;  // rows of k / v over the batch: B * Sk, or Tk (kVarlen)
  int32_t head_dim_qk = 0;
  int32_t head_dim_v = 0;
  float scale = 1.0f;    // applied to q . k (before the softcap)
  float softcap = 0.0f;  // 0: none
  // Visible keys of row i, d = Sk_b - Sq_b: j >= i + d - window_left (when window_left >= 0) and
  // j <= i + d + window_right (when window_right >= 0). causal has been folded into window_right = 0.
  int32_t window_left = -1;
  int32_t window_right = -1;
  bool varlen = false;
};

// The arguments of one public call.
struct AttentionCall {
  const char* name = "attention_forward";
  bool cuda = true;  // false: the CPU reference (float64 also accepted)
  AttentionTensors t;
  AttentionOptions opts;
};

// Checks every argument of `c` and fills `p`; `dtype` receives q's dtype.
Status validate_attention(const AttentionCall& c, AttentionParams* p, DType* dtype);

// Device-side parameters of the backward: the forward's (f: q, k, v, out, lse, sinks, cu_seqlens,
// every shape and option; lse is never null here) and the gradients. dout and out share one
// addressing rule (do_* strides, out's shape); dq / dk / dv follow q / k / v with their own strides.
struct AttentionGradParams {
  AttentionParams f;
  const void* dout = nullptr;
  void* dq = nullptr;
  void* dk = nullptr;
  void* dv = nullptr;
  float* dsinks = nullptr;  // [Hq] float32; non-null exactly when f.sinks is
  int64_t do_sb = 0, do_ss = 0, do_sh = 0;
  int64_t dq_sb = 0, dq_ss = 0, dq_sh = 0;
  int64_t dk_sb = 0, dk_ss = 0, dk_sh = 0;
  int64_t dv_sb = 0, dv_ss = 0, dv_sh = 0;
  bool deterministic = false;
};

// The arguments of one public backward call.
struct AttentionGradCall {
  const char* name = "attention_backward";
  bool cuda = true;  // false: the CPU reference (float64 also accepted)
  AttentionGradTensors t;
  AttentionOptions opts;
};

// Checks every argument of `c` (the forward's through validate_attention, lse required, then dout
// and the gradients) and fills `p`; `dtype` receives q's dtype.
Status validate_attention_backward(const AttentionGradCall& c, AttentionGradParams* p, DType* dtype);

}  // namespace kernelforge
