// Internal description of one normalization call, shared by the planner, the CUDA launchers and the float64
// reference. validate_norm() fills it from the public TensorViews; it is the only place that checks
// arguments (dtype, shape, strides, device, sizes), so every error message comes from one file.
#pragma once

#include <cstdint>

#include "kernelforge/norm.h"

namespace kernelforge {

enum class NormOp : int { kRms = 0, kAddRms = 1, kLayer = 2, kAdaRms = 3, kAdaLayer = 4 };

// Device-side parameters (passed by value to the kernels). Row tensors are addressed as
// base + row * stride + column; scale/shift as base + (row / ada_rpg) * stride + column.
struct NormParams {
  // forward inputs (backward: x is the saved input; for add_rms_norm the saved sum)
  const void* x = nullptr;
  const void* residual = nullptr;
  const void* weight = nullptr;
  const void* bias = nullptr;
  const void* scale = nullptr;
  const void* shift = nullptr;
  // forward outputs
  void* y = nullptr;
  void* sum = nullptr;
  // backward
  const void* dy = nullptr;
  const void* dsum = nullptr;
  void* dx = nullptr;
  void* dweight = nullptr;
  void* dbias = nullptr;
  void* dscale = nullptr;
  void* dshift = nullptr;

  int64_t rows = 0;
  int64_t n = 0;
  int64_t x_stride = 0, res_stride = 0, y_stride = 0, sum_stride = 0;
  int64_t dy_stride = 0, dsum_stride = 0, dx_stride = 0;
  int64_t ada_rpg = 1;     // rows per scale/shift row
  int64_t ada_groups = 1;  // rows / ada_rpg
  int64_t scale_stride = 0, shift_stride = 0;
  float eps = 0.f;
  float inv_n = 0.f;  // 1 / n, rounded once on the host
  // r / ada_rpg for 0 <= r < 2^31 without a division: (umulhi(ada_mul, r) + r) >> ada_shr
  // (set by validate_norm with make_fast_div, below; used when rows and ada_rpg fit in 31 bits).
  uint32_t ada_mul = 1, ada_shr = 0;
  // launch: the forward's early-parameter kernel lets the next kernel in at once (programmatic
  // dependent launch) when its whole grid is resident (set by the launcher)
  bool trigger = false;
};

// Division by an invariant d (1 <= d < 2^31) as a multiply-high, add and shift, exact for every
// 0 <= n < 2^31: with l = ceil(log2 d) and m = floor(2^(32+l) / d) - 2^32 + 1 (< 2^32),
// n / d = (umulhi(m, n) + n) >> l (the sum stays below 2^32 because n < 2^31).
struct FastDiv {
  uint32_t mul = 1, shr = 0;
};
inline FastDiv make_fast_div(int64_t d) {
  FastDiv f;
  uint32_t l = 0;
  while ((int64_t(1) << l) < d) ++l;
  f.shr = l;
  f.mul = static_cast<uint32_t>((uint64_t(1) << (32 + l)) / uint64_t(d) - (uint64_t(1) << 32) + 1);
  return f;
}
inline uint32_t fast_div_host(const FastDiv& f, uint32_t n) {  // what the kernels compute
  const uint32_t hi = static_cast<uint32_t>((uint64_t(f.mul) * n) >> 32);
  return (hi + n) >> f.shr;
}

struct NormCall {
  const char* name = "";
  NormOp op = NormOp::kRms;
  bool backward = false;
  bool cuda = true;  // false: the CPU reference (float64 also accepted)
  float eps = 0.f;
  NormKind kind = NormKind::kLayer;  // AdaLN only: the value the caller passed (validated)
  const TensorView* x = nullptr;
  const TensorView* residual = nullptr;
  const TensorView* weight = nullptr;
  const TensorView* bias = nullptr;
  const TensorView* scale = nullptr;
  const TensorView* shift = nullptr;
  const TensorView* y = nullptr;
  const TensorView* sum = nullptr;
  const TensorView* dy = nullptr;
  const TensorView* dsum = nullptr;
  const TensorView* dx = nullptr;
  const TensorView* dweight = nullptr;
  const TensorView* dbias = nullptr;
  const TensorView* dscale = nullptr;
  const TensorView* dshift = nullptr;
};

// Checks every argument of `c` and fills `p` (pointers, strides, sizes). `dtype` receives x's dtype.
Status validate_norm(const NormCall& c, NormParams* p, DType* dtype);

inline bool norm_is_layer(NormOp op) { return op == NormOp::kLayer || op == NormOp::kAdaLayer; }
inline bool norm_is_ada(NormOp op) { return op == NormOp::kAdaRms || op == NormOp::kAdaLayer; }

}  // namespace kernelforge
