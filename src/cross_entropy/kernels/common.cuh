// Device helpers shared by the cross-entropy kernels: 2^x on the MUFU, the target of a row, the
// softcap, and the combination of (max, sum of exponentials) pairs. The kernels work in the log2
// domain: u_j = z_j * log2(e), with z the (softcapped) logits.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "cross_entropy/cross_entropy_problem.h"

namespace kernelforge {

constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

__device__ __forceinline__ float ex2(float x) {  // 2^x, MUFU.EX2 (2^-inf = 0)
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

__device__ __forceinline__ int64_t ce_target(const CeParams& p, int64_t i) {
  return p.target64 ? static_cast<const int64_t*>(p.target)[i * p.target_stride]
                    : int64_t(static_cast<const int32_t*>(p.target)[i * p.target_stride]);
}

// z = softcap * tanh(x / softcap) when kSoftcap.
template <bool kSoftcap>
__device__ __forceinline__ float ce_cap(float x, float softcap, float inv_softcap) {
  if constexpr (kSoftcap) return softcap * tanhf(x * inv_softcap);
  (void)softcap, (void)inv_softcap;
  return x;
}

// Combines (m, s) pairs of sums of 2^(u - m): the larger max wins and the other sum is rescaled.
__device__ __forceinline__ void ms_combine(float& m, float& s, float m2, float s2) {
  const float mn = fmaxf(m, m2);
  if (mn == -INFINITY) return;  // both empty
  s = s * ex2(m - mn) + s2 * ex2(m2 - mn);
  m = mn;
}

}  // namespace kernelforge
