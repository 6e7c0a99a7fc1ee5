// Device helpers shared by the diagonal_matmul kernels.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace kernelforge {
namespace dm_detail {

// Elements before the first (kVec · sizeof(T))-byte boundary at or after p, at most n: the scalar
// head of a row whose vectors start after it. All row tensors of a call share their misalignment at
// the plan's width (make_dm_problem), so the head of one row tensor is the head of all of them.
// 0 for one-element vectors and for aligned rows.
template <typename T, int kVec>
__device__ __forceinline__ int64_t row_head(const T* p, int64_t n) {
  constexpr uintptr_t kBytes = sizeof(T) * kVec;
  const int64_t hd = int64_t(((kBytes - reinterpret_cast<uintptr_t>(p) % kBytes) % kBytes) / sizeof(T));
  return n < hd ? n : hd;
}

}  // namespace dm_detail
}  // namespace kernelforge
