// Integer helpers shared by the planners and launchers (host and device).
#pragma once

#include <cstdint>

namespace kernelforge {

#if defined(__CUDACC__)
#define KF_HOST_DEVICE __host__ __device__
#else
#define KF_HOST_DEVICE
#endif

KF_HOST_DEVICE inline constexpr int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Smallest power of two >= v (v >= 1; 1 for v <= 1).
inline int pow2_ceil(int64_t v) {
  int p = 1;
  while (p < v) p <<= 1;
  return p;
}

// log2 of a power of two.
inline int log2_of(int64_t pow2) {
  int s = 0;
  while ((int64_t(1) << s) < pow2) ++s;
  return s;
}

}  // namespace kernelforge
