// Internal description of one GEMM call, shared by the cuBLASLt launcher and the float64 reference.
// validate_gemm() fills it from the public TensorViews and is the only place that checks arguments.
// Element (r, c) of a matrix is at data + r * ld + c when row_major, data + r + c * ld otherwise; batch i
// of it starts at data + i * bs (bs = 0: one matrix shared by every batch).
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernelforge/gemm.h"

namespace kernelforge {

struct GemmMatrix {
  const void* data = nullptr;
  int64_t ld = 0;
  bool row_major = true;
  int64_t bs = 0;  // batch stride in elements
};

struct GemmParams {
  GemmMatrix a, b;             // a [M, K], b [N, K]
  const void* bias = nullptr;  // [N] or nullptr
  void* out = nullptr;         // [M, N] row-major, row stride ldo, batch stride out_bs
  int64_t ldo = 0, out_bs = 0;
  void* aux = nullptr;    // [M, N] contiguous (batch stride M N) or nullptr
  void* a_sum = nullptr;  // [M] or nullptr (batch 1 only)
  int64_t M = 0, N = 0, K = 0;
  int64_t batch = 1;        // the product count: out [batch, M, N]
  bool accumulate = false;  // out += a b^T (beta = 1)
};

// Checks every argument; `cuda` = false admits float32 / float64 (the CPU reference).
Status validate_gemm(const char* name, bool cuda, const GemmTensors& t, GemmActivation act, GemmParams* p,
                     DType* dtype);

}  // namespace kernelforge
