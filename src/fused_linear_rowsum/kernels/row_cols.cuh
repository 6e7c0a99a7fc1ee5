// Row access of the fused_linear_rowsum kernels at any row alignment (device helpers, no kernel).
//
// The column pass and row_dot give thread `lane` of a warp the columns [c, c + kVec) of a row,
// c = (step * 32 + lane) * kVec, and keep one float32 sum per column (column pass) or multiply by
// w_sum[c .. c + kVec) (row_dot, a 16-byte aligned float4 read). A row that starts off a 16-byte
// boundary (any row of a tensor with an odd row stride, e.g. 1023 bf16 = 2046 bytes) still moves in
// 16-byte loads: the warp reads the 16-byte chunks that are aligned in memory and shifts them into
// column position with one warp shuffle per word (load_cols). The columns each thread owns, hence
// the order of every sum, are those of an aligned row: a misaligned row gives the same bits.
//
// Stores (dx, dweight rows) go straight from the thread's columns: one 16-byte store where the row is
// 16-byte aligned, element by element (2- or 4-byte stores, still contiguous across the warp) where
// it is not (store_cols).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "common/vec.cuh"

namespace kernelforge {
namespace flrs_detail {

// Elements [s - a, s - a + kVec) of a row of n elements whose first element sits `a` elements past a
// 16-byte boundary: one aligned 16-byte load when they all lie inside the row, else element by
// element with zeros outside [0, n) (no byte outside the row is read).
template <typename T, int kVec>
__device__ __forceinline__ Vec<T, kVec> load_chunk(const T* row, int64_t s, int a, int64_t n) {
  const int64_t first = s - a;  // row column of the chunk's first element
  if (first >= 0 && first + kVec <= n) return load_vec<T, kVec>(row + first);
  Vec<T, kVec> v = Vec<T, kVec>::zero();
#pragma unroll
  for (int j = 0; j < kVec; ++j)
    if (first + j >= 0 && first + j < n) v.set(j, to_float(row[first + j]));  // exact: a T value
  return v;
}

// 32-bit word i (0..7, a compile-time constant after unrolling) of the 32-byte pair (lo, hi).
template <typename V>
__device__ __forceinline__ unsigned int pair_word(const V& lo, const V& hi, int i) {
  return i < V::kWords ? lo.w[i] : hi.w[i - V::kWords];
}

// The kVec elements that start `b` bytes into the 32-byte pair (lo, hi); b is a multiple of sizeof(T)
// below 16, the same for the whole warp (selects, no local memory).
template <typename T, int kVec>
__device__ __forceinline__ Vec<T, kVec> shift_pair(const Vec<T, kVec>& lo, const Vec<T, kVec>& hi, int b) {
  using V = Vec<T, kVec>;
  const int wo = b >> 2;           // whole words
  const bool half = (b & 3) != 0;  // 2-byte types at an odd element
  V r;
#pragma unroll
  for (int m = 0; m < V::kWords; ++m) {
    unsigned int w0 = pair_word(lo, hi, m), w1 = pair_word(lo, hi, m + 1);
#pragma unroll
    for (int k = 1; k < 4; ++k)
      if (wo == k) w0 = pair_word(lo, hi, m + k), w1 = pair_word(lo, hi, m + k + 1);
    r.w[m] = half ? __funnelshift_r(w0, w1, 16) : w0;
  }
  return r;
}

// Columns [c, c + kVec) of `row` (n elements, zeros past n), c = (step * 32 + lane) * kVec. Called by
// all 32 lanes of the warp together, for the same row and step (lanes with c >= n get zeros).
// Aligned row: one 16-byte load per lane. Row starting `a` elements past a 16-byte boundary: lane l
// loads the aligned chunk holding row columns [c - a, c - a + kVec), takes the next chunk from lane
// l + 1 (lane 31 loads it), and keeps elements a .. a + kVec of the pair.
// kShift false: every row of the tensor is 16-byte aligned (or kVec == 1) and c < n: a plain load,
// called by any lane alone (the launcher picks the instance, so aligned calls keep the registers and
// occupancy of a plain load).
template <typename T, int kVec, bool kShift>
__device__ __forceinline__ Vec<T, kVec> load_cols(const T* row, int c, int n, int lane) {
  using V = Vec<T, kVec>;
  if constexpr (kVec == 1 || !kShift) {
    return load_row_vec<T, kVec>(row, c, n, 0.f);
  } else {
    const int a = int(reinterpret_cast<uintptr_t>(row) % 16 / sizeof(T));
    if (a == 0) return c < n ? load_row_vec<T, kVec>(row, c, n, 0.f) : V::zero();
    const V own = load_chunk<T, kVec>(row, c, a, n);
    V next;
#pragma unroll
    for (int k = 0; k < V::kWords; ++k) next.w[k] = __shfl_down_sync(0xffffffffu, own.w[k], 1);
    if (lane == 31) next = load_chunk<T, kVec>(row, int64_t(c) + kVec, a, n);
    return shift_pair<T, kVec>(own, next, a * int(sizeof(T)));
  }
}

// Stores f[0 .. kVec) (rounded to T once) at columns [c, c + kVec) of `row`, up to n: one 16-byte
// store where the row is 16-byte aligned (c is a multiple of kVec), else element by element.
template <typename T, int kVec>
__device__ __forceinline__ void store_cols(T* row, int c, int n, const Vec<T, kVec>& v) {
  if (kVec == 1 || reinterpret_cast<uintptr_t>(row) % 16 == 0) {
    store_row_vec<T, kVec>(row, c, n, v);
  } else {
#pragma unroll
    for (int j = 0; j < kVec; ++j)
      if (j < n - c) row[c + j] = from_float<T>(v.get(j));  // exact: v's elements are T values
  }
}

}  // namespace flrs_detail
}  // namespace kernelforge
