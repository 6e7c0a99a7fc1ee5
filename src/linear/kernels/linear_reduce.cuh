// Skinny linear, split-K reduction: y[m, n] = sum over the splits of ws[s, m, n] (+ bias[n]),
// rounded once to T. One thread per output element, consecutive threads on consecutive n (coalesced
// reads of each split's row). Bytes: splits * M * N * 4 read (from L2: written just before), M * N
// written.
#pragma once

#include <cstdint>

#include "attention/kernels/elementwise.cuh"
#include "common/launch.cuh"
#include "linear/linear_problem.h"

namespace kernelforge {
namespace skinny {

constexpr int kReduceThreads = 256;

template <typename T>
__global__ void __launch_bounds__(kReduceThreads) linear_reduce_kernel(LinearParams p, int splits, const float* ws) {
  if constexpr (!arch_supports<T>()) {
    __trap();
  } else {
    const int64_t i = int64_t(blockIdx.x) * kReduceThreads + threadIdx.x;
    const int64_t mn = int64_t(p.M) * p.N;
    pdl_wait();
    if (i >= mn) return;
    const int64_t m = i / p.N, n = i % p.N;
    float v = p.bias != nullptr ? to_float(static_cast<const T*>(p.bias)[n]) : 0.0f;
    for (int s = 0; s < splits; ++s) v += ws[s * mn + i];
    const uint32_t pk = pack2<T>(v, 0.0f);
    static_cast<uint16_t*>(p.y)[m * p.ldy + n] = uint16_t(pk & 0xffffu);
  }
}

}  // namespace skinny
}  // namespace kernelforge
