// Elementwise helpers of the attention kernels (every architecture): 16-bit packing and conversion,
// and the MUFU unit's exp2 and tanh.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

namespace kernelforge {

// Two floats rounded to T and packed, `lo` in the low half (the lower column of a fragment pair).
template <typename T>
__device__ __forceinline__ uint32_t pack2(float lo, float hi) {
  if constexpr (std::is_same<T, __nv_bfloat16>::value) {
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<uint32_t*>(&v);
  } else {
    __half2 v = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<uint32_t*>(&v);
  }
}

template <typename T>
__device__ __forceinline__ float to_float(T v) {
  if constexpr (std::is_same<T, __nv_bfloat16>::value)
    return __bfloat162float(v);
  else
    return __half2float(v);
}

// 2^x on the MUFU unit; 2^-inf = +0.
__device__ __forceinline__ float ex2_approx(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

// tanh on the MUFU unit: one op (an exact 1 - 2 / (exp(2x) + 1) takes two, ex2 and rcp, on the unit
// that already carries every exp2 of the softmax). Relative error below 2^-10.9: a softcap-c logit
// moves by at most c * 2^-10.9 (FlashAttention's softcap uses the same instruction). Forward and
// backward use the same instruction, so the backward's recomputed p matches the forward's lse.
__device__ __forceinline__ float tanh_approx(float x) {
  float y;
  asm("tanh.approx.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

}  // namespace kernelforge
