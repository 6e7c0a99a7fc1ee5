// Device helpers shared by the RoPE kernels (kernels/rope_token.cuh, kernels/rope_flat.cuh): cos/sin
// loads, the input and output rows of a head, the columns of a work unit, the rotation of a unit's
// pairs and the passthrough copy.
//
// A rotation unit is kVec pairs: for rotate-half two kVec-vectors at columns c and c + R/2 (element j
// of one pairs with element j of the other), for the interleaved pairing one kVec-vector holding
// kVec/2 adjacent pairs (with kVec = 1: two single elements 2i, 2i + 1). A passthrough unit is one
// kVec-vector of columns >= R (copied, skipped when the tensor is rotated in place). cos/sin have
// dtype CS: float32 or T. Math in float32: out = fmaf(x_partner, +-sin, x * cos), rounded once to T.
// A position id out of range: cos/sin are not read, the token's rotated columns become NaN.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "common/vec.cuh"
#include "rope/rope_problem.h"

namespace kernelforge {
namespace rope_detail {

// kVec values of cos/sin (dtype CS) at p as float32. CS = float with kVec >= 4: 16-byte loads;
// CS = T (16-bit) with kVec = 8: one 16-byte load.
template <typename CS, int kVec>
__device__ __forceinline__ void load_cs(const CS* p, float (&f)[kVec]) {
  if constexpr (kVec == 1) {
    f[0] = to_float(p[0]);
  } else if constexpr (std::is_same<CS, float>::value) {
    static_assert(kVec % 4 == 0, "float32 cos/sin: whole float4 vectors");
#pragma unroll
    for (int k = 0; k < kVec / 4; ++k) {
      const float4 v = *reinterpret_cast<const float4*>(p + 4 * k);
      f[4 * k] = v.x, f[4 * k + 1] = v.y, f[4 * k + 2] = v.z, f[4 * k + 3] = v.w;
    }
  } else {
    const Vec<CS, kVec> v = load_vec<CS, kVec>(p);
#pragma unroll
    for (int j = 0; j < kVec; ++j) f[j] = v.get(j);
  }
}

// Input and output of head h (q's heads first, then k's) of token (b, s). Selects, not an indexed
// parameter array (which the compiler would copy to local memory).
template <typename T>
struct HeadPtrs {
  const T* in;
  T* out;
  bool inplace;
};
template <typename T>
__device__ __forceinline__ HeadPtrs<T> head_ptrs(const RopeParams& p, int h, int64_t b, int64_t s) {
  const bool isk = h >= p.t[0].heads;
  const int64_t hh = isk ? h - p.t[0].heads : h;
  const RopeHeads& a = p.t[0];
  const RopeHeads& k = p.t[1];
  const T* in = static_cast<const T*>(isk ? k.in : a.in) + b * (isk ? k.in_sb : a.in_sb) +
                s * (isk ? k.in_ss : a.in_ss) + hh * (isk ? k.in_sh : a.in_sh);
  T* out = static_cast<T*>(isk ? k.out : a.out) + b * (isk ? k.out_sb : a.out_sb) + s * (isk ? k.out_ss : a.out_ss) +
           hh * (isk ? k.out_sh : a.out_sh);
  return {in, out, isk ? k.inplace : a.inplace};
}

// Columns of rotation unit u: vector a at *ca, vector b at *cb (cb == ca when the pairs lie inside
// one vector).
template <bool kInterleaved, int kVec>
__device__ __forceinline__ void unit_cols(int u, int R, int* ca, int* cb) {
  constexpr bool kPacked = kInterleaved && kVec > 1;
  *ca = kPacked ? u * kVec : (kInterleaved ? 2 * u : u * kVec);
  *cb = kPacked ? *ca : (kInterleaved ? *ca + 1 : *ca + R / 2);
}

// The cos c and "effective sin" e of a unit's pairs (formula at the kernel), float32; NaN when the
// token's position is out of range (`bad`: cos/sin are not read).
template <typename CS, bool kInterleaved, int kVec>
struct UnitCS {
  float ca[kVec], cb[kVec], ea[kVec], eb[kVec];
  __device__ __forceinline__ void load(const CS* cosr, const CS* sinr, int a, int b, bool backward, bool bad) {
    constexpr bool kPacked = kInterleaved && kVec > 1;
    if (bad) {
#pragma unroll
      for (int j = 0; j < kVec; ++j) ca[j] = cb[j] = ea[j] = eb[j] = __int_as_float(0x7fffffff);
    } else if constexpr (kPacked) {
      float sv[kVec];
      load_cs<CS, kVec>(cosr + a, ca);
      load_cs<CS, kVec>(sinr + a, sv);
#pragma unroll
      for (int j = 0; j < kVec; j += 2) {  // pair (j, j + 1): ea/eb hold e of the first/second member
        ea[j] = backward ? sv[j + 1] : -sv[j];
        eb[j] = backward ? -sv[j] : sv[j + 1];
        cb[j] = ca[j + 1];
        ea[j + 1] = eb[j + 1] = cb[j + 1] = 0.f;  // unused
      }
    } else {
      float sa[kVec], sb[kVec];
      load_cs<CS, kVec>(cosr + a, ca);
      load_cs<CS, kVec>(cosr + b, cb);
      load_cs<CS, kVec>(sinr + a, sa);
      load_cs<CS, kVec>(sinr + b, sb);
#pragma unroll
      for (int j = 0; j < kVec; ++j) {
        ea[j] = backward ? sb[j] : -sa[j];
        eb[j] = backward ? -sa[j] : sb[j];
      }
    }
  }
};

// out_a = x_a c_a + x_b e_a, out_b = x_b c_b + x_a e_b for the unit's pairs, rounded once to T and
// stored at out + ca (and out + cb).
template <typename T, typename CS, bool kInterleaved, int kVec>
__device__ __forceinline__ void rotate_store(const Vec<T, kVec>& xa, const Vec<T, kVec>& xb,
                                             const UnitCS<CS, kInterleaved, kVec>& c, T* out, int ca, int cb) {
  using V = Vec<T, kVec>;
  if constexpr (kInterleaved && kVec > 1) {
    float o[kVec];
#pragma unroll
    for (int j = 0; j < kVec; j += 2) {
      const float x0 = xa.get(j), x1 = xa.get(j + 1);
      o[j] = fmaf(x1, c.ea[j], x0 * c.ca[j]);
      o[j + 1] = fmaf(x0, c.eb[j], x1 * c.cb[j]);
    }
    store_vec<T, kVec>(out + ca, V::from(o));
  } else {
    float oa[kVec], ob[kVec];
#pragma unroll
    for (int j = 0; j < kVec; ++j) {
      const float x0 = xa.get(j), x1 = xb.get(j);
      oa[j] = fmaf(x1, c.ea[j], x0 * c.ca[j]);
      ob[j] = fmaf(x0, c.eb[j], x1 * c.cb[j]);
    }
    store_vec<T, kVec>(out + ca, V::from(oa));
    store_vec<T, kVec>(out + cb, V::from(ob));
  }
}

// The cos/sin rows of token (b, s) (through the position ids when given); *bad when the position is
// out of range (the rows then point at row 0 and must not be read).
template <typename CS>
__device__ __forceinline__ void token_cs(const RopeParams& p, int64_t b, int64_t s, const CS** cosr, const CS** sinr,
                                         bool* bad) {
  const CS* cos_base = static_cast<const CS*>(p.cos);
  const CS* sin_base = static_cast<const CS*>(p.sin);
  *bad = false;
  if (p.pos != nullptr) {
    const int64_t v = p.pos[b * p.pos_sb + s * p.pos_ss];
    *bad = v < 0 || v >= p.max_pos;
    const int64_t row = *bad ? 0 : v;
    *cosr = cos_base + row * p.cos_ss;
    *sinr = sin_base + row * p.sin_ss;
  } else {
    *cosr = cos_base + b * p.cos_sb + s * p.cos_ss;
    *sinr = sin_base + b * p.sin_sb + s * p.sin_ss;
  }
}

// Passthrough unit at column c (>= R) of one head: copied unless rotated in place.
template <typename T, int kVec>
__device__ __forceinline__ void pass_unit(const HeadPtrs<T>& hp, int c, int D) {
  if (hp.inplace) return;
  if (c + kVec <= D) {
    store_vec<T, kVec>(hp.out + c, load_vec<T, kVec>(hp.in + c));
  } else {
    for (int k = c; k < D; ++k) hp.out[k] = hp.in[k];
  }
}

}  // namespace rope_detail
}  // namespace kernelforge
