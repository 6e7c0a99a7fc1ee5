// Forward rows: y[t] = T(sum_k x[t, k] * w_sum[k] + b_sum), w_sum float32 [K] from column_reduce.
// Traffic: reads x once (T * K * sizeof(T)), writes y (T * sizeof(T)); w_sum (4 K bytes) is re-read
// from L1/L2 by every warp. At 16384 x 4096 bf16: 134 MB of x, ~45 us at the H100's 3.0 TB/s.
// Layout: one warp per kRows rows (kRows = plan.dot_rows; 8 warps per block): lane l takes columns
// (i * 32 + l) * kVec, loads the w_sum vector once for the warp's rows and their kRows x vectors (16
// bytes each, at any row alignment: row_cols.cuh) before using them. Each row's float32 sum is per
// lane in column order, then across lanes by a fixed shuffle tree: bit-identical run to run, and the
// same for a row at any alignment. One rounding to T.
// Launch overlap (sm_90): the kernel is launched while column_reduce runs (column_reduce triggers at
// once). Before waiting for it, each warp asks L2 for the first max(kFlrsPrefetchMinRowBytes,
// kFlrsPrefetchBytes / T) bytes of its rows (at most the row), so the x stream starts during the W
// pass's tail and the reduction. x is an
// input of the call: its producer finished before column_partials passed its own pdl_wait, which
// happened before column_reduce, hence this kernel, could launch. w_sum, b_sum and y only after
// pdl_wait.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "common/launch.cuh"
#include "common/vec.cuh"
#include "fused_linear_rowsum/fused_linear_rowsum_plan.h"
#include "fused_linear_rowsum/kernels/row_cols.cuh"

namespace kernelforge {

// Asks L2 for the 128-byte line holding p (no register, no wait).
__device__ __forceinline__ void flrs_prefetch_l2(const void* p) { asm volatile("prefetch.global.L2 [%0];" ::"l"(p)); }

// w[c .. c + kVec) as float32, 0 past n; w + c is 16-byte aligned when kVec > 1 and the vector lies
// inside n (the plan checks w's base alignment; c is a multiple of kVec).
template <int kVec>
__device__ __forceinline__ void flrs_load_floats(const float* w, int c, int n, float (&f)[kVec]) {
  if (c <= n - kVec) {
    if constexpr (kVec % 4 == 0) {
#pragma unroll
      for (int q = 0; q < kVec / 4; ++q) {
        const float4 v = reinterpret_cast<const float4*>(w + c)[q];
        f[4 * q] = v.x, f[4 * q + 1] = v.y, f[4 * q + 2] = v.z, f[4 * q + 3] = v.w;
      }
    } else {
#pragma unroll
      for (int j = 0; j < kVec; ++j) f[j] = w[c + j];
    }
  } else {
#pragma unroll
    for (int j = 0; j < kVec; ++j) f[j] = j < n - c ? w[c + j] : 0.f;
  }
}

// One step of a lane: columns [c, c + kVec) of the kRows rows, added to acc in column order. kShift:
// called by all 32 lanes together with c = c0 + lane * kVec (load_cols exchanges across lanes).
template <typename T, int kVec, int kRows, bool kShift>
__device__ __forceinline__ void flrs_dot_step(const T* const (&x)[kRows], const float* w_sum, int c, int n, int lane,
                                              float (&acc)[kRows]) {
  Vec<T, kVec> v[kRows];
#pragma unroll
  for (int i = 0; i < kRows; ++i) v[i] = flrs_detail::load_cols<T, kVec, kShift>(x[i], c, n, lane);
  float w[kVec];
  flrs_load_floats<kVec>(w_sum, c, n, w);
#pragma unroll
  for (int i = 0; i < kRows; ++i) {
#pragma unroll
    for (int j = 0; j < kVec; ++j) acc[i] = fmaf(v[i].get(j), w[j], acc[i]);
  }
}

// kShift: x rows may start off a 16-byte boundary (shifted loads, row_cols.cuh); chosen by the
// launcher from x's base and row stride, so aligned calls keep the plain kernel's registers.
template <typename T, int kVec, int kRows, bool kShift>
__global__ void __launch_bounds__(kFlrsDotWarps * 32) row_dot(const FlrsParams p, const float* __restrict__ b_sum) {
  if constexpr (!arch_supports<T>()) {
    __trap();
  } else {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int n = int(p.k);
    const int64_t row0 = (int64_t(blockIdx.x) * kFlrsDotWarps + warp) * kRows;
    if (row0 >= p.tokens) return;
    const T* x[kRows];
#pragma unroll
    for (int i = 0; i < kRows; ++i) {  // rows past T read row0 again and are not written
      const int64_t r = row0 + i < p.tokens ? row0 + i : row0;
      x[i] = static_cast<const T*>(p.x) + r * p.x_stride;
    }
    {  // L2 prefetch of the rows' first bytes (128-byte lines), before the wait
      const int64_t row_bytes = p.k * int64_t(sizeof(T));
      int64_t ahead = kFlrsPrefetchBytes / p.tokens;
      ahead = ahead < kFlrsPrefetchMinRowBytes ? kFlrsPrefetchMinRowBytes : ahead;
      ahead = ahead < row_bytes ? ahead : row_bytes;
#pragma unroll
      for (int i = 0; i < kRows; ++i)
        for (int64_t b = int64_t(lane) * 128; b < ahead; b += 32 * 128)
          flrs_prefetch_l2(reinterpret_cast<const char*>(x[i]) + b);
    }
    pdl_wait();
    float acc[kRows];
#pragma unroll
    for (int i = 0; i < kRows; ++i) acc[i] = 0.f;
    if constexpr (kShift) {  // warp-uniform steps (load_cols exchanges across lanes); a shifted step
                             // holds about twice the registers of a plain one: unrolled 4 / kRows
#pragma unroll(4 / kRows)
      for (int c0 = 0; c0 < n; c0 += 32 * kVec)
        flrs_dot_step<T, kVec, kRows, true>(x, p.w_sum, c0 + lane * kVec, n, lane, acc);
    } else {
#pragma unroll 2
      for (int c = lane * kVec; c < n; c += 32 * kVec)
        flrs_dot_step<T, kVec, kRows, false>(x, p.w_sum, c, n, lane, acc);
    }
#pragma unroll
    for (int i = 0; i < kRows; ++i) {
#pragma unroll
      for (int off = 16; off > 0; off >>= 1) acc[i] += __shfl_xor_sync(0xffffffffu, acc[i], off);
    }
    const float bs = *b_sum;
    T* y = static_cast<T*>(p.y);
#pragma unroll
    for (int i = 0; i < kRows; ++i)
      if (lane == i && row0 + i < p.tokens) y[(row0 + i) * p.y_stride] = from_float<T>(acc[i] + bs);
  }
}

}  // namespace kernelforge
