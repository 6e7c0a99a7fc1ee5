// Internal description of one cross-entropy call, shared by the CUDA launchers and the float64
// reference. validate_cross_entropy() fills it from the public TensorViews; it is the only place that
// checks arguments, so every error message comes from one file.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "kernelforge/cross_entropy.h"

namespace kernelforge {

// Device-side parameters (passed by value). Logit (i, j) is at logits + i * ld + j (64-bit row
// offsets; j < V < 2^31). Target i is at target + i * target_stride (int64 or int32).
struct CeParams {
  const void* logits = nullptr;
  int64_t ld = 0;
  void* dlogits = nullptr;  // backward output (may equal logits: in place)
  int64_t dld = 0;
  const void* target = nullptr;
  int64_t target_stride = 0;
  bool target64 = true;
  int64_t rows = 0;
  int64_t vocab = 0;
  int64_t class_start = 0;  // global index of column 0 (vocabulary-parallel shards; 0 otherwise)
  int64_t classes = 0;      // global number of classes N (= vocab unless a shard)
  // options
  int64_t ignore_index = -100;
  float smoothing = 0.f;  // label_smoothing
  float z_loss = 0.f;     // z_loss_scale
  float softcap = 0.f;    // 0: none
  Reduction reduction = Reduction::kMean;
  // forward outputs (float32): row_loss [T], lse [T], loss [] (not kNone), valid []
  float* row_loss = nullptr;
  float* lse_out = nullptr;
  float* loss = nullptr;
  float* valid_out = nullptr;
  // backward inputs (float32): dloss ([] or [T] with a stride), lse [T], valid []
  const float* dloss = nullptr;
  int64_t dloss_stride = 0;
  const float* lse = nullptr;
  const float* valid = nullptr;
};

struct CeCall {
  const char* name = "";
  bool backward = false;
  bool cuda = true;  // false: the CPU reference (float64 logits also accepted)
  CrossEntropyOptions opts;
  const TensorView* logits = nullptr;
  const TensorView* target = nullptr;
  // forward outputs
  const TensorView* row_loss = nullptr;
  const TensorView* lse_out = nullptr;
  const TensorView* loss = nullptr;
  const TensorView* valid_out = nullptr;
  // backward
  const TensorView* dloss = nullptr;
  const TensorView* lse = nullptr;
  const TensorView* valid = nullptr;
  const TensorView* dlogits = nullptr;
};

// Checks every argument of `c` and fills `p`. `dtype` receives the logits' dtype.
Status validate_cross_entropy(const CeCall& c, CeParams* p, DType* dtype);

// Forward partials: one float4 (max, sum of exp, sum of logits, 0) per (row, segment) of
// ce_segment_len(dtype) logits (ce_segment_elems in cross_entropy_plan.h), then one float2 (sum of row losses, valid
// rows) per finalize block.
constexpr int kCeFinalizeBlock = 256;  // rows per finalize block (one thread each)
int64_t ce_segment_len(DType t);
int64_t ce_segments(int64_t vocab, DType t);
size_t ce_workspace_bytes(int64_t rows, int64_t vocab, DType t);

}  // namespace kernelforge
