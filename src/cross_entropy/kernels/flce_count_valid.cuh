// Fused linear cross-entropy, before the first chunk: valid = the number of rows whose target is not
// ignore_index, over all T rows (the mean's divisor, which every chunk's in-place gradient needs before
// the loss exists), and one = 1, the loss gradient those gradients are computed for. One block, a fixed
// summation order: deterministic. Traffic: T targets.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "common/launch.cuh"

namespace kernelforge {

constexpr int kFlceCountThreads = 512;

__global__ void __launch_bounds__(kFlceCountThreads)
    flce_count_valid(const void* target, const int64_t stride, const bool target64, const int64_t rows,
                     const int64_t ignore_index, float* valid, float* one) {
  pdl_wait();
  int64_t count = 0;
  for (int64_t i = threadIdx.x; i < rows; i += kFlceCountThreads) {
    const int64_t t = target64 ? static_cast<const int64_t*>(target)[i * stride]
                               : int64_t(static_cast<const int32_t*>(target)[i * stride]);
    count += t != ignore_index;
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) count += __shfl_xor_sync(0xffffffffu, count, o);
  __shared__ int64_t warp_count[kFlceCountThreads / 32];
  if (threadIdx.x % 32 == 0) warp_count[threadIdx.x / 32] = count;
  __syncthreads();
  if (threadIdx.x == 0) {
    int64_t total = 0;
    for (int w = 0; w < kFlceCountThreads / 32; ++w) total += warp_count[w];
    *valid = float(total);
    *one = 1.0f;
  }
}

}  // namespace kernelforge
