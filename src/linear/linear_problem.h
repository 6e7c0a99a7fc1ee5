// Internal description of one linear call, shared by the CUDA launchers and the float64 reference.
// validate_linear() fills it from the public TensorViews and is the only place that checks
// arguments. Element (m, k) of x is at x + m * ldx + k; w (n, k) at w + n * ldw + k; y (m, n) at
// y + m * ldy + n.
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernelforge/linear.h"

namespace kernelforge {

struct LinearParams {
  const void* x = nullptr;
  const void* w = nullptr;
  const void* bias = nullptr;  // nullptr: none
  void* y = nullptr;
  int64_t ldx = 0, ldw = 0, ldy = 0;
  int32_t M = 0;
  int64_t N = 0, K = 0;
  // every x / w base 16-byte aligned and every row stride a multiple of 8 elements: 16-byte cp.async
  bool vec16 = false;
  // TMA copies (LinearKernel::kTma): x and w 16-byte aligned, their row strides multiples of 16
  // bytes and at least K (no overlapping rows; a single row's stride is unused), K * 2 >= 16 bytes,
  // K and N below 2^31 (int32 coordinates)
  bool tma = false;
  // The GEMV kernel (LinearKernel::kGemv): M <= kLinearGemvMaxRows, K a multiple of 8, x and w 16-byte
  // aligned, w's row stride a multiple of 8 elements and x's too when M > 1
  bool gemv = false;
};

// Checks every argument; `cuda` = false admits float32 / float64 and any M (the CPU reference).
Status validate_linear(const char* name, bool cuda, const LinearTensors& t, LinearParams* p, DType* dtype);

}  // namespace kernelforge
