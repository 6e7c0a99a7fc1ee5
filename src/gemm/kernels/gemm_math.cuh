// Element helpers of the GEMM family's own kernels: 16-bit loads and stores through float, and the
// activations with cuBLASLt's definitions (GELU: the tanh form).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <type_traits>

#include "kernelforge/gemm.h"

namespace kernelforge {

__device__ __forceinline__ float gemm_load(const __nv_bfloat16* p) { return __bfloat162float(*p); }
__device__ __forceinline__ float gemm_load(const __half* p) { return __half2float(*p); }

template <typename T>
__device__ __forceinline__ T gemm_store(float v) {
  if constexpr (std::is_same<T, __nv_bfloat16>::value)
    return __float2bfloat16_rn(v);
  else
    return __float2half_rn(v);
}

__device__ __forceinline__ float gemm_activation(GemmActivation act, float x) {
  if (act == GemmActivation::kRelu) return fmaxf(x, 0.0f);
  if (act == GemmActivation::kGeluTanh) return 0.5f * x * (1.0f + tanhf(0.7978845608f * (x + 0.044715f * x * x * x)));
  return x;
}

}  // namespace kernelforge
