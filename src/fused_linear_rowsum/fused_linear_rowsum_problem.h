// Internal description of one fused_linear_rowsum call, shared by the CUDA launchers and the float64
// reference. validate_fused_linear_rowsum() fills it from the public TensorViews; it is the only place
// that checks arguments, so every error message comes from one file.
//
// Both directions are one column pass over a [rows, K] matrix A plus a per-row value v summed into an
// extra column K (partials [chunks, K + 1] float32), a fixed-order reduction of the chunks, and a
// final kernel:
//   forward:  A = weight (rows O), s_r = 1,     v_r = bias[r]  -> w_sum, b_sum -> y = x · w_sum + b_sum
//   backward: A = x      (rows T), s_r = dy[r], v_r = dy[r]    -> g, sum dy    -> dweight rows, dbias
// The backward's column pass also writes dx[r, k] = dy[r] * w_sum[k] (it reads dy[r] anyway).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "kernelforge/fused_linear_rowsum.h"

namespace kernelforge {

// Device-side parameters (passed by value to every kernel). Element (r, c) of a row tensor t is at
// t + r * t_stride + c; element r of a vector v at v + r * v_stride (64-bit offsets, c < K < 2^31).
struct FlrsParams {
  int64_t tokens = 0;  // T: rows of x
  int64_t k = 0;       // K: in_features
  int64_t o = 0;       // O: out_features (backward: 0 when neither dweight nor dbias is asked)
  const void* x = nullptr;
  int64_t x_stride = 0;
  const void* w = nullptr;  // forward: weight [O, K]
  int64_t w_stride = 0;
  const void* bias = nullptr;  // forward: [O] or nullptr
  int64_t bias_stride = 0;
  void* y = nullptr;  // forward: x.shape[:-1]
  int64_t y_stride = 0;
  float* w_sum = nullptr;  // forward: written; backward: read for dx (contiguous float32 [K])
  const void* dy = nullptr;
  int64_t dy_stride = 0;
  void* dx = nullptr;  // backward outputs, nullptr when not asked
  int64_t dx_stride = 0;
  void* dw = nullptr;
  int64_t dw_stride = 0;
  void* db = nullptr;
  int64_t db_stride = 0;
};

struct FlrsCall {
  const char* name = "";
  bool backward = false;
  bool cuda = true;  // false: the CPU reference (float64 also accepted)
  const TensorView* x = nullptr;
  const TensorView* weight = nullptr;
  const TensorView* bias = nullptr;
  const TensorView* y = nullptr;
  const TensorView* w_sum = nullptr;
  const TensorView* dy = nullptr;
  const TensorView* dx = nullptr;
  const TensorView* dweight = nullptr;
  const TensorView* dbias = nullptr;
};

// Checks every argument of `c` and fills `p` (pointers, strides, sizes). `dtype` receives x's dtype
// and `w_sum_dtype` w_sum's (float32 on CUDA; float32 or float64 for the reference).
Status validate_fused_linear_rowsum(const FlrsCall& c, FlrsParams* p, DType* dtype, DType* w_sum_dtype);

}  // namespace kernelforge
