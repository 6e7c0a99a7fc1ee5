// Backward of a segment reduction: for every position k of segment v
//   sum dx[k, f] = dout[v, f];  mean dout[v, f] / deg(v);  max dout[v, f] if argmax[v, f] == k, else 0.
// Minimum traffic: write dx (nnz * F * sizeof(T)), read dout once per segment (N * F * sizeof(T),
// + N * F * 4 argmax for max) and rowptr: 20M x 128 bf16 -> 5.1 GB + 0.26 GB, ~1.8 ms at 3.0 TB/s.
// Same tiling as seg_tile: one thread per (tile of positions, feature vector); it finds the segment
// of its first position by binary search and keeps that segment's dout vector in registers while it
// writes the segment's rows. Every output element has one writer: no reduction, no atomics.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "common/launch.cuh"
#include "common/vec.cuh"
#include "graph/graph_plan.h"
#include "graph/kernels/common.cuh"

namespace kernelforge {

template <typename T, typename I, int kVec, bool kMax>
__global__ void __launch_bounds__(kGraphThreads) seg_expand(const GraphParams p) {
  if constexpr (!arch_supports<T>()) {
    __trap();
  } else {
    using namespace graph_detail;
    using V = Vec<T, kVec>;
    pdl_wait();
    const int64_t tile = int64_t(blockIdx.x) * blockDim.y + threadIdx.y;
    const int64_t f0 = (int64_t(blockIdx.y) * blockDim.x + threadIdx.x) * kVec;
    if (tile >= p.tiles || f0 >= p.features) return;
    const I* rowptr = static_cast<const I*>(p.rowptr);
    const T* dout = static_cast<const T*>(p.x) + f0;
    T* dx = static_cast<T*>(p.out) + f0;
    const int64_t lo = tile * p.tile_rows, hi = min(lo + p.tile_rows, p.nnz);
    int64_t v = segment_of(rowptr, p.nseg, lo);
    int64_t seg_hi = rowptr[v + 1];
    float g[kVec];
    int32_t m[kVec];
    auto load_segment = [&]() {
      const V d = load_vec<T, kVec>(dout + v * p.x_stride);
      const float deg = float(seg_hi - int64_t(rowptr[v]));
#pragma unroll
      for (int j = 0; j < kVec; ++j) g[j] = p.mean ? d.get(j) / deg : d.get(j);
      if constexpr (kMax) load_words<kVec>(p.mask_arg + v * p.features + f0, m);
    };
    load_segment();
    for (int64_t k = lo; k < hi; ++k) {
      if (k == seg_hi) {
        v = next_segment(rowptr, p.nseg, v, k);
        seg_hi = rowptr[v + 1];
        load_segment();
      }
      float o[kVec];
#pragma unroll
      for (int j = 0; j < kVec; ++j) o[j] = kMax ? (m[j] == int32_t(k) ? g[j] : 0.f) : g[j];
      store_vec<T, kVec>(dx + k * p.out_stride, V::from(o));
    }
  }
}

}  // namespace kernelforge
