// Device helpers shared by the graph kernels: the segment of a position, float32 vectors of the
// partials, the max rule.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace kernelforge {
namespace graph_detail {

// The segment holding position k: the last v in [0, nseg) with rowptr[v] <= k (rowptr
// non-decreasing, rowptr[0] = 0 <= k < rowptr[nseg]); it is non-empty. ~log2(nseg) L2 loads.
template <typename I>
__device__ __forceinline__ int64_t segment_of(const I* rowptr, int64_t nseg, int64_t k) {
  int64_t a = 0, b = nseg - 1;
  while (a < b) {
    const int64_t mid = (a + b + 1) >> 1;
    if (int64_t(rowptr[mid]) <= k)
      a = mid;
    else
      b = mid - 1;
  }
  return a;
}

// The first non-empty segment after v that starts at position k (k < rowptr[nseg]). Never past the
// last segment, even for a rowptr that breaks the invariants (memory safety only: the values are then
// undefined, and the binding's asynchronous assert reports the rowptr).
template <typename I>
__device__ __forceinline__ int64_t next_segment(const I* rowptr, int64_t nseg, int64_t v, int64_t k) {
  if (++v >= nseg) return nseg - 1;
  while (v < nseg - 1 && int64_t(rowptr[v + 1]) <= k) ++v;
  return v;
}

// Whether candidate `val` replaces the running maximum `acc` (arg < 0: nothing taken yet). The first
// maximum wins ties; NaN propagates (the first NaN is kept), as torch's scatter_reduce("amax").
__device__ __forceinline__ bool takes_max(float val, float acc, int32_t arg) {
  return arg < 0 || val > acc || (val != val && acc == acc);
}

// kVec float32 / int32 values at p (16-byte accesses when kVec is a multiple of 4: the partials are
// F-strided with F a multiple of kVec, so 16-byte aligned then).
template <int kVec, typename U>
__device__ __forceinline__ void load_words(const U* p, U (&v)[kVec]) {
  static_assert(sizeof(U) == 4, "32-bit words");
  if constexpr (kVec % 4 == 0) {
#pragma unroll
    for (int j = 0; j < kVec; j += 4) {
      const uint4 w = *reinterpret_cast<const uint4*>(p + j);
      memcpy(&v[j], &w, 16);
    }
  } else {
#pragma unroll
    for (int j = 0; j < kVec; ++j) v[j] = p[j];
  }
}
template <int kVec, typename U>
__device__ __forceinline__ void store_words(U* p, const U (&v)[kVec]) {
  static_assert(sizeof(U) == 4, "32-bit words");
  if constexpr (kVec % 4 == 0) {
#pragma unroll
    for (int j = 0; j < kVec; j += 4) {
      uint4 w;
      memcpy(&w, &v[j], 16);
      *reinterpret_cast<uint4*>(p + j) = w;
    }
  } else {
#pragma unroll
    for (int j = 0; j < kVec; ++j) p[j] = v[j];
  }
}

}  // namespace graph_detail
}  // namespace kernelforge
