// Vector loads/stores and dtype conversions shared by all kernels.
// kVec elements of T move as one access: kVec * sizeof(T) == 16 bytes on the fast path (8 bf16/fp16,
// 4 fp32), kVec == 1 for rows whose size or alignment does not allow 16-byte accesses.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

namespace kernelforge {

template <typename T, int kVec>
struct alignas(sizeof(T) * kVec) Vec {
  T v[kVec];
};

__device__ __forceinline__ float to_float(float v) { return v; }
__device__ __forceinline__ float to_float(__half v) { return __half2float(v); }
__device__ __forceinline__ float to_float(__nv_bfloat16 v) { return __bfloat162float(v); }

template <typename T>
__device__ __forceinline__ T from_float(float v);
template <>
__device__ __forceinline__ float from_float<float>(float v) { return v; }
template <>
__device__ __forceinline__ __half from_float<__half>(float v) { return __float2half_rn(v); }
template <>
__device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float v) { return __float2bfloat16_rn(v); }

// Rounds a float to T and back: models a PyTorch `.to(dtype)` in the middle of a float computation.
template <typename T>
__device__ __forceinline__ float round_to(float v) { return to_float(from_float<T>(v)); }

// Loads bypass L1 allocation only through the default path; rows are read once, so plain global
// loads are used and the compiler emits LDG.E.128 for 16-byte Vecs.
template <typename T, int kVec>
__device__ __forceinline__ Vec<T, kVec> load_vec(const T* p) {
  return *reinterpret_cast<const Vec<T, kVec>*>(p);
}
template <typename T, int kVec>
__device__ __forceinline__ void store_vec(T* p, const Vec<T, kVec>& v) {
  *reinterpret_cast<Vec<T, kVec>*>(p) = v;
}

}  // namespace kernelforge
