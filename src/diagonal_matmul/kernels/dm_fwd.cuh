// diagonal_matmul forward: y[r, c] = T(a[r] · b[r, c]) (a[r % M] when a is broadcast over batches);
// also the backward's db = T(a · dy) when da is not wanted (b = dy, y = db).
// Minimum traffic: read b, write y: 2 · rows · N · sizeof(T) bytes, plus one scale per row;
// rows = 16384, N = 4096 bf16: 268 MB -> 90 us at the H100's ~3.0 TB/s copy rate.
// Layout: block (tx, ty) = tx threads along a row, ty rows; grid (column chunks, row groups), rows
// looped past gridDim.y. A row is a scalar head (the elements before the first vector-aligned
// column, done by the thread of vector slot 0: nonzero only for rows that start off a 16-byte
// boundary), then vectors of kVec elements, the last one possibly partial (element by element).
// Vector slot v of a row covers columns [head + v·kVec, head + (v + 1)·kVec); slot v of thread t at
// column chunk x is v = x·tx·kVecsPerThread + u·tx + t (coalesced for each u). Each thread loads all
// its vectors first, then scales and stores them. Every output element has one writer (in place,
// y == b, is safe); math in float32, one rounding to T; row offsets are 64-bit.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "common/launch.cuh"
#include "common/vec.cuh"
#include "diagonal_matmul/diagonal_matmul_plan.h"
#include "diagonal_matmul/diagonal_matmul_problem.h"
#include "diagonal_matmul/kernels/common.cuh"

namespace kernelforge {

template <typename T, int kVec, int kVecsPerThread>
__global__ void __launch_bounds__(kDmThreads) dm_fwd(const DmParams p) {
  if constexpr (!arch_supports<T>()) {
    __trap();
  } else {
    pdl_wait();  // before the first global access (common/launch.cuh)
    if (p.trigger) pdl_trigger();
    using V = Vec<T, kVec>;
    const int64_t n = p.n;
    const int64_t slot0 = int64_t(blockIdx.x) * blockDim.x * kVecsPerThread + threadIdx.x;
    const int64_t row_step = int64_t(gridDim.y) * blockDim.y;
    for (int64_t r = int64_t(blockIdx.y) * blockDim.y + threadIdx.y; r < p.rows; r += row_step) {
      const T* b = static_cast<const T*>(p.b) + r * p.b_stride;
      T* y = static_cast<T*>(p.y) + r * p.y_stride;
      const float a = to_float(static_cast<const T*>(p.a)[p.a_row(r) * p.a_stride]);
      const int64_t head = dm_detail::row_head<T, kVec>(b, n);
      V vb[kVecsPerThread];
#pragma unroll
      for (int u = 0; u < kVecsPerThread; ++u) {  // all loads first: kVecsPerThread accesses in flight
        const int64_t c = head + (slot0 + int64_t(u) * blockDim.x) * kVec;
        vb[u] = V::zero();
        if (c + kVec <= n) vb[u] = load_vec<T, kVec>(b + c);
      }
#pragma unroll
      for (int u = 0; u < kVecsPerThread; ++u) {
        const int64_t c = head + (slot0 + int64_t(u) * blockDim.x) * kVec;
        if (c + kVec <= n) {
          float out[kVec];
#pragma unroll
          for (int j = 0; j < kVec; ++j) out[j] = a * vb[u].get(j);
          store_vec<T, kVec>(y + c, V::from(out));
        } else if (c < n) {  // the row's last, partial vector
          for (int64_t k = c; k < n; ++k) y[k] = from_float<T>(a * to_float(b[k]));
        }
      }
      if (slot0 == 0)  // the scalar head
        for (int64_t k = 0; k < head; ++k) y[k] = from_float<T>(a * to_float(b[k]));
    }
  }
}

}  // namespace kernelforge
