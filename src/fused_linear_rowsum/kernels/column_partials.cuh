// Column pass: partial[c, k] = sum_{r in chunk c} s_r * A[r, k] for k < K, and
// partial[c, K] = sum_{r in chunk c} v_r; optionally D[r, k] = T(s_r * w_sum[k]).
//   forward  (kBwd false): A = weight [O, K], s_r = 1, v_r = bias[r] (0 without a bias): column sums of W
//   backward (kBwd true):  A = x [T, K], s_r = v_r = dy[r], D = dx: g = dyᵀ x and sum dy, dx in the same pass
// Traffic: reads A once (rows * K * sizeof(T)), writes chunks * (K + 1) float32 partials (at most 128
// rows: under 2 % of a 2-byte A of >= 32 rows per chunk, and L2-resident for the reduction); the
// backward also reads dy and writes dx (T * K * sizeof(T)). At 16384 x 4096 bf16 the backward pass
// moves 268 MB: ~90 us at the H100's 3.0 TB/s copy rate.
// Layout: block (32, 8), grid (column tiles of 32 * kVec columns, row chunks). Warp row ty takes the
// chunk's rows ty, ty + 8, ...; each thread keeps kVec float32 column sums and loads kRows rows'
// vectors before adding them (kRows = plan.col_rows: kRows x 16 bytes in flight per thread; 16-byte
// loads at any row alignment, dx stores 16 bytes wide on 16-byte aligned rows: row_cols.cuh). The 8
// warp rows are added in shared memory in a fixed order, and the chunks later by column_reduce in a
// fixed order: no atomics, the result is bit-identical run to run. Math in float32; dx rounded once.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "common/launch.cuh"
#include "common/vec.cuh"
#include "fused_linear_rowsum/fused_linear_rowsum_plan.h"
#include "fused_linear_rowsum/kernels/row_cols.cuh"

