// The group rule of grouped_mm on the device (include/kernelforge/grouped_mm.h): group e owns rows
// [end(e-1), end(e)) with end(e) = clamp(max(offsets[0..e]), 0, T), end(-1) = 0. Warp-cooperative
// walks over the offsets in chunks of 32 with a running maximum; every lane gets the result.
#pragma once

#include <climits>
#include <cstdint>

namespace kernelforge {
namespace gmm_detail {

__device__ __forceinline__ int64_t clamp_end(int v, int64_t t) { return v <= 0 ? 0 : (int64_t(v) < t ? v : t); }

__device__ __forceinline__ int warp_max(int v) {
#pragma unroll
  for (int d = 16; d > 0; d >>= 1) v = max(v, __shfl_xor_sync(0xffffffffu, v, d));
  return v;
}

// end(e) for e = groups - 1: the end of the last group (rows past it belong to no group).
__device__ __forceinline__ int64_t last_end(const int* offsets, int groups, int64_t t, int lane) {
  int m = INT_MIN;
  for (int i = lane; i < groups; i += 32) m = max(m, offsets[i]);
  return clamp_end(warp_max(m), t);
}

// Rows [*lo, *hi) of group e.
__device__ __forceinline__ void group_rows(const int* offsets, int e, int64_t t, int lane, int64_t* lo, int64_t* hi) {
  int m = INT_MIN;
  for (int i = lane; i < e; i += 32) m = max(m, offsets[i]);
  m = warp_max(m);
  *lo = clamp_end(m, t);
  *hi = clamp_end(max(m, offsets[e]), t);
}

// The row tiles of block_m rows, group 0's first, then group 1's, ...: finds tile number `tile`.
// Returns false past the last tile; else its group, first row and the group's end row.
__device__ __forceinline__ bool find_row_tile(const int* offsets, int groups, int64_t t, int block_m, int64_t tile,
                                              int lane, int* e_out, int64_t* row0, int64_t* row_end) {
  int run_max = INT_MIN;     // max of the offsets before this chunk
  int64_t tiles_before = 0;  // tiles of the groups before this chunk
  for (int base = 0; base < groups; base += 32) {
    const int i = base + lane;
    int v = i < groups ? offsets[i] : INT_MIN;
#pragma unroll
    for (int d = 1; d < 32; d <<= 1) {  // inclusive max scan over the lanes
      const int o = __shfl_up_sync(0xffffffffu, v, d);
      if (lane >= d) v = max(v, o);
    }
    v = max(v, run_max);
    const int64_t end = clamp_end(v, t);
    int64_t lo = __shfl_up_sync(0xffffffffu, end, 1);
    if (lane == 0) lo = clamp_end(run_max, t);
    const int64_t n = i < groups ? (end - lo + block_m - 1) / block_m : 0;
    int64_t incl = n;
#pragma unroll
    for (int d = 1; d < 32; d <<= 1) {  // inclusive sum scan
      const int64_t o = __shfl_up_sync(0xffffffffu, incl, d);
      if (lane >= d) incl += o;
    }
    const int64_t first = tiles_before + incl - n;
    const unsigned hit = __ballot_sync(0xffffffffu, n > 0 && tile >= first && tile < first + n);
    if (hit) {
      const int src = __ffs(hit) - 1;
      *e_out = base + src;
      *row0 = __shfl_sync(0xffffffffu, lo, src) + (tile - __shfl_sync(0xffffffffu, first, src)) * block_m;
      *row_end = __shfl_sync(0xffffffffu, end, src);
      return true;
    }
    run_max = __shfl_sync(0xffffffffu, v, 31);
    tiles_before += __shfl_sync(0xffffffffu, incl, 31);
  }
  return false;
}

// Zeroes rows [last_end, T) of out [T, N] (rows of no group): a grid-stride loop over their elements,
// shared by every thread of the grid. `warp_end`: last_end() computed by the calling warp.
template <typename T>
__device__ __forceinline__ void fill_tail(T* out, int64_t out_ld, int64_t t, int64_t n, int64_t end) {
  const int64_t count = (t - end) * n;
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < count; i += stride) {
    const int64_t r = end + i / n, c = i % n;
    out[r * out_ld + c] = T(0.0f);
  }
}

}  // namespace gmm_detail
}  // namespace kernelforge
