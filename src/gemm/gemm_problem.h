// Internal description of one GEMM call, shared by the cuBLASLt launcher and the float64 reference.
// validate_gemm() fills it from the public TensorViews and is the only place that checks arguments.
// Element (r, c) of a matrix is at data + r * ld + c when row_major, data + r + c * ld otherwise.
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernelforge/gemm.h"

namespace kernelforge {

struct GemmMatrix {
  const void* data = nullptr;
  int64_t ld = 0;
  bool row_major = true;
};

struct GemmParams {
  GemmMatrix a, b;             // a [M, K], b [N, K]
  const void* bias = nullptr;  // [N] or nullptr
  void* out = nullptr;         // [M, N] row-major, row stride ldo
  int64_t ldo = 0;
  void* aux = nullptr;    // [M, N] contiguous or nullptr
  void* a_sum = nullptr;  // [M] or nullptr
  int64_t M = 0, N = 0, K = 0;
};

// Checks every argument; `cuda` = false admits float32 / float64 (the CPU reference).
Status validate_gemm(const char* name, bool cuda, const GemmTensors& t, GemmActivation act, GemmParams* p,
                     DType* dtype);

}  // namespace kernelforge
