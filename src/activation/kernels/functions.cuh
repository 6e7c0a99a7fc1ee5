// The elementwise functions of the activation kernels, in float32: act(a) and act'(a) for SiLU, the
// exact (erf) GELU and the tanh GELU. Memory-bound budget: at 3 TB/s a bf16 gated forward moves
// 5e11 elements/s while the H100 issues ~3e13 float ops/s and ~3.8e12 MUFU ops/s, i.e. ~60 ops and
// ~7 MUFU per element; these cost ~10-30 ops and 2 MUFU (ex2, rcp) each.
// sigmoid uses __expf (relative error ~1e-6 for |a| < 80, far inside the float32 tolerance of 1e-5),
// the exact GELU erff, as PyTorch.
#pragma once

#include <cuda_runtime.h>

#include "activation/activation_problem.h"

namespace kernelforge {
namespace act_detail {

constexpr float kSqrt1_2 = 0.70710678118654752440f;     // 1 / sqrt(2)
constexpr float kInvSqrt2Pi = 0.39894228040143267794f;  // 1 / sqrt(2 pi)
constexpr float kTanh2K = 1.59576912160573071176f;      // 2 sqrt(2 / pi)
constexpr float kTanh2KC = kTanh2K * 0.044715f;         // 2 sqrt(2 / pi) · 0.044715

// sigmoid(z) = 1 / (1 + exp(-z)): ex2 + rcp (MUFU). z = -inf or z < -88: exp overflows to inf and
// the reciprocal gives 0 (the limit); z = NaN gives NaN.
__device__ __forceinline__ float sigmoid(float z) { return __fdividef(1.f, 1.f + __expf(-z)); }

// act(a), and act(a) with act'(a) for the backward.
template <ActFn F>
struct Act;

// silu(a) = a · s, s = sigmoid(a);  silu'(a) = s (1 + a (1 - s)).
// a = -inf: a · 0 = NaN, as PyTorch's x / (1 + exp(-x)); a = +inf: forward inf, gradient NaN (inf · 0).
template <>
struct Act<ActFn::kSilu> {
  static __device__ __forceinline__ float fwd(float a) { return a * sigmoid(a); }
  static __device__ __forceinline__ void both(float a, float& f, float& df) {
    const float s = sigmoid(a);
    f = a * s;
    df = s * fmaf(a, 1.f - s, 1.f);
  }
};

// gelu(a) = 0.5 a (1 + erf(a / sqrt 2)) = a · Phi(a);  gelu'(a) = Phi(a) + a · phi(a),
// phi(a) = exp(-a^2 / 2) / sqrt(2 pi). Same formula as PyTorch (erf, not erfc: for a < -5 the result
// is below 1.5e-6 in absolute value, where the cancellation in 1 + erf costs nothing that matters).
template <>
struct Act<ActFn::kGeluErf> {
  static __device__ __forceinline__ float fwd(float a) { return 0.5f * a * (1.f + erff(a * kSqrt1_2)); }
  static __device__ __forceinline__ void both(float a, float& f, float& df) {
    const float cdf = 0.5f * (1.f + erff(a * kSqrt1_2));
    f = a * cdf;
    df = fmaf(a * kInvSqrt2Pi, __expf(-0.5f * a * a), cdf);
  }
};

// gelu_tanh(a) = 0.5 a (1 + tanh(u)), u = k (a + 0.044715 a^3), k = sqrt(2 / pi).
// With 0.5 (1 + tanh(u)) = sigmoid(2u): gelu_tanh(a) = a · s, s = sigmoid(z), z = 2u = a (2k + 2k·0.044715 a^2);
// gelu_tanh'(a) = s + a · s (1 - s) · z', z' = 2k (1 + 3 · 0.044715 a^2)
// (= 0.5 (1 + t) + 0.5 a (1 - t^2) u' since 1 - t^2 = 4 s (1 - s)). a^2 is capped at 1e6: beyond
// |a| = 1000, s is exactly 0 or 1 in float32 so the second term is 0, where an a^2 of inf would turn
// it into 0 · inf = NaN (the float64 reference gives 0 up to |a| ~ 1e100).
template <>
struct Act<ActFn::kGeluTanh> {
  static __device__ __forceinline__ float fwd(float a) {
    const float a2 = fminf(a * a, 1e6f);
    return a * sigmoid(a * fmaf(kTanh2KC, a2, kTanh2K));
  }
  static __device__ __forceinline__ void both(float a, float& f, float& df) {
    const float a2 = fminf(a * a, 1e6f);
    const float s = sigmoid(a * fmaf(kTanh2KC, a2, kTanh2K));
    f = a * s;
    df = fmaf(f * (1.f - s), fmaf(3.f * kTanh2KC, a2, kTanh2K), s);
  }
};

}  // namespace act_detail
}  // namespace kernelforge
