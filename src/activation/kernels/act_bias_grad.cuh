// GELU backward with the bias gradient, column pass: da[r, c] = T(g[r, c]), g = dy[r, c] * gelu'(a[r, c])
// in float32, and partial[chunk, c] = sum of g[r, c] over the chunk's rows (float32, before rounding).
// Minimum traffic: read a and dy, write da: 3 * M * n * sizeof(T) bytes, plus chunks * n * 4 bytes of
// partials (at most 128 rows of them: 1 MB at n = 4096, against 402 MB at M = 16384 bf16, and
// L2-resident for act_bias_reduce). gelu_backward followed by a column sum of da moves 4 * M * n: the
// sum here reads nothing extra. M = 16384, n = 4096 bf16: 402 MB -> 134 us at 3.0 TB/s.
// Layout: block (kActBiasTx = 32, kActBiasTy = 8), grid (column strips of 32 * kVec columns, row
// chunks). Thread (tx, ty) owns the columns [c, c + kVec) of its strip and the chunk's rows ty, ty + 8,
// ...; it loads kRows rows' vectors of a and dy before using them (2 * kRows loads in flight), writes
// da and adds g to its kVec float32 sums in row order. The 8 row lanes are added in shared memory in
// order 0..7, the chunks later by act_bias_reduce in chunk order: the order of every addition is fixed
// by the sizes (not by kVec, kRows or the device), so every plan gives the same bits, run to run. g is
// computed exactly as act_bwd computes it (same function, same product): da is bit-identical to
// gelu_backward's. A row's last, partial vector is done element by element by its owner.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "activation/activation_plan.h"
#include "activation/activation_problem.h"
#include "activation/kernels/functions.cuh"
#include "common/launch.cuh"
#include "common/vec.cuh"

namespace kernelforge {

template <typename T, ActFn kFn, int kVec, int kRows>
__global__ void __launch_bounds__(kActThreads) act_bias_grad(const ActParams p, const int64_t chunk_rows) {
  if constexpr (!arch_supports<T>()) {
    __trap();
  } else {
    pdl_wait();  // before the first global access (common/launch.cuh)
    // act_bias_reduce may launch now: it is dispatched only once every block of this grid has run this
    // line, so it never takes the place of a block of this grid; its pdl_wait waits for this grid.
    pdl_trigger();
    using V = Vec<T, kVec>;
    constexpr int kTile = kActBiasTx * kVec;  // columns of a strip
    const int64_t n = p.n;
    const int tx = threadIdx.x, ty = threadIdx.y;
    const int64_t c = int64_t(blockIdx.x) * kTile + int64_t(tx) * kVec;  // this thread's first column
    const int64_t r_begin = int64_t(blockIdx.y) * chunk_rows;
    const int64_t r_end = r_begin + chunk_rows < p.rows ? r_begin + chunk_rows : p.rows;
    const T* a = static_cast<const T*>(p.a);
    const T* dy = static_cast<const T*>(p.dy);
    T* da = static_cast<T*>(p.da);

    float acc[kVec];
#pragma unroll
    for (int j = 0; j < kVec; ++j) acc[j] = 0.f;
    if (c < n) {
      const bool full = c + kVec <= n;
      for (int64_t r0 = r_begin + ty; r0 < r_end; r0 += int64_t(kActBiasTy) * kRows) {
        V va[kRows], vg[kRows];
#pragma unroll
        for (int u = 0; u < kRows; ++u) {  // all loads first
          const int64_t r = r0 + int64_t(u) * kActBiasTy;
          va[u] = V::zero();
          vg[u] = V::zero();
          if (full && r < r_end) {
            va[u] = load_vec<T, kVec>(a + r * p.a_stride + c);
            vg[u] = load_vec<T, kVec>(dy + r * p.dy_stride + c);
          }
        }
#pragma unroll
        for (int u = 0; u < kRows; ++u) {
          const int64_t r = r0 + int64_t(u) * kActBiasTy;
          if (r >= r_end) break;
          if (full) {
            float out[kVec];
#pragma unroll
            for (int j = 0; j < kVec; ++j) {
              float f, df;
              act_detail::Act<kFn>::both(va[u].get(j), f, df);
              out[j] = vg[u].get(j) * df;
              acc[j] = __fadd_rn(acc[j], out[j]);  // (never contracted into an FMA with the product)
            }
            store_vec<T, kVec>(da + r * p.da_stride + c, V::from(out));
          } else {  // the row's last, partial vector, element by element
#pragma unroll
            for (int j = 0; j < kVec; ++j) {
              if (c + j >= n) break;
              const int64_t k = c + j;
              float f, df;
              act_detail::Act<kFn>::both(to_float(a[r * p.a_stride + k]), f, df);
              const float g = to_float(dy[r * p.dy_stride + k]) * df;
              da[r * p.da_stride + k] = from_float<T>(g);
              acc[j] = __fadd_rn(acc[j], g);
            }
          }
        }
      }
    }

    // The 8 row lanes' sums of each column, added in order 0..7 by one thread per column.
    __shared__ float part[kActBiasTy][kTile];
#pragma unroll
    for (int j = 0; j < kVec; ++j) part[ty][tx * kVec + j] = acc[j];
    __syncthreads();
    float* out = p.partials + int64_t(blockIdx.y) * n;
    for (int i = ty * kActBiasTx + tx; i < kTile; i += kActBiasTx * kActBiasTy) {
      const int64_t col = int64_t(blockIdx.x) * kTile + i;
      if (col >= n) break;
      float sum = 0.f;
#pragma unroll
      for (int y = 0; y < kActBiasTy; ++y) sum += part[y][i];
      out[col] = sum;
    }
  }
}

}  // namespace kernelforge
