// prefetch_l2's kernel (contract: include/kernelforge/decode.h): thread i asks the L2 for bytes
// [i * kPrefetchChunk, (i + 1) * kPrefetchChunk) of the range. Nothing is read into registers and
// nothing is written, so the kernel finishes as soon as its requests are issued; the memory system
// serves them afterwards.
// sm_90: one cp.async.bulk.prefetch.L2 per thread over the chunk's 16-byte aligned interior (the bulk
// form needs a 16-byte aligned address and size), plus one line prefetch at each end for the bytes
// outside it. sm_80: one prefetch.global.L2 per 128-byte line (kPrefetchChunk / 128 = 128 per thread).
#pragma once

#include <cstdint>

namespace kernelforge {
namespace decode {

constexpr int64_t kPrefetchChunk = 16384;  // bytes per thread
constexpr int kPrefetchThreads = 128;
constexpr int64_t kPrefetchLine = 128;

__device__ __forceinline__ void prefetch_line_l2(const char* p) { asm volatile("prefetch.global.L2 [%0];" ::"l"(p)); }

__global__ void __launch_bounds__(kPrefetchThreads) prefetch_l2_kernel(const char* base, int64_t bytes) {
  const int64_t first = (int64_t(blockIdx.x) * kPrefetchThreads + threadIdx.x) * kPrefetchChunk;
  if (first >= bytes) return;
  const int64_t n = bytes - first < kPrefetchChunk ? bytes - first : kPrefetchChunk;
  const char* lo = base + first;
  const char* hi = lo + n;  // one past the chunk
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  const uintptr_t a = (reinterpret_cast<uintptr_t>(lo) + 15) & ~uintptr_t(15);
  const uintptr_t e = reinterpret_cast<uintptr_t>(hi) & ~uintptr_t(15);
  if (e > a) {
    asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(a), "r"(uint32_t(e - a)) : "memory");
  }
  prefetch_line_l2(lo);
  prefetch_line_l2(hi - 1);
#else
  const uintptr_t line0 = reinterpret_cast<uintptr_t>(lo) & ~uintptr_t(kPrefetchLine - 1);
  for (uintptr_t l = line0; l < reinterpret_cast<uintptr_t>(hi); l += kPrefetchLine) {
    prefetch_line_l2(reinterpret_cast<const char*>(l));
  }
#endif
}

}  // namespace decode
}  // namespace kernelforge
