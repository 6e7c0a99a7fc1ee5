// Host-side dtype conversions for the float64 reference (round to nearest even, NaN/Inf kept).
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#include "kernelforge/tensor.h"

namespace kernelforge {

inline float bf16_bits_to_float(uint16_t h) {
  uint32_t x = uint32_t(h) << 16;
  float f;
  std::memcpy(&f, &x, 4);
  return f;
}

inline uint16_t float_to_bf16_bits(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  if ((x & 0x7fffffffu) > 0x7f800000u) return uint16_t((x >> 16) | 0x40);  // quiet NaN
  x += 0x7fffu + ((x >> 16) & 1u);
  return uint16_t(x >> 16);
}

inline float half_bits_to_float(uint16_t h) {
  const uint32_t sign = uint32_t(h & 0x8000u) << 16;
  const uint32_t e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
  uint32_t x;
  if (e == 0) {
    float v = std::ldexp(float(m), -24);
    return sign ? -v : v;
  } else if (e == 31) {
    x = sign | 0x7f800000u | (m << 13);
  } else {
    x = sign | ((e - 15 + 127) << 23) | (m << 13);
  }
  float f;
  std::memcpy(&f, &x, 4);
  return f;
}

inline uint16_t float_to_half_bits(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  const uint32_t sign = (x >> 16) & 0x8000u;
  const uint32_t e = (x >> 23) & 0xffu;
  uint32_t m = x & 0x7fffffu;
  if (e == 0xff) return uint16_t(sign | 0x7c00u | (m ? 0x200u : 0u));
  const int32_t exp = int32_t(e) - 127 + 15;
  if (exp >= 31) return uint16_t(sign | 0x7c00u);
  if (exp <= 0) {
    if (exp < -10) return uint16_t(sign);
    m |= 0x800000u;
    const int shift = 14 - exp;
    uint32_t hm = m >> shift;
    const uint32_t rem = m & ((1u << shift) - 1u), half = 1u << (shift - 1);
    if (rem > half || (rem == half && (hm & 1u))) ++hm;
    return uint16_t(sign | hm);
  }
  uint32_t out = sign | (uint32_t(exp) << 10) | (m >> 13);
  const uint32_t rem = m & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (out & 1u))) ++out;  // a carry into the exponent is right
  return uint16_t(out);
}

// Reads element i (in elements) of a buffer of dtype t as double.
inline double load_as_double(const void* base, DType t, int64_t i) {
  switch (t) {
    case DType::kFloat64:
      return static_cast<const double*>(base)[i];
    case DType::kFloat32:
      return static_cast<const float*>(base)[i];
    case DType::kFloat16:
      return half_bits_to_float(static_cast<const uint16_t*>(base)[i]);
    case DType::kBFloat16:
      return bf16_bits_to_float(static_cast<const uint16_t*>(base)[i]);
    default:
      return NAN;
  }
}

// Rounds v to dtype t and stores it.
inline void store_from_double(void* base, DType t, int64_t i, double v) {
  switch (t) {
    case DType::kFloat64:
      static_cast<double*>(base)[i] = v;
      break;
    case DType::kFloat32:
      static_cast<float*>(base)[i] = float(v);
      break;
    case DType::kFloat16:
      static_cast<uint16_t*>(base)[i] = float_to_half_bits(float(v));
      break;
    case DType::kBFloat16:
      static_cast<uint16_t*>(base)[i] = float_to_bf16_bits(float(v));
      break;
    default:
      break;
  }
}

// v rounded to dtype t, as double (models `.to(dtype)`).
inline double round_as(DType t, double v) {
  switch (t) {
    case DType::kFloat32:
      return double(float(v));
    case DType::kFloat16:
      return half_bits_to_float(float_to_half_bits(float(v)));
    case DType::kBFloat16:
      return bf16_bits_to_float(float_to_bf16_bits(float(v)));
    default:
      return v;
  }
}

}  // namespace kernelforge
