// a_sum[m] = sum_k a[m, k] alone, for the one case cuBLASLt cannot take it from a GEMM: N = 0 (an empty
// output, but the sum is still asked for). One warp per row, float32 accumulation, rounded once.
#pragma once

#include <cstdint>

#include "common/launch.cuh"
#include "common/vec.cuh"
#include "gemm/gemm_problem.h"

namespace kernelforge {

template <typename T>
__global__ void gemm_row_sum(GemmParams p) {
  pdl_wait();
  const int lane = threadIdx.x % 32;
  const int64_t warps = int64_t(gridDim.x) * (blockDim.x / 32);
  const T* a = static_cast<const T*>(p.a.data);
  for (int64_t m = (blockIdx.x * int64_t(blockDim.x) + threadIdx.x) / 32; m < p.M; m += warps) {
    float sum = 0.0f;
    for (int64_t k = lane; k < p.K; k += 32) sum += to_float(a[p.a.row_major ? m * p.a.ld + k : m + k * p.a.ld]);
    for (int o = 16; o > 0; o /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, o);
    if (lane == 0) static_cast<T*>(p.a_sum)[m] = from_float<T>(sum);
  }
}

}  // namespace kernelforge
