// Host alignment facts the planners read off the pointers and row strides of a call.
#pragma once

#include <cstdint>

namespace kernelforge {

// ptr is `bytes`-aligned and so is every row after it (row stride `stride_elems` of `elem` bytes).
inline bool aligned_to(const void* ptr, int64_t stride_elems, int64_t elem, int64_t bytes) {
  return reinterpret_cast<uintptr_t>(ptr) % uintptr_t(bytes) == 0 && (stride_elems * elem) % bytes == 0;
}

// Rows of two tensors share their misalignment, so that one scalar head per row brings both to a
// 16-byte boundary: the base pointers differ by a multiple of 16 bytes, and so do the row strides
// (stride_diff_bytes = their difference in bytes).
inline bool shares_misalignment(const void* a, const void* b, int64_t stride_diff_bytes) {
  const uintptr_t bits =
      (reinterpret_cast<uintptr_t>(a) - reinterpret_cast<uintptr_t>(b)) | static_cast<uintptr_t>(stride_diff_bytes);
  return bits % 16 == 0;
}

}  // namespace kernelforge
