// Grouped AdaLN parameter gradients (after the backward of AdaLN with one scale/shift row per group).
// Traffic: read A, D [G, N] float32, write dscale, dshift [G, N].
// Why it exists: dscale_g and dshift_g combine the two per-group column sums with weight and bias.
#pragma once

#include "norm/kernels/common.cuh"

namespace kernelforge {
namespace norm_detail {

// Grouped AdaLN: dshift_g = D_g, dscale_g = w·A_g + b·D_g (elementwise over [G, N]; A, D rows have
// stride ld).
template <typename T>
__global__ void ada_group_grads(const float* __restrict__ a, const float* __restrict__ d, int64_t n, int64_t ld,
                                int64_t total, const T* __restrict__ w, const T* __restrict__ bias,
                                T* __restrict__ dscale, T* __restrict__ dshift) {
  if constexpr (!arch_supports<T>()) {
    __trap();
  } else {
    pdl_wait();
    for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < total; i += int64_t(gridDim.x) * blockDim.x) {
      const int64_t g = i / n, c = i - g * n, k = g * ld + c;
      const float wc = w ? to_float(w[c]) : 1.f, bc = bias ? to_float(bias[c]) : 0.f;
      if (dscale) dscale[i] = from_float<T>(wc * a[k] + bc * d[k]);
      if (dshift) dshift[i] = from_float<T>(d[k]);
    }
  }
}

}  // namespace norm_detail
}  // namespace kernelforge
