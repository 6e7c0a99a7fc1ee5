// Edge-weight gradient of gather_scatter: dw[e] = T(sum_f x[src[e], f] * dout[dst[e], f] * m(e, f)),
// m = 1 (sum), 1 / deg(dst[e]) (mean), [argmax[dst[e], f] == e] (max).
// Minimum traffic: two rows per edge plus the indices: E * (2 F sizeof(T) + 2 sizeof(I) + sizeof(T));
// 20M x 128 bf16 -> 10.6 GB, ~3.5 ms at 3.0 TB/s (most dout rows come from L2: N * F * 2 = 256 MB
// is larger than L2, so the floor is the x rows, 5.1 GB).
// A group of tx threads (a power of two <= 32, inside one warp) per edge strides over the features
// with one vector each, then adds its lanes up with a fixed butterfly of shuffles: deterministic.
#pragma once

#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "common/launch.cuh"
#include "common/vec.cuh"
#include "graph/graph_plan.h"
#include "graph/kernels/common.cuh"

namespace kernelforge {

template <typename T, typename I, int kVec, bool kMax>
__global__ void __launch_bounds__(kGraphThreads) edge_dot(const GraphParams p) {
  if constexpr (!arch_supports<T>()) {
    __trap();
  } else {
    using namespace graph_detail;
    using V = Vec<T, kVec>;
    pdl_wait();
    const int64_t e = int64_t(blockIdx.x) * blockDim.y + threadIdx.y;
    const bool live = e < p.nnz;  // every lane reaches the shuffles below
    float acc = 0.f;
    if (live) {
      const int64_t s = static_cast<const I*>(p.src)[e], d = static_cast<const I*>(p.col)[e];
      if (s < 0 || s >= p.x_rows || d < 0 || d >= p.nseg) {
        acc = NAN;
      } else {
        const T* xr = static_cast<const T*>(p.x) + s * p.x_stride;
        const T* gr = static_cast<const T*>(p.g) + d * p.g_stride;
        for (int64_t f0 = int64_t(threadIdx.x) * kVec; f0 < p.features; f0 += int64_t(blockDim.x) * kVec) {
          const V a = load_vec<T, kVec>(xr + f0), b = load_vec<T, kVec>(gr + f0);
          int32_t m[kVec];
          if constexpr (kMax) load_words<kVec>(p.mask_arg + d * p.features + f0, m);
#pragma unroll
          for (int j = 0; j < kVec; ++j) {
            const float t = a.get(j) * b.get(j);
            acc += kMax ? (m[j] == int32_t(e) ? t : 0.f) : t;
          }
        }
        if (p.mean) {
          const I* rowptr = static_cast<const I*>(p.rowptr);
          acc /= float(int64_t(rowptr[d + 1]) - int64_t(rowptr[d]));
        }
      }
    }
    for (int off = int(blockDim.x) / 2; off > 0; off >>= 1)
      acc += __shfl_xor_sync(0xffffffffu, acc, off, int(blockDim.x));
    if (live && threadIdx.x == 0) static_cast<T*>(p.out)[e] = from_float<T>(acc);
  }
}

}  // namespace kernelforge
