// Backward, streaming (plan kind kBwdStream): the formulas of norm_bwd_regs from two passes over the
// row in global memory. Traffic: x, dy read twice (the second pass mostly from L2), dx written once,
// and a float32 partial row read-modify-written per row.
// Why it exists: rows of one-element vectors (unaligned, not sharing a misalignment) longer than 16
// elements x 512 threads; the split backward needs 16-byte vectors.
#pragma once

#include "norm/kernels/common.cuh"

namespace kernelforge {
namespace norm_detail {

// Backward for rows too long for registers: two passes over the row in global memory (the second
// mostly from L2), kVec elements per access. Pass 1: the statistics in one reduction (the shifted
// sums of norm_bwd_regs); pass 2: dx (and AdaLN's per-row dscale/dshift), and the column sums
// accumulated in this block's own partial rows (read-modify-write; one owner per partial row, so
// the order is fixed and the result deterministic). Used where the split backward cannot run
// (rows that are not 16-byte vectors).
template <typename T, NormOp kOp, int kVec>
__global__ void __launch_bounds__(kBwdStreamTeam, (kOp == NormOp::kAdaRms || kOp == NormOp::kAdaLayer) ? 1 : 2)
    norm_bwd_stream(const NormParams p, const BwdWork wk, const int) {
  if constexpr (!arch_supports<T>()) {
    __trap();
  } else {
    pdl_wait();
    using Tr = OpTraits<kOp>;
    using V = Vec<T, kVec>;
    constexpr int kS = Tr::kLayer ? 4 : 2;
    __shared__ ReduceSmem<kS> sm;
    int slot = 0;
    const int tpr = blockDim.x;
    const int64_t n = p.n, nvec = n / kVec;  // kVec > 1 only when kVec divides n (can_vectorize)
    const T* w = static_cast<const T*>(p.weight);
    const T* bb = static_cast<const T*>(p.bias);
    const V zero = V::zero();
    const int64_t b = blockIdx.x;
    const int64_t g_first = wk.bpg > 1 ? b / wk.bpg : b;
    const int64_t g_step = wk.bpg > 1 ? wk.groups : gridDim.x;
    const bool per_group = wk.grouped && wk.bpg == 1;
    // acc[c] = (first ? 0 : acc[c]) + add[j] for the kVec columns from c (float4 when possible)
    auto accumulate = [&](float* acc, int64_t c, const float(&add)[kVec], bool first) {
      if constexpr (kVec % 4 == 0) {
#pragma unroll
        for (int q = 0; q < kVec; q += 4) {
          float4* a4 = reinterpret_cast<float4*>(acc + c + q);
          float4 v = first ? make_float4(0.f, 0.f, 0.f, 0.f) : *a4;
          v.x += add[q];
          v.y += add[q + 1];
          v.z += add[q + 2];
          v.w += add[q + 3];
          *a4 = v;
        }
      } else {
#pragma unroll
        for (int j = 0; j < kVec; ++j) acc[c + j] = (first ? 0.f : acc[c + j]) + add[j];
      }
    };
    bool first = true;
    for (int64_t grp = g_first; grp < wk.groups; grp += g_step) {
      if (per_group) first = true;
      const int64_t pr = per_group ? grp : b;
      const int64_t r_first = wk.bpg > 1 ? b % wk.bpg : 0, r_step = wk.bpg > 1 ? wk.bpg : 1;
      for (int64_t lr = r_first; lr < wk.group_rows; lr += r_step) {
        const int64_t row = grp * wk.group_rows + lr;
        const T* x = static_cast<const T*>(p.x) + row * p.x_stride;
        const T* dy = static_cast<const T*>(p.dy) + row * p.dy_stride;
        const T* sc = Tr::kAda ? static_cast<const T*>(p.scale) + ada_group(row, p) * p.scale_stride : nullptr;
        const BwdStats bs = row_bwd_stats<T, kOp, kVec, kS, 2>(p, row, sm, slot);
        const float mean = bs.mean, rstd = bs.rstd, mdn = bs.mdn, mdnxh = bs.mdnxh;
#pragma unroll 2
        for (int64_t v = threadIdx.x; v < nvec; v += tpr) {
          const int64_t c = v * kVec;
          const V xv = load_vec<T, kVec>(x + c), dyv = load_vec<T, kVec>(dy + c);
          float dn[kVec], dxf[kVec], ua[kVec], ud[kVec], dscf[kVec];
          V wv, scv, bv = zero;
          bwd_dn<T, kOp, kVec>(w, sc, c, dyv, dn, wv, scv);
          if constexpr (Tr::kAda) {
            if (!wk.grouped && bb) bv = load_vec<T, kVec>(bb + c);
          }
          const V dsv = p.dsum ? load_vec<T, kVec>(static_cast<const T*>(p.dsum) + row * p.dsum_stride + c) : zero;
#pragma unroll
          for (int j = 0; j < kVec; ++j) {
            const float xh = (xv.get(j) - mean) * rstd;
            dxf[j] = rstd * (dn[j] - mdn - xh * mdnxh) + (p.dsum ? dsv.get(j) : 0.f);
            float u = dyv.get(j);
            dscf[j] = 0.f;
            if constexpr (Tr::kAda) {
              if (!wk.grouped) {  // per-row scale: elementwise dscale/dshift; u includes (1 + scale)
                const float nrm = (w ? xh * wv.get(j) : xh) + bv.get(j);
                dscf[j] = u * nrm;
                u *= 1.f + scv.get(j);
              }
            }
            ua[j] = u * xh;
            ud[j] = u;
          }
          store_vec<T, kVec>(static_cast<T*>(p.dx) + row * p.dx_stride + c, V::from(dxf));
          if constexpr (Tr::kAda) {
            if (!wk.grouped) {
              if (p.dscale) store_vec<T, kVec>(static_cast<T*>(p.dscale) + row * n + c, V::from(dscf));
              if (p.dshift) store_vec<T, kVec>(static_cast<T*>(p.dshift) + row * n + c, dyv);
            }
          }
          if (wk.part_a) accumulate(wk.part_a + pr * wk.ld, c, ua, first);
          if (wk.part_d) accumulate(wk.part_d + pr * wk.ld, c, ud, first);
        }
        first = false;
      }
      if (per_group && first) {  // an empty group (R == 0 cannot happen, kept for safety)
        for (int64_t c = threadIdx.x; c < n; c += tpr) {
          if (wk.part_a) wk.part_a[pr * wk.ld + c] = 0.f;
          if (wk.part_d) wk.part_d[pr * wk.ld + c] = 0.f;
        }
      }
    }
    if (!per_group && first) {  // a block without rows still owns its partial row
      for (int64_t c = threadIdx.x; c < n; c += tpr) {
        if (wk.part_a) wk.part_a[b * wk.ld + c] = 0.f;
        if (wk.part_d) wk.part_d[b * wk.ld + c] = 0.f;
      }
    }
  }
}

}  // namespace norm_detail
}  // namespace kernelforge
