// Fused linear cross-entropy, the bias gradient of one chunk: acc[j] += sum_i dlogits[i, j] over the
// chunk's rows, in float32 (acc holds the running sum over the chunks). One thread per column, so a
// warp reads 32 consecutive elements of a row (coalesced) and the rows are summed in order: no atomics,
// deterministic. Traffic: the chunk's [rows, V] gradient once, acc read and written once.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "common/launch.cuh"
#include "common/vec.cuh"

namespace kernelforge {

constexpr int kFlceColumnThreads = 256;

template <typename T>
__global__ void __launch_bounds__(kFlceColumnThreads)
    flce_column_sum(const T* dlogits, const int64_t ld, const int64_t rows, const int64_t cols, float* acc) {
  pdl_wait();
  const int64_t j = int64_t(blockIdx.x) * kFlceColumnThreads + threadIdx.x;
  if (j >= cols) return;
  float sum = 0.f;
#pragma unroll 8
  for (int64_t i = 0; i < rows; ++i) sum += to_float(dlogits[i * ld + j]);  // 8 loads in flight per thread
  acc[j] += sum;
}

}  // namespace kernelforge
