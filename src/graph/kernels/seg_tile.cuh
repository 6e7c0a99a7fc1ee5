// CSR gather-reduce over position tiles: out[v, f] = R_{k in [rowptr[v], rowptr[v+1])} w[eid(k)] * x[col(k), f]
// (R = sum, sum / deg, or max with argmax; formulas in include/kernelforge/graph.h).
// Minimum traffic: one x row per position, the indices, the output: nnz * (F * sizeof(T) + 2 *
// sizeof(I) + sizeof(T)) + N * F * sizeof(T) (+ N * F * 4 for argmax); 20M positions x 128 bf16
// features, int64 indices: 5.1 GB + 0.4 GB + 0.26 GB -> ~1.9 ms at the H100's 3.0 TB/s.
// Why tiles: positions are cut into tiles of plan.tile_rows, one thread per (tile, feature vector),
// so a segment of 100k positions is spread over 400 tiles instead of serializing one block. A thread
// finds the segment of its tile's first position by binary search, then walks the positions in
// order (kUnroll rows loaded before they are accumulated), accumulating in float32. A segment that
// begins and ends inside the tile is written here, rounded once; the first / last segment of a tile
// that reaches past it leaves a float32 partial in slot 0 (it began before the tile) or slot 1 (it
// goes on after it), which seg_combine adds up in tile order. Fixed order everywhere: results are
// bit-identical run to run. A col value outside [0, X) reads nothing and contributes NaN.
#pragma once

#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "common/launch.cuh"
#include "common/vec.cuh"
#include "graph/graph_plan.h"
#include "graph/kernels/common.cuh"

namespace kernelforge {

// kMasked: the max backward's transposed walk (p.mask_arg); a separate instantiation, so that the
// forward does not hold the mask registers (bf16, 16-byte vectors, sm_90: 64 registers per thread
// instead of 102, so 4 blocks of 256 threads fit an SM instead of 2).
template <typename T, typename I, int kVec, bool kMax, bool kMasked>
__global__ void __launch_bounds__(kGraphThreads) seg_tile(const GraphParams p) {
  if constexpr (!arch_supports<T>()) {
    __trap();
  } else {
    using namespace graph_detail;
    using V = Vec<T, kVec>;
    constexpr int kUnroll = 4;  // rows in flight per thread
    pdl_wait();
    const int64_t tile = int64_t(blockIdx.x) * blockDim.y + threadIdx.y;
    const int64_t f0 = (int64_t(blockIdx.y) * blockDim.x + threadIdx.x) * kVec;
    if (tile >= p.tiles || f0 >= p.features) return;
    const I* rowptr = static_cast<const I*>(p.rowptr);
    const I* col = static_cast<const I*>(p.col);
    const I* eid = static_cast<const I*>(p.eid);
    const T* w = static_cast<const T*>(p.weight);
    const I* srp = static_cast<const I*>(p.scale_rowptr);
    const T* x = static_cast<const T*>(p.x) + f0;
    const int64_t lo = tile * p.tile_rows, hi = min(lo + p.tile_rows, p.nnz);
    int64_t v = segment_of(rowptr, p.nseg, lo);
    int64_t seg_lo = rowptr[v], seg_hi = rowptr[v + 1];
    float acc[kVec];
    int32_t arg[kVec];
#pragma unroll
    for (int j = 0; j < kVec; ++j) acc[j] = 0.f, arg[j] = -1;
    for (int64_t k0 = lo; k0 < hi; k0 += kUnroll) {
      V xv[kUnroll];
      float wk[kUnroll];
      int64_t ek[kUnroll], rk[kUnroll];
      bool ok[kUnroll];
      int32_t m[kMasked ? kUnroll : 1][kVec];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {  // every load of the group first
        const int64_t k = k0 + u;
        xv[u] = V::zero();
        wk[u] = 1.f;
        ek[u] = rk[u] = k;
        ok[u] = false;
        if (k < hi) {
          if (col) rk[u] = int64_t(col[k]);
          if (eid) ek[u] = int64_t(eid[k]);
          ok[u] = rk[u] >= 0 && rk[u] < p.x_rows;
          if (ok[u]) xv[u] = load_vec<T, kVec>(x + rk[u] * p.x_stride);
          if (w) wk[u] = to_float(w[ek[u]]);
          if (srp && ok[u]) wk[u] /= float(int64_t(srp[rk[u] + 1]) - int64_t(srp[rk[u]]));  // mean backward
          if constexpr (kMasked)                                                            // max backward
            if (ok[u]) load_words<kVec>(p.mask_arg + rk[u] * p.features + f0, m[u]);
        }
      }
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const int64_t k = k0 + u;
        if (k >= hi) break;
#pragma unroll
        for (int j = 0; j < kVec; ++j) {
          float t = ok[u] ? xv[u].get(j) * wk[u] : NAN;
          if constexpr (kMasked)
            if (ok[u] && m[u][j] != int32_t(ek[u])) t = 0.f;
          if constexpr (kMax) {
            if (takes_max(t, acc[j], arg[j])) acc[j] = t, arg[j] = int32_t(ek[u]);
          } else {
            acc[j] += t;
          }
        }
        if (k + 1 == seg_hi || k + 1 == hi) {  // the segment's part in this tile is complete
          const bool before = seg_lo<lo, after = seg_hi> hi;
          if (!before && !after) {
            float o[kVec];
            const float deg = float(seg_hi - seg_lo);
#pragma unroll
            for (int j = 0; j < kVec; ++j) o[j] = p.mean ? acc[j] / deg : acc[j];
            store_vec<T, kVec>(static_cast<T*>(p.out) + v * p.out_stride + f0, V::from(o));
            if constexpr (kMax) store_words<kVec>(p.argmax + v * p.features + f0, arg);
          } else {
            const int64_t slot = (tile * 2 + (before ? 0 : 1)) * p.features + f0;
            store_words<kVec>(p.partial + slot, acc);
            if constexpr (kMax) store_words<kVec>(p.partial_arg + slot, arg);
          }
#pragma unroll
          for (int j = 0; j < kVec; ++j) acc[j] = 0.f, arg[j] = -1;
          if (k + 1 < hi) {
            v = next_segment(rowptr, p.nseg, v, k + 1);
            seg_lo = k + 1;
            seg_hi = rowptr[v + 1];
          }
        }
      }
    }
  }
}

}  // namespace kernelforge
