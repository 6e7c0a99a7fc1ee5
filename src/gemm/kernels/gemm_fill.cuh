// The K = 0 GEMM: no products, so pre = bias (or 0); out = act(pre), aux = pre, a_sum = 0. cuBLASLt
// takes no empty reduction, and the result is still defined. One thread per output element, grid-stride.
#pragma once

#include <cstdint>

#include "activation/kernels/functions.cuh"
#include "common/launch.cuh"
#include "common/vec.cuh"
#include "gemm/gemm_problem.h"

namespace kernelforge {

// act(x) with cuBLASLt's definitions: ReLU, and GELU in the tanh form (the activation family's).
__device__ __forceinline__ float gemm_activation(GemmActivation act, float x) {
  if (act == GemmActivation::kRelu) return fmaxf(x, 0.0f);
  if (act == GemmActivation::kGeluTanh) return act_detail::Act<ActFn::kGeluTanh>::fwd(x);
  return x;
}

template <typename T>
__global__ void gemm_fill(GemmParams p, GemmActivation act) {
  pdl_wait();
  const int64_t total = p.M * p.N;
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total; i += stride) {
    const int64_t m = i / p.N, n = i % p.N;
    const float pre = p.bias != nullptr ? to_float(static_cast<const T*>(p.bias)[n]) : 0.0f;
    static_cast<T*>(p.out)[m * p.ldo + n] = from_float<T>(gemm_activation(act, pre));
    if (p.aux != nullptr) static_cast<T*>(p.aux)[i] = from_float<T>(pre);
  }
  if (p.a_sum != nullptr)
    for (int64_t m = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; m < p.M; m += stride)
      static_cast<T*>(p.a_sum)[m] = from_float<T>(0.0f);
}

}  // namespace kernelforge
