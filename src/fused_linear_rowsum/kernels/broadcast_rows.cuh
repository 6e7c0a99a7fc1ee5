// Backward weight and bias gradients: dweight[o, k] = T(g[k]) for every row o, dbias[o] = T(g[K])
// (g = dyᵀ x and g[K] = sum dy, float32 from column_reduce).
// Traffic: writes O * K * sizeof(T) (+ O * sizeof(T)); g (4 (K + 1) bytes) is read once per thread
// from L2. At 4096 x 4096 bf16: 33.6 MB, ~11 us at the H100's 3.0 TB/s.
// Layout: block (32, 8), grid (column tiles of 32 * kVec columns, row groups); each thread rounds its
// vector of g once and stores it (16 bytes; element by element on rows that are not 16-byte
// aligned) into kFlrsBcastRows rows, 8 apart; row groups loop past
// gridDim.y. The threads of column tile 0 with tx == 0 write dbias for their rows.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "common/launch.cuh"
#include "common/vec.cuh"
#include "fused_linear_rowsum/fused_linear_rowsum_plan.h"
#include "fused_linear_rowsum/kernels/row_cols.cuh"

namespace kernelforge {

template <typename T, int kVec>
__global__ void __launch_bounds__(kFlrsBcastTx* kFlrsBcastTy)
    broadcast_rows(const FlrsParams p, const float* __restrict__ g) {
  if constexpr (!arch_supports<T>()) {
    __trap();
  } else {
    pdl_wait();
    using V = Vec<T, kVec>;
    const int n = int(p.k);
    const int c = (blockIdx.x * kFlrsBcastTx + threadIdx.x) * kVec;
    T* dw = static_cast<T*>(p.dw);
    T* db = static_cast<T*>(p.db);
    const bool write_w = dw != nullptr && c < n;
    const bool write_b = db != nullptr && blockIdx.x == 0 && threadIdx.x == 0;
    V v = V::zero();
    if (write_w) {
      float f[kVec];
#pragma unroll
      for (int j = 0; j < kVec; ++j) f[j] = j < n - c ? g[c + j] : 0.f;
      v = V::from(f);
    }
    const T bias = from_float<T>(g[n]);
    constexpr int kGroup = kFlrsBcastTy * kFlrsBcastRows;  // rows per block per step
    for (int64_t r0 = int64_t(blockIdx.y) * kGroup + threadIdx.y; r0 < p.o; r0 += int64_t(gridDim.y) * kGroup) {
#pragma unroll
      for (int u = 0; u < kFlrsBcastRows; ++u) {
        const int64_t r = r0 + int64_t(u) * kFlrsBcastTy;
        if (r >= p.o) break;
        if (write_w) flrs_detail::store_cols<T, kVec>(dw + r * p.dw_stride, c, n, v);
        if (write_b) db[r * p.db_stride] = bias;
      }
    }
  }
}

}  // namespace kernelforge
