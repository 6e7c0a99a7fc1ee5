// Second pass of the gather-reduce: the segments seg_tile did not finish.
//   empty segment:           out[v, :] = 0, argmax[v, :] = -1
//   segment over tiles t0..t1 (t0 < t1): out[v, f] = R(partial[t0].tail, partial[t0+1].head, ..., partial[t1].head)
// Reads rowptr (N + 1 indices) and, per long segment, its tiles' partials (t1 - t0 + 1) * F * 4 bytes:
// small next to the gather (a 100k-position segment of 128 features: 391 partials, 200 KB).
// Why a second kernel: the partials of one segment come from different blocks; combining them in
// tile order after the first kernel completes keeps the sum's order fixed (no atomics).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "common/launch.cuh"
#include "common/vec.cuh"
#include "graph/graph_plan.h"
#include "graph/kernels/common.cuh"

namespace kernelforge {

template <typename T, typename I, int kVec, bool kMax>
__global__ void __launch_bounds__(kGraphThreads) seg_combine(const GraphParams p) {
  if constexpr (!arch_supports<T>()) {
    __trap();
  } else {
    using namespace graph_detail;
    using V = Vec<T, kVec>;
    pdl_wait();  // the partials of seg_tile
    const int64_t v = int64_t(blockIdx.x) * blockDim.y + threadIdx.y;
    const int64_t f0 = (int64_t(blockIdx.y) * blockDim.x + threadIdx.x) * kVec;
    if (v >= p.nseg || f0 >= p.features) return;
    const I* rowptr = static_cast<const I*>(p.rowptr);
    // clamped to [0, nnz]: a rowptr that breaks the invariants never reads past the workspace
    const int64_t hi = min(max(int64_t(rowptr[v + 1]), int64_t(0)), p.nnz);
    const int64_t lo = min(max(int64_t(rowptr[v]), int64_t(0)), hi);
    T* out = static_cast<T*>(p.out) + v * p.out_stride + f0;
    float acc[kVec];
    int32_t arg[kVec];
    if (hi <= lo) {
#pragma unroll
      for (int j = 0; j < kVec; ++j) acc[j] = 0.f, arg[j] = -1;
      store_vec<T, kVec>(out, V::from(acc));
      if constexpr (kMax) store_words<kVec>(p.argmax + v * p.features + f0, arg);
      return;
    }
    const int64_t t0 = lo / p.tile_rows, t1 = (hi - 1) / p.tile_rows;
    if (t0 == t1) return;  // finished by seg_tile
    load_words<kVec>(p.partial + (t0 * 2 + 1) * p.features + f0, acc);
    if constexpr (kMax) load_words<kVec>(p.partial_arg + (t0 * 2 + 1) * p.features + f0, arg);
#pragma unroll 4
    for (int64_t t = t0 + 1; t <= t1; ++t) {
      float q[kVec];
      load_words<kVec>(p.partial + t * 2 * p.features + f0, q);
      if constexpr (kMax) {
        int32_t a[kVec];
        load_words<kVec>(p.partial_arg + t * 2 * p.features + f0, a);
#pragma unroll
        for (int j = 0; j < kVec; ++j)
          if (takes_max(q[j], acc[j], arg[j])) acc[j] = q[j], arg[j] = a[j];
      } else {
#pragma unroll
        for (int j = 0; j < kVec; ++j) acc[j] += q[j];
      }
    }
    const float deg = float(hi - lo);
#pragma unroll
    for (int j = 0; j < kVec; ++j) acc[j] = p.mean ? acc[j] / deg : acc[j];
    store_vec<T, kVec>(out, V::from(acc));
    if constexpr (kMax) store_words<kVec>(p.argmax + v * p.features + f0, arg);
  }
}

}  // namespace kernelforge
