// Vector loads/stores and dtype conversions shared by all kernels.
// kVec elements of T move as one access: kVec * sizeof(T) == 16 bytes on the fast path (8 bf16/fp16,
// 4 fp32), kVec == 1 for rows whose size or alignment does not allow 16-byte accesses.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <type_traits>

namespace kernelforge {

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

// Bits of one element of a 16-bit type (bf16/fp16) <-> float32.
template <typename T>
__device__ __forceinline__ float bits_to_float(unsigned int b);  // b: the element's 16 bits, zero-extended
template <>
__device__ __forceinline__ float bits_to_float<__nv_bfloat16>(unsigned int b) {
  return __uint_as_float(b << 16);
}
template <>
__device__ __forceinline__ float bits_to_float<__half>(unsigned int b) {
  return __half2float(__ushort_as_half(static_cast<unsigned short>(b)));
}
template <typename T>
__device__ __forceinline__ unsigned int float_to_bits(float f);  // round to nearest even
template <>
__device__ __forceinline__ unsigned int float_to_bits<__nv_bfloat16>(float f) {
  return __bfloat16_as_ushort(__float2bfloat16_rn(f));
}
template <>
__device__ __forceinline__ unsigned int float_to_bits<__half>(float f) {
  return __half_as_ushort(__float2half_rn(f));
}

// kVec elements of T held as packed 32-bit words (16 bytes = 4 registers), read and written as
// float32 through get/set. The words, not the elements, are the variables the compiler sees: a
// vector that is loaded or zero-filled stays 4 registers until an element is used, and an element
// is unpacked right where it is used (one shift or mask for bf16). An array of T elements instead
// was split by the compiler into one 16-bit register per element (8 per vector) as soon as a branch
// merged two vectors (e.g. a load and a zero fill), which made the norm kernels spill.
template <typename T, int kVec>
struct alignas(sizeof(T) * kVec) Vec {
  static constexpr int kBytes = int(sizeof(T)) * kVec;
  static_assert(kVec == 1 || kBytes % 4 == 0, "Vec: a multi-element vector must be whole 32-bit words");
  static constexpr bool kFloat = std::is_same<T, float>::value;
  using Word = std::conditional_t<(kBytes >= 4), unsigned int, unsigned short>;
  static constexpr int kWords = kBytes >= 4 ? kBytes / 4 : 1;
  Word w[kWords];

  __device__ __forceinline__ static Vec zero() {
    Vec v;
#pragma unroll
    for (int k = 0; k < kWords; ++k) v.w[k] = 0;
    return v;
  }
  // Element j (a compile-time constant after unrolling) as float32.
  __device__ __forceinline__ float get(int j) const {
    if constexpr (kFloat) {
      return __uint_as_float(w[j]);
    } else if constexpr (kBytes < 4) {
      return bits_to_float<T>(w[0]);
    } else {
      const unsigned int word = w[j >> 1];
      if constexpr (std::is_same<T, __nv_bfloat16>::value)  // the high half is already a float's top bits
        return __uint_as_float((j & 1) ? (word & 0xffff0000u) : (word << 16));
      else
        return bits_to_float<T>((j & 1) ? (word >> 16) : (word & 0xffffu));
    }
  }
  // Sets element j to f rounded to T.
  __device__ __forceinline__ void set(int j, float f) {
    if constexpr (kFloat) {
      w[j] = __float_as_uint(f);
    } else if constexpr (kBytes < 4) {
      w[0] = static_cast<unsigned short>(float_to_bits<T>(f));
    } else {
      const unsigned int b = float_to_bits<T>(f), word = w[j >> 1];
      w[j >> 1] = (j & 1) ? ((word & 0xffffu) | (b << 16)) : ((word & 0xffff0000u) | b);
    }
  }
  // All elements from float32 values (rounded to T; pairs packed by one conversion where possible).
  __device__ __forceinline__ static Vec from(const float (&f)[kVec]) {
    Vec v;
    if constexpr (kFloat || kBytes < 4) {
#pragma unroll
      for (int j = 0; j < kVec; ++j) v.set(j, f[j]);
    } else {
#pragma unroll
      for (int k = 0; k < kWords; ++k) {
        if constexpr (std::is_same<T, __nv_bfloat16>::value) {
          const __nv_bfloat162 h = __floats2bfloat162_rn(f[2 * k], f[2 * k + 1]);  // .x = low half
          memcpy(&v.w[k], &h, 4);
        } else {
          const __half2 h = __floats2half2_rn(f[2 * k], f[2 * k + 1]);
          memcpy(&v.w[k], &h, 4);
        }
      }
    }
    return v;
  }
};

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
  memcpy(&v.w, &r, sizeof(R));
  return v;
}
template <typename T, int kVec>
__device__ __forceinline__ void store_vec(T* p, const Vec<T, kVec>& v) {
  using R = typename RawVec<sizeof(T) * kVec>::type;
  R r;
  memcpy(&r, &v.w, sizeof(R));
  if constexpr (sizeof(R) == 16) {  // explicit: NVVM otherwise split it into four 32-bit stores
    asm volatile("st.global.v4.b32 [%0], {%1, %2, %3, %4};" ::"l"(p), "r"(r.x), "r"(r.y), "r"(r.z), "r"(r.w)
                 : "memory");
  } else {
    *reinterpret_cast<R*>(p) = r;
  }
}

