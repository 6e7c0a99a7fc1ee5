// Forward, streaming (plan kind kFwdStream): y[r, :] = norm(x[r, :]), one 1024-thread block per row.
// Traffic: x read twice (three times for LayerNorm: sum, squared deviations, output; the later
// passes mostly from L2), y written once.
// Why it exists: rows no register kernel or cluster can hold (more than 8 CTAs x 512 threads x 8
// vectors, or longer than 16 one-element vectors x 512 threads on GPUs without clusters). Correct
// for any N, slower than the register kernels.
#pragma once

#include "norm/kernels/common.cuh"

namespace kernelforge {
namespace norm_detail {

template <typename T, NormOp kOp, int kVec>
__global__ void __launch_bounds__(1024) norm_fwd_stream(const NormParams p) {
  if constexpr (!arch_supports<T>()) {
    __trap();
  } else {
    pdl_wait();
    using Tr = OpTraits<kOp>;
    using V = Vec<T, kVec>;
    __shared__ ReduceSmem<1> sm;
    int slot = 0;
    const int tpr = blockDim.x;
    const int64_t n = p.n, nvec = n / kVec;
    const float inv_n = 1.f / float(n);
    for (int64_t row = blockIdx.x; row < p.rows; row += gridDim.x) {
      // s (add_rms_norm) is written to `sum` in the first pass and re-read from there.
      const T* src =
          Tr::kRes ? static_cast<const T*>(p.sum) + row * p.sum_stride : static_cast<const T*>(p.x) + row * p.x_stride;
      float s[1] = {0.f};
#pragma unroll 4
      for (int64_t v = threadIdx.x; v < nvec; v += tpr) {
        V xv = load_vec<T, kVec>(static_cast<const T*>(p.x) + row * p.x_stride + v * kVec);
        if constexpr (Tr::kRes) {
          const V rv = load_vec<T, kVec>(static_cast<const T*>(p.residual) + row * p.res_stride + v * kVec);
          float f[kVec];
#pragma unroll
          for (int j = 0; j < kVec; ++j) f[j] = xv.get(j) + rv.get(j);
          xv = V::from(f);
          store_vec<T, kVec>(static_cast<T*>(p.sum) + row * p.sum_stride + v * kVec, xv);
        }
#pragma unroll
        for (int j = 0; j < kVec; ++j) {
          const float a = xv.get(j);
          s[0] += Tr::kLayer ? a : a * a;
        }
      }
      team_sum<1>(s, tpr, 0, sm, slot, 1);
      float mean = 0.f, rstd;
      if constexpr (Tr::kLayer) {
        mean = s[0] * inv_n;
        float q[1] = {0.f};
#pragma unroll 4
        for (int64_t v = threadIdx.x; v < nvec; v += tpr) {
          const V xv = load_vec<T, kVec>(src + v * kVec);
#pragma unroll
          for (int j = 0; j < kVec; ++j) {
            const float d = xv.get(j) - mean;
            q[0] += d * d;
          }
        }
        team_sum<1>(q, tpr, 0, sm, slot, 1);
        rstd = rsqrtf(q[0] * inv_n + p.eps);
      } else {
        rstd = rsqrtf(s[0] * inv_n + p.eps);
      }
      const int64_t g = Tr::kAda ? ada_group(row, p) : 0;
#pragma unroll 4
      for (int64_t v = threadIdx.x; v < nvec; v += tpr) {
        const int64_t col = v * kVec;
        const V xv = load_vec<T, kVec>(src + col);
        V wv, bv, scv, shv;
        if (p.weight) wv = load_vec<T, kVec>(static_cast<const T*>(p.weight) + col);
        if (p.bias) bv = load_vec<T, kVec>(static_cast<const T*>(p.bias) + col);
        if constexpr (Tr::kAda) {
          scv = load_vec<T, kVec>(static_cast<const T*>(p.scale) + g * p.scale_stride + col);
          shv = load_vec<T, kVec>(static_cast<const T*>(p.shift) + g * p.shift_stride + col);
        }
        store_vec<T, kVec>(static_cast<T*>(p.y) + row * p.y_stride + col,
                           fwd_out<T, kOp, kVec>(xv, mean, rstd, p, wv, bv, scv, shv));
      }
    }
  }
}

}  // namespace norm_detail
}  // namespace kernelforge
