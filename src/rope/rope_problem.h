// Internal description of one RoPE call, shared by the CUDA launcher and the float64 reference.
// validate_rope() fills it from the public TensorViews; it is the only place that checks arguments
// (dtype, shape, strides, device, sizes, aliasing), so every error message comes from one file.
//
// Every call is reduced to: for every token (b, s) and every head of q (then of k), rotate the
// pairs of the first R columns with the token's cos/sin row and pass columns R..D-1 through. The
// backward is the same pass with `backward` set (see rope.h for the transposed formula).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "kernelforge/rope.h"

namespace kernelforge {

// One of q / k: element (b, s, h, c) of the input is at in + b*in_sb + s*in_ss + h*in_sh + c.
struct RopeHeads {
  const void* in = nullptr;
  void* out = nullptr;
  int64_t in_sb = 0, in_ss = 0, in_sh = 0;
  int64_t out_sb = 0, out_ss = 0, out_sh = 0;
  int32_t heads = 0;     // 0 for an absent k
  bool inplace = false;  // out is in itself (same pointer and strides): passthrough columns are not written
};

// Device-side parameters (passed by value to the kernel).
struct RopeParams {
  RopeHeads t[2];  // [0] = q, [1] = k
  // The cos/sin row of token (b, s): without position ids cos + b*cos_sb + s*cos_ss (cos_sb = 0 when
  // shared by the batch); with them cos + pos[b*pos_sb + s*pos_ss] * cos_ss (cos_sb unused).
  const void* cos = nullptr;
  const void* sin = nullptr;
  int64_t cos_sb = 0, cos_ss = 0, sin_sb = 0, sin_ss = 0;
  const int64_t* pos = nullptr;
  int64_t pos_sb = 0, pos_ss = 0;
  int64_t max_pos = 0;
  int64_t batch = 0, seq = 0;
  int32_t head_dim = 0;  // D
  int32_t rot_dim = 0;   // R (even, <= D)
  bool interleaved = false;
  bool backward = false;
  // whether the kernel triggers its dependents at once (set by the launcher: PDL on sm_90, whole grid
  // resident)
  bool trigger = false;
};

struct RopeCall {
  const char* name = "";
  bool backward = false;
  bool cuda = true;               // false: the CPU reference (float64 also accepted)
  const TensorView* q = nullptr;  // forward: q, k; backward: dq_out, dk_out
  const TensorView* k = nullptr;
  const TensorView* cos = nullptr;
  const TensorView* sin = nullptr;
  const TensorView* pos = nullptr;
  RopeOptions opts;
  const TensorView* q_out = nullptr;  // forward: q_out, k_out; backward: dq, dk
  const TensorView* k_out = nullptr;
};

// Checks every argument of `c` and fills `p`. `dtype` receives q's dtype, `cs_dtype` cos/sin's.
Status validate_rope(const RopeCall& c, RopeParams* p, DType* dtype, DType* cs_dtype);

}  // namespace kernelforge