// The vector of row `src` at column c: 16 bytes when it lies inside the row, else element by element
// (the row's last, partial vector) with `pad` past the end.
template <typename T, int kVec>
__device__ __forceinline__ Vec<T, kVec> load_row_vec(const T* src, int c, int n, float pad) {
  using V = Vec<T, kVec>;
  if (c <= n - kVec) return load_vec<T, kVec>(src + c);  // (no c + kVec: n may be 2^31 - 1)
  V v;
#pragma unroll
  for (int j = 0; j < kVec; ++j) v.set(j, j < n - c ? to_float(src[c + j]) : pad);
  return v;
}

// The vector v (already rounded to T) at column c of row `dst`: 16 bytes when it lies inside the row,
// else element by element up to n.
template <typename T, int kVec>
__device__ __forceinline__ void store_row_vec(T* dst, int c, int n, const Vec<T, kVec>& v) {
  if (c <= n - kVec) {
    store_vec<T, kVec>(dst + c, v);
  } else {
#pragma unroll
    for (int j = 0; j < kVec; ++j)
      if (j < n - c) dst[c + j] = from_float<T>(v.get(j));  // exact: v's elements are T values
  }
}
// The same from float32 values (each rounded to T once, by Vec::from).
template <typename T, int kVec>
__device__ __forceinline__ void store_row_vec(T* dst, int c, int n, const float (&f)[kVec]) {
  store_row_vec<T, kVec>(dst, c, n, Vec<T, kVec>::from(f));
}

// kVec elements at src[c..c+kVec) of a tensor whose vectors are not 16-byte aligned (a weight or
// AdaLN scale/shift row read at the column of a row body that starts after a scalar head, so at any
// element offset): the widest accesses the address allows (8, 4 or 2 bytes), element by element for
// the last, partial vector (0 past n). src must be aligned to its element.
template <typename T, int kVec>
__device__ __forceinline__ Vec<T, kVec> load_vec_any(const T* src, int c, int n) {
  using V = Vec<T, kVec>;
  V v = V::zero();
  const T* a = src + c;
  const uintptr_t addr = reinterpret_cast<uintptr_t>(a);
  if (c > n - kVec) {
#pragma unroll
    for (int j = 0; j < kVec; ++j)
      if (j < n - c) v.set(j, to_float(a[j]));
  } else if constexpr (V::kBytes == 16) {
    if (addr % 16 == 0) return load_vec<T, kVec>(a);
    if (addr % 8 == 0) {
      const uint2 lo = reinterpret_cast<const uint2*>(a)[0], hi = reinterpret_cast<const uint2*>(a)[1];
      v.w[0] = lo.x, v.w[1] = lo.y, v.w[2] = hi.x, v.w[3] = hi.y;
    } else if (addr % 4 == 0) {
#pragma unroll
      for (int k = 0; k < 4; ++k) v.w[k] = reinterpret_cast<const unsigned int*>(a)[k];
    } else {  // 2-byte elements at an odd element offset: pairs packed into words
      const unsigned short* h = reinterpret_cast<const unsigned short*>(a);
#pragma unroll
      for (int k = 0; k < 4; ++k) v.w[k] = unsigned(h[2 * k]) | (unsigned(h[2 * k + 1]) << 16);
    }
  } else {
    return load_vec<T, kVec>(a);  // one element (kVec == 1): any element-aligned address
  }
  return v;
}

// Hides the bits of v from the compiler (an empty asm that "modifies" its registers). Values the
// compiler derived from v before this point cannot be reused after it, so it keeps the packed
// vector live (4 registers for 16 bytes) instead of the float32 values unpacked from it (8 for
// bf16/fp16) across a reduction, and unpacks again afterwards (one integer op per element).
template <typename T, int kVec>
__device__ __forceinline__ void launder(Vec<T, kVec>& v) {
#pragma unroll
  for (int k = 0; k < Vec<T, kVec>::kWords; ++k) {
    if constexpr (sizeof(typename Vec<T, kVec>::Word) == 4)
      asm volatile("" : "+r"(v.w[k]));
    else
      asm volatile("" : "+h"(v.w[k]));
  }
}

// Elements of T before the first 16-byte boundary at or after p, at most n: the scalar head of a row
// whose vectors start after it (rows with an odd length whose pointers share their misalignment).
template <typename T>
__device__ __forceinline__ int head_elems(const T* p, int64_t n) {
  const int hd = int(((16 - (reinterpret_cast<uintptr_t>(p) & 15)) & 15) / sizeof(T));
  return n < hd ? int(n) : hd;
}

// Asks L2 to fetch the line holding p (no register result; used for data needed a little later).
__device__ __forceinline__ void prefetch_l2(const void* p) { asm volatile("prefetch.global.L2 [%0];" ::"l"(p)); }

}  // namespace kernelforge
