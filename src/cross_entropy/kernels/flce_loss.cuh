// Fused linear cross-entropy, after the last chunk: loss = sum_i row_loss_i / valid (mean; 0 / 0 = NaN
// when every row is ignored, as PyTorch) or sum_i row_loss_i (sum), in float32 by one block in a fixed
// order: deterministic. Traffic: T floats.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "common/launch.cuh"

namespace kernelforge {

constexpr int kFlceLossThreads = 512;

__global__ void __launch_bounds__(kFlceLossThreads)
    flce_loss(const float* row_loss, const int64_t rows, const float* valid, const bool mean, float* loss) {
  pdl_wait();
  float sum = 0.f;
  for (int64_t i = threadIdx.x; i < rows; i += kFlceLossThreads) sum += row_loss[i];
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
  __shared__ float warp_sum[kFlceLossThreads / 32];
  if (threadIdx.x % 32 == 0) warp_sum[threadIdx.x / 32] = sum;
  __syncthreads();
  if (threadIdx.x == 0) {
    float total = 0.f;
    for (int w = 0; w < kFlceLossThreads / 32; ++w) total += warp_sum[w];
    *loss = mean ? total / *valid : total;
  }
}

}  // namespace kernelforge
