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
__device__ __forceinline__ float from_float<float>(float v) {
  return v;
}
template <>
__device__ __forceinline__ __half from_float<__half>(float v) {
  return __float2half_rn(v);
}
template <>
__device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float v) {
  return __float2bfloat16_rn(v);
}

// Rounds a float to T and back: models a PyTorch `.to(dtype)` in the middle of a float computation.
template <typename T>
__device__ __forceinline__ float round_to(float v) {
  return to_float(from_float<T>(v));
}

// 16/8/4-byte vectors move through one integer register group so that the compiler emits a single
// LDG.E.128 / STG.E.128 (element-wise struct copies were split into 32-bit stores).
template <int kBytes>
struct RawVec;
template <>
struct RawVec<16> {
  using type = uint4;
};
template <>
struct RawVec<8> {
  using type = uint2;
};
template <>
struct RawVec<4> {
  using type = unsigned int;
};
template <>
struct RawVec<2> {
  using type = unsigned short;
};

template <typename T, int kVec>
__device__ __forceinline__ Vec<T, kVec> load_vec(const T* p) {
  using R = typename RawVec<sizeof(T) * kVec>::type;
  const R r = *reinterpret_cast<const R*>(p);
  Vec<T, kVec> v;
  memcpy(&v, &r, sizeof(R));
  return v;
}
template <typename T, int kVec>
__device__ __forceinline__ void store_vec(T* p, const Vec<T, kVec>& v) {
  using R = typename RawVec<sizeof(T) * kVec>::type;
  R r;
  memcpy(&r, &v, sizeof(R));
  if constexpr (sizeof(R) == 16) {  // explicit: NVVM otherwise split it into four 32-bit stores
    asm volatile("st.global.v4.b32 [%0], {%1, %2, %3, %4};" ::"l"(p), "r"(r.x), "r"(r.y), "r"(r.z), "r"(r.w)
                 : "memory");
  } else {
    *reinterpret_cast<R*>(p) = r;
  }
}

// Asks L2 to fetch the line holding p (no register result; used for data needed a little later).
__device__ __forceinline__ void prefetch_l2(const void* p) { asm volatile("prefetch.global.L2 [%0];" ::"l"(p)); }

}  // namespace kernelforge