namespace kernelforge {

template <typename T>
__device__ __forceinline__ float flrs_elem(const void* base, int64_t i) {
  return to_float(static_cast<const T*>(base)[i]);
}

// The chunk rows r_begin + ty, + kFlrsColTy, ... of this thread's columns [c, c + kVec): adds s_r *
// A[r, c ..] to acc (kPartials) and writes the dx row (kBwd with dx). kShift: a warp-uniform loop
// (load_cols exchanges across lanes), lanes past n load zeros and store nothing.
template <typename T, int kVec, bool kBwd, bool kPartials, int kRows, bool kShift>
__device__ __forceinline__ void flrs_column_rows(const FlrsParams& p, const T* a, int64_t a_stride, int64_t r_begin,
                                                 int64_t r_end, int c, const float (&ws)[kVec], float (&acc)[kVec]) {
  using V = Vec<T, kVec>;
  const int n = int(p.k);
  const int tx = threadIdx.x, ty = threadIdx.y;
  T* dx = kBwd ? static_cast<T*>(p.dx) : nullptr;
  if (!kShift && c >= n) return;  // (the shifted loads need every lane of the warp)
  constexpr int kStep = kFlrsColTy * kRows;
  for (int64_t r0 = r_begin + ty; r0 < r_end; r0 += kStep) {
    V v[kRows];
    float s[kRows];
#pragma unroll
    for (int u = 0; u < kRows; ++u) {  // all loads first
      const int64_t r = r0 + int64_t(u) * kFlrsColTy;
      v[u] = V::zero();
      s[u] = 0.f;
      if (r < r_end) {
        if (kPartials) v[u] = flrs_detail::load_cols<T, kVec, kShift>(a + r * a_stride, c, n, tx);
        s[u] = kBwd ? flrs_elem<T>(p.dy, r * p.dy_stride) : 1.f;
      }
    }
#pragma unroll
    for (int u = 0; u < kRows; ++u) {
      const int64_t r = r0 + int64_t(u) * kFlrsColTy;
      if constexpr (kPartials) {
#pragma unroll
        for (int j = 0; j < kVec; ++j) acc[j] = fmaf(s[u], v[u].get(j), acc[j]);
      }
      if (kBwd && dx != nullptr && r < r_end && c < n) {
        float out[kVec];
#pragma unroll
        for (int j = 0; j < kVec; ++j) out[j] = s[u] * ws[j];
        flrs_detail::store_cols<T, kVec>(dx + r * p.dx_stride, c, n, V::from(out));
      }
    }
  }
}

// kPartials false: only dx is written (the backward without dweight and dbias). kShift: A's rows may
// start off a 16-byte boundary (shifted loads, row_cols.cuh); chosen by the launcher from A's base
// and row stride, so aligned calls keep the plain kernel's registers.
template <typename T, int kVec, bool kBwd, bool kPartials, int kRows, bool kShift>
__global__ void __launch_bounds__(kFlrsColTx* kFlrsColTy)
    column_partials(const FlrsParams p, const int64_t chunk_rows, float* __restrict__ partials) {
  if constexpr (!arch_supports<T>()) {
    __trap();
  } else {
    pdl_wait();  // before the first global access (common/launch.cuh)
    // column_reduce (and through its own early trigger the last kernel) may launch now: they are
    // dispatched only once every block of this grid has run this line, so they never take the place
    // of a block of this grid; they fill the slots of its finished blocks and wait there.
    pdl_trigger();
    using V = Vec<T, kVec>;
    constexpr int kTile = kFlrsColTx * kVec;
    const int n = int(p.k);
    const int64_t rows = kBwd ? p.tokens : p.o;
    const T* a = static_cast<const T*>(kBwd ? p.x : p.w);
    const int64_t a_stride = kBwd ? p.x_stride : p.w_stride;
    const int tx = threadIdx.x, ty = threadIdx.y;
    const int c = blockIdx.x * kTile + tx * kVec;  // this thread's first column
    const int64_t r_begin = int64_t(blockIdx.y) * chunk_rows;
    const int64_t r_end = r_begin + chunk_rows < rows ? r_begin + chunk_rows : rows;

    // the dx row: dy[r] * w_sum[c .. c + kVec)
    float ws[kVec];
    T* dx = kBwd ? static_cast<T*>(p.dx) : nullptr;
    if (kBwd && dx != nullptr) {
#pragma unroll
      for (int j = 0; j < kVec; ++j) ws[j] = c + j < n ? p.w_sum[c + j] : 0.f;
    }

    float acc[kVec];
#pragma unroll
    for (int j = 0; j < kVec; ++j) acc[j] = 0.f;
    flrs_column_rows<T, kVec, kBwd, kPartials, kRows, kShift>(p, a, a_stride, r_begin, r_end, c, ws, acc);
    if constexpr (kPartials) {
      // The 8 warp rows' sums, added in order 0..7 by one thread per column.
      __shared__ float part[kFlrsColTy][kTile];
      __shared__ float vsum[kFlrsColTy];
#pragma unroll
      for (int j = 0; j < kVec; ++j) part[ty][tx * kVec + j] = acc[j];
      // the extra column: sum of v_r over the chunk, by the tiles of column 0
      float vs = 0.f;
      if (blockIdx.x == 0) {
        const void* vp = kBwd ? p.dy : p.bias;
        const int64_t vstride = kBwd ? p.dy_stride : p.bias_stride;
        if (vp != nullptr)
          for (int64_t r = r_begin + ty * kFlrsColTx + tx; r < r_end; r += kFlrsColTx * kFlrsColTy)
            vs += flrs_elem<T>(vp, r * vstride);
#pragma unroll
        for (int off = 16; off > 0; off >>= 1) vs += __shfl_xor_sync(0xffffffffu, vs, off);
        if (tx == 0) vsum[ty] = vs;
      }
      __syncthreads();
      float* out = partials + int64_t(blockIdx.y) * (p.k + 1);
      for (int i = ty * kFlrsColTx + tx; i < kTile; i += kFlrsColTx * kFlrsColTy) {
        const int col = blockIdx.x * kTile + i;
        if (col >= n) break;
        float sum = 0.f;
#pragma unroll
        for (int y = 0; y < kFlrsColTy; ++y) sum += part[y][i];
        out[col] = sum;
      }
      if (blockIdx.x == 0 && tx == 0 && ty == 0) {
        float sum = 0.f;
#pragma unroll
        for (int y = 0; y < kFlrsColTy; ++y) sum += vsum[y];
        out[n] = sum;
      }
    }
  }
}

}  // namespace kernelforge
