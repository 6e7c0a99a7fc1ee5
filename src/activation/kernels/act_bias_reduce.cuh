// GELU backward with the bias gradient, chunk reduction: dbias[c] = Tb(sum_{k < chunks} partial[k, c]),
// the chunks added in a fixed order (lane ty adds chunks ty, ty + 8, ...; then the 8 lanes in order
// 0..7): bit-identical run to run. chunks = 0 (no rows) writes dbias = 0.
// Traffic: chunks * n * 4 bytes read (at most 128 x 16 KB = 2 MB at n = 4096, from L2), n elements
// written: a few microseconds next to the column pass (act_bias_grad.cuh).
// Layout: block (kActBiasTx = 32 columns, kActBiasTy = 8 chunk lanes), at most 16 partials per thread.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "activation/activation_plan.h"
#include "common/launch.cuh"
#include "common/vec.cuh"

namespace kernelforge {

// T (the gradient's dtype) is not used by the math: it gives each dtype's file (activation_<dtype>.cu)
// its own instances. OutT is dbias's dtype.
template <typename T, typename OutT>
__global__ void __launch_bounds__(kActBiasTx* kActBiasTy)
    act_bias_reduce(const float* __restrict__ partials, const int chunks, const int64_t n, OutT* __restrict__ dbias,
                    const int64_t dbias_stride) {
  if constexpr (!arch_supports<T>() || !arch_supports<OutT>()) {
    __trap();
  } else {
    pdl_trigger();  // a grid of n / 32 small blocks: the next kernel may take the free slots and wait
    pdl_wait();     // the column pass's partials are complete and visible
    __shared__ float lane[kActBiasTy][kActBiasTx];
    const int64_t col = int64_t(blockIdx.x) * kActBiasTx + threadIdx.x;
    float sum = 0.f;
    if (col < n)
      for (int k = threadIdx.y; k < chunks; k += kActBiasTy) sum += partials[int64_t(k) * n + col];
    lane[threadIdx.y][threadIdx.x] = sum;
    __syncthreads();
    if (threadIdx.y != 0 || col >= n) return;
    float total = 0.f;
#pragma unroll
    for (int y = 0; y < kActBiasTy; ++y) total += lane[y][threadIdx.x];
    dbias[col * dbias_stride] = from_float<OutT>(total);
  }
}

}  // namespace kernelforge
