// Helpers shared by the kernel families' launchers and kernels: integer ceiling division, the guard
// for bf16 code on sm_75, and launch-error reporting.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <string>
#include <type_traits>

#include "kernelforge/status.h"

namespace kernelforge {

inline int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// bf16 kernels are not built for sm_75 (no bf16 there; the host rejects such calls): a kernel body
// is `if constexpr (!arch_supports<T>()) __trap(); else { ... }`.
template <typename T>
__device__ __forceinline__ constexpr bool arch_supports() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
  return !std::is_same<T, __nv_bfloat16>::value;
#else
  return true;
#endif
}

// The launch error of the last kernel launch, if any, as a Status naming `what`.
inline Status check_launch(const char* what) {
  cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) return Status::Cuda(std::string(what) + ": kernel launch failed: " + cudaGetErrorString(err));
  return Status::Ok();
}

}  // namespace kernelforge
