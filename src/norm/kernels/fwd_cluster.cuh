// Forward, row in registers, persistent grid (plan kind kFwdCluster):
//   y[r, :] = norm(x[r, :]) (include/kernelforge/norm.h), statistics in float32.
// Minimum traffic: read x (and residual), write y (and sum): 2·M·N·sizeof(T) bytes (add_rms_norm
// 4·M·N); weight, bias and scale/shift come from L2.
// Why it exists: rows too long for norm_fwd_row's blocks. A team of 2^tpr_shift threads (up to 512)
// owns a row, thread t holding vectors t, t + tpr, ... (coalesced), kIters of them; with cluster > 1
// (sm_90) a row is split over the CTAs of a thread-block cluster, each holding a slice in registers,
// and the partial sums are exchanged through distributed shared memory. x is read from DRAM once.
// The grid is persistent (resident blocks, or clusters, looping over rows): every load a row needs
// (x, residual, AdaLN scale/shift) is issued before the first reduction, the next row's loads are
// issued during the current row when the slice is small (kPipe), and weight/bias of small slices are
// held in registers for the block's lifetime (kParamRegs). Bandwidth follows Little's law: bytes in
// flight per SM = resident threads x bytes per thread.
#pragma once

#include "norm/kernels/common.cuh"

namespace kernelforge {
namespace norm_detail {

// Loads row `row` of x (and residual, AdaLN scale/shift) for a thread whose first vector is v0.
// A function rather than a lambda so that it is always inlined (a non-inlined call taking register
// arrays by reference sends them to local memory).
template <typename T, NormOp kOp, int kVec, int kIters, int kR, int kA>
__device__ __forceinline__ void fwd_load_row(const NormParams& p, int64_t row, int64_t v0, int tpr,
                                             Vec<T, kVec> (&xd)[kIters], Vec<T, kVec> (&rd)[kR],
                                             Vec<T, kVec> (&scd)[kA], Vec<T, kVec> (&shd)[kA]) {
  using Tr = OpTraits<kOp>;
  const int64_t g = Tr::kAda ? ada_group(row, p) : 0;
#pragma unroll
  for (int i = 0; i < kIters; ++i) {
    const int64_t col = (v0 + int64_t(i) * tpr) * kVec;
    if (row < p.rows && col < p.n) {
      xd[i] = load_vec<T, kVec>(static_cast<const T*>(p.x) + row * p.x_stride + col);
      if constexpr (Tr::kRes) rd[i] = load_vec<T, kVec>(static_cast<const T*>(p.residual) + row * p.res_stride + col);
      if constexpr (Tr::kAda) {
        scd[i] = load_vec<T, kVec>(static_cast<const T*>(p.scale) + g * p.scale_stride + col);
        shd[i] = load_vec<T, kVec>(static_cast<const T*>(p.shift) + g * p.shift_stride + col);
      }
    }
  }
}

template <typename T, NormOp kOp, int kVec, int kIters>
__global__ void __launch_bounds__(kFwdMaxTeam)
    norm_fwd_cluster(const NormParams p, const int tpr_shift, const int cluster) {
  if constexpr (!arch_supports<T>()) {
    __trap();
  } else {
    pdl_wait();
    using Tr = OpTraits<kOp>;
    using V = Vec<T, kVec>;
    constexpr int kSliceBytes = kIters * kVec * int(sizeof(T));
    constexpr bool kPipe = kSliceBytes * (Tr::kRes ? 2 : 1) <= 32;
    constexpr bool kParamRegs = kSliceBytes <= 64;
    constexpr int kP = kParamRegs ? kIters : 1;  // parameter vectors held in registers
    constexpr int kA = Tr::kAda ? kIters : 1;    // scale/shift vectors of the current row
    constexpr int kR = Tr::kRes ? kIters : 1;    // residual vectors
    __shared__ ReduceSmem<1> sm;
    int slot = 0;
    T* __restrict__ yg = static_cast<T*>(p.y);
    const int tpr = 1 << tpr_shift;
    const int rpb = int(blockDim.x) >> tpr_shift;
    const int team = int(threadIdx.x) >> tpr_shift;
    const int t = int(threadIdx.x) & (tpr - 1);
    const int64_t n = p.n;
    const int64_t v0 = int64_t(cluster_rank(cluster)) * tpr * kIters + t;
    const float inv_n = 1.f / float(n);
    const bool has_w = p.weight != nullptr, has_b = p.bias != nullptr;
    auto col_of = [&](int i) { return (v0 + int64_t(i) * tpr) * kVec; };
    auto load_w = [&](int64_t col) { return load_vec<T, kVec>(static_cast<const T*>(p.weight) + col); };
    auto load_b = [&](int64_t col) { return load_vec<T, kVec>(static_cast<const T*>(p.bias) + col); };

    V wv[kP], bv[kP];
    if constexpr (kParamRegs) {
#pragma unroll
      for (int i = 0; i < kIters; ++i) {
        const int64_t col = col_of(i);
        if (col < n && has_w) wv[i] = load_w(col);
        if constexpr (!Tr::kHfRms) {
          if (col < n && has_b) bv[i] = load_b(col);
        }
      }
    }
    V xv[kIters], rv[kR], scv[kA], shv[kA];
    auto load_row = [&](int64_t row, V(&xd)[kIters], V(&rd)[kR], V(&scd)[kA], V(&shd)[kA]) {
      fwd_load_row<T, kOp, kVec, kIters, kR, kA>(p, row, v0, tpr, xd, rd, scd, shd);
    };

    const int64_t step = int64_t(gridDim.x / cluster) * rpb;
    int64_t base = int64_t(blockIdx.x / cluster) * rpb;
    if (base < p.rows) load_row(base + team, xv, rv, scv, shv);
    for (; base < p.rows; base += step) {
      const int64_t row = base + team;
      const bool row_ok = row < p.rows;
      V xn[kPipe ? kIters : 1], rn[kPipe ? kR : 1], scn[kPipe ? kA : 1], shn[kPipe ? kA : 1];
      if constexpr (kPipe) {
        if (base + step < p.rows) load_row(row + step, xn, rn, scn, shn);
      }
      // Padding (columns past n, rows past the end) enters the sums as zeros.
#pragma unroll
      for (int i = 0; i < kIters; ++i) {
        const bool ok = row_ok && col_of(i) < n;
        if constexpr (Tr::kRes) {  // s = T(x + residual), written out for the next block
          float f[kVec];
#pragma unroll
          for (int j = 0; j < kVec; ++j) f[j] = ok ? xv[i].get(j) + rv[i].get(j) : 0.f;
          xv[i] = V::from(f);
        } else {
          if (!ok) xv[i] = V::zero();
        }
        if constexpr (Tr::kRes) {
          if (ok) store_vec<T, kVec>(static_cast<T*>(p.sum) + row * p.sum_stride + col_of(i), xv[i]);
        }
      }
      float mean = 0.f;
      if constexpr (Tr::kLayer) {
        float s1[1] = {0.f};
#pragma unroll
        for (int i = 0; i < kIters; ++i)
#pragma unroll
          for (int j = 0; j < kVec; ++j) s1[0] += xv[i].get(j);
        team_sum<1>(s1, tpr, team, sm, slot, cluster);
        mean = s1[0] * inv_n;
      }
      float q[1] = {0.f};
#pragma unroll
      for (int i = 0; i < kIters; ++i) {
        const bool ok = col_of(i) < n;
#pragma unroll
        for (int j = 0; j < kVec; ++j) {
          const float d = xv[i].get(j) - mean;
          q[0] += ok ? d * d : 0.f;
        }
      }
      team_sum<1>(q, tpr, team, sm, slot, cluster);
      const float rstd = rsqrtf(q[0] * inv_n + p.eps);

#pragma unroll
      for (int i = 0; i < kIters; ++i) {
        const int64_t col = col_of(i);
        if (!(row_ok && col < n)) continue;
        V w_i, b_i;
        if constexpr (kParamRegs) {
          w_i = wv[i];
          b_i = bv[i];
        } else {
          if (has_w) w_i = load_w(col);
          if constexpr (!Tr::kHfRms) {
            if (has_b) b_i = load_b(col);
          }
        }
        launder(xv[i]);
        const V out =
            fwd_out<T, kOp, kVec>(xv[i], mean, rstd, p, w_i, b_i, scv[Tr::kAda ? i : 0], shv[Tr::kAda ? i : 0]);
        store_vec<T, kVec>(yg + row * p.y_stride + col, out);
      }
      if (base + step < p.rows) {
        if constexpr (kPipe) {
#pragma unroll
          for (int i = 0; i < kIters; ++i) {
            xv[i] = xn[i];
            if constexpr (Tr::kRes) rv[i] = rn[i];
            if constexpr (Tr::kAda) {
              scv[i] = scn[i];
              shv[i] = shn[i];
            }
          }
        } else {
          load_row(row + step, xv, rv, scv, shv);
        }
      }
    }
    cluster_exit_sync(cluster);
  }
}

}  // namespace norm_detail
}  // namespace kernelforge
