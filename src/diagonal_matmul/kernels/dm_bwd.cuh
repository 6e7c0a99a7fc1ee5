// diagonal_matmul backward, one fused pass over the rows of dy and b:
//   db[r, c] = T(a[r] · dy[r, c])                      (kDb; skipped when db is not wanted)
//   da[r]    = T(Σ_c dy[r, c] · b[r, c])               per-row a, or
//   s[r]     = Σ_c dy[r, c] · b[r, c]  (float32)       broadcast a: row sums for dm_reduce
// Minimum traffic: read dy, b, write db: 3 · rows · N · sizeof(T) bytes (2 without db), plus a and
// da; rows = 16384, N = 4096 bf16: 403 MB -> 134 us at ~3.0 TB/s.
// Layout: a team of tx threads per row (ty teams per block, the block a multiple of 32 threads),
// a 1-D grid of row groups looped over the rows. A team loops over its row kVecsPerThread vectors
// per thread per pass (dy and b loaded first, then used), after the scalar head (thread 0) as in
// dm_fwd; each thread keeps a float32 partial dot product over its columns, in column order. The
// team then sums its partials by a butterfly within the warp (xor offsets < tx keep teams smaller
// than a warp apart) and, for teams of several warps, through shared memory in warp order. So the
// summation order is fixed by the plan: da is bit-identical run to run, with no atomics.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "common/launch.cuh"
#include "common/vec.cuh"
#include "diagonal_matmul/diagonal_matmul_plan.h"
#include "diagonal_matmul/diagonal_matmul_problem.h"
#include "diagonal_matmul/kernels/common.cuh"

namespace kernelforge {

template <typename T, int kVec, int kVecsPerThread, bool kDb>
__global__ void __launch_bounds__(kDmThreads) dm_bwd(const DmParams p) {
  if constexpr (!arch_supports<T>()) {
    __trap();
  } else {
    // warp sums of the teams wider than a warp; double-buffered: one barrier per row group
    __shared__ float warp_sums[2][kDmThreads / 32];
    pdl_wait();  // before the first global access (common/launch.cuh)
    if (p.trigger) pdl_trigger();
    using V = Vec<T, kVec>;
    const int tx = int(blockDim.x), t = int(threadIdx.x);
    const int64_t n = p.n;
    const int64_t pass = int64_t(tx) * kVec;  // columns between one thread's vectors
    int buf = 0;
    // Every thread runs every row group (whether its row exists or not): the barrier below is
    // reached by the whole block.
    for (int64_t g = blockIdx.x; g * blockDim.y < p.rows; g += gridDim.x, buf ^= 1) {
      const int64_t r = g * blockDim.y + threadIdx.y;
      float dot = 0.f;
      float a = 0.f;
      if (r < p.rows) {
        const T* dy = static_cast<const T*>(p.dy) + r * p.dy_stride;
        const T* b = static_cast<const T*>(p.b) + r * p.b_stride;
        T* db = kDb ? static_cast<T*>(p.db) + r * p.db_stride : nullptr;
        if constexpr (kDb) a = to_float(static_cast<const T*>(p.a)[p.a_row(r) * p.a_stride]);
        const int64_t head = dm_detail::row_head<T, kVec>(dy, n);
        if (t == 0) {  // the scalar head
          for (int64_t k = 0; k < head; ++k) {
            const float gk = to_float(dy[k]);
            dot = fmaf(gk, to_float(b[k]), dot);
            if constexpr (kDb) db[k] = from_float<T>(a * gk);
          }
        }
        for (int64_t c0 = head + int64_t(t) * kVec; c0 < n; c0 += pass * kVecsPerThread) {
          V vg[kVecsPerThread], vb[kVecsPerThread];
#pragma unroll
          for (int u = 0; u < kVecsPerThread; ++u) {  // all loads first: 2 x kVecsPerThread in flight
            const int64_t c = c0 + u * pass;
            vg[u] = V::zero();
            vb[u] = V::zero();
            if (c + kVec <= n) {
              vg[u] = load_vec<T, kVec>(dy + c);
              vb[u] = load_vec<T, kVec>(b + c);
            }
          }
#pragma unroll
          for (int u = 0; u < kVecsPerThread; ++u) {
            const int64_t c = c0 + u * pass;
            if (c + kVec <= n) {
              float out[kVec];
#pragma unroll
              for (int j = 0; j < kVec; ++j) {
                const float gj = vg[u].get(j);
                dot = fmaf(gj, vb[u].get(j), dot);
                out[j] = a * gj;
              }
              if constexpr (kDb) store_vec<T, kVec>(db + c, V::from(out));
            } else if (c < n) {  // the row's last, partial vector
              for (int64_t k = c; k < n; ++k) {
                const float gk = to_float(dy[k]);
                dot = fmaf(gk, to_float(b[k]), dot);
                if constexpr (kDb) db[k] = from_float<T>(a * gk);
              }
            }
          }
        }
      }
      // The team's sum: butterfly within the warp (teams of tx < 32 lanes stay apart), then the warps
      // of a wider team in order.
      const int lanes = tx < 32 ? tx : 32;
      for (int off = lanes / 2; off > 0; off >>= 1) dot += __shfl_xor_sync(0xffffffffu, dot, off);
      if (tx > 32) {
        const int warp = int(threadIdx.y * blockDim.x + threadIdx.x) >> 5, team_warps = tx >> 5;
        if ((threadIdx.x & 31) == 0) warp_sums[buf][warp] = dot;
        __syncthreads();
        const int first = int(threadIdx.y) * team_warps;
        dot = 0.f;
        for (int w = 0; w < team_warps; ++w) dot += warp_sums[buf][first + w];
      }
      if (t == 0 && r < p.rows) {
        if (p.da_rows != nullptr)
          p.da_rows[r] = dot;
        else
          static_cast<T*>(p.da)[r * p.da_stride] = from_float<T>(dot);
      }
    }
  }
}

}  // namespace kernelforge
