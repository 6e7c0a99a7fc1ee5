// Device helpers shared by the normalization kernels: block and cluster reductions, the op traits,
// row statistics (forward and backward), the forward's output element, AdaLN group indexing and the
// backward's work split (BwdWork, BwdSeq) with its per-row statistics pass.
//
// Formulas (include/kernelforge/norm.h): forward y = norm(x) with float32 statistics; backward, with
// xh = (x - mean)·rstd (mean = 0 for RMSNorm), g = dy·(1 + scale) (AdaLN) or dy, dn = g·w:
//   dx = rstd·(dn - mean(dn) - xh·mean(dn·xh))        (mean(dn) only for LayerNorm)
//   dw = Σ_rows g·xh, db = Σ_rows g, dscale = Σ_group dy·(xh·w + b), dshift = Σ_group dy.
// The column sums are accumulated per block in registers (each thread always owns the same columns),
// written as float32 partial rows [blocks, N] and summed in a fixed order by reduce_columns, so the
// parameter gradients are bit-identical run to run.
#pragma once

#include <cuda_runtime.h>

#include <climits>
#include <cstdint>

#include "common/bulk_copy.cuh"
#include "common/cluster.cuh"
#include "common/launch.cuh"
#include "common/vec.cuh"
#include "norm/norm_plan.h"
#include "norm/norm_problem.h"

namespace kernelforge {
namespace norm_detail {

constexpr int kWarps = 32;  // warps in the largest (1024-thread) block

// ---- reductions ---------------------------------------------------------------------------
// Sums K floats over a team of `tpr` threads (power of two >= 32; teams are aligned blocks of
// threads), then over the CTAs of a cluster when cluster > 1. Every thread receives identical
// bits (butterfly sums are symmetric; later stages read the same shared values in the same order).
// Shared slots are double-buffered so that consecutive reductions need one barrier each.
template <int K>
struct Floats {
  float v[K];
};
template <int K>
struct ReduceSmem {
  float team[2][K][kWarps];
  Floats<K> cluster[2];  // this CTA's sums, read by the other CTAs of the cluster
};

// Butterfly sum over the 32 lanes of a warp (symmetric: every lane gets identical bits).
template <int K>
__device__ __forceinline__ void warp_sum(float (&v)[K]) {
#pragma unroll
  for (int k = 0; k < K; ++k)
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) v[k] += __shfl_xor_sync(0xffffffffu, v[k], off);
}

// The CTA sums of every rank of the cluster (common/cluster.cuh: lane r gets rank r's, the other
// lanes zeros), folded by warp_sum. Call with the CTA's sums in every thread.
template <int K>
__device__ __forceinline__ void cluster_sum(float (&v)[K], Floats<K>* pub, int cluster) {
  Floats<K> mine;
#pragma unroll
  for (int k = 0; k < K; ++k) mine.v[k] = v[k];
  const Floats<K> got = cluster_gather(mine, pub, cluster, Floats<K>{});
#pragma unroll
  for (int k = 0; k < K; ++k) v[k] = got.v[k];
  warp_sum<K>(v);
}

template <int K>
__device__ __forceinline__ void team_sum(float (&v)[K], int tpr, int team, ReduceSmem<K>& sm, int& slot, int cluster) {
  warp_sum<K>(v);
  if (tpr > 32) {
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, nw = tpr >> 5;
    if (lane == 0) {
#pragma unroll
      for (int k = 0; k < K; ++k) sm.team[slot][k][warp] = v[k];
    }
    __syncthreads();
#pragma unroll
    for (int k = 0; k < K; ++k) v[k] = lane < nw ? sm.team[slot][k][team * nw + lane] : 0.f;
    warp_sum<K>(v);
  }
  if (cluster > 1) cluster_sum<K>(v, &sm.cluster[slot], cluster);
  slot ^= 1;
}

template <NormOp kOp>
struct OpTraits {
  static constexpr bool kLayer = kOp == NormOp::kLayer || kOp == NormOp::kAdaLayer;
  static constexpr bool kAda = kOp == NormOp::kAdaRms || kOp == NormOp::kAdaLayer;
  static constexpr bool kRes = kOp == NormOp::kAddRms;
  static constexpr bool kHfRms = kOp == NormOp::kRms || kOp == NormOp::kAddRms;  // T(T(xh) * w)
};

// Row statistics from the shifted sums, K = x[row, 0] for LayerNorm (0 for RMSNorm, mean = 0):
//   S1 = Σ(x − K), S2 = Σ(x − K)²  ->  m1 = S1/n, mean = K + m1, var = S2/n − m1², rstd = 1/sqrt(var + eps)
// One reduction instead of two; shifting by a value of the row keeps the cancellation small (error
// ~ eps·(1 + (mean − K)²/var)). var is clamped at 0 against rounding, not with fmaxf, which would
// turn the NaN of an inf input into 0.
struct RowStats {
  float mean, rstd, m1;
};
template <bool kLayer>
__device__ __forceinline__ RowStats row_stats(float s1, float s2, float shift_k, float inv_n, float eps) {
  RowStats r = {0.f, 0.f, 0.f};
  float var = s2 * inv_n;
  if constexpr (kLayer) {
    r.m1 = s1 * inv_n;
    r.mean = shift_k + r.m1;
    var -= r.m1 * r.m1;
    var = var < 0.f ? 0.f : var;
  }
  r.rstd = rsqrtf(var + eps);
  return r;
}

// Backward statistics from one reduction of st = {S2, G2[, S1, G1]} (G1 = Σdn, G2 = Σdn·(x − K)):
// mean(dn) = G1/n, mean(dn·xh) = rstd·(G2/n − m1·G1/n) (xh = (x − K − m1)·rstd).
struct BwdStats {
  float mean, rstd, mdn, mdnxh;
};
template <bool kLayer, int kS>
__device__ __forceinline__ BwdStats bwd_stats(const float (&st)[kS], float shift_k, float inv_n, float eps) {
  const RowStats r = row_stats<kLayer>(kLayer ? st[kS - 2] : 0.f, st[0], shift_k, inv_n, eps);
  const float mdn = kLayer ? st[kS - 1] * inv_n : 0.f;
  return {r.mean, r.rstd, mdn, r.rstd * (st[1] * inv_n - r.m1 * mdn)};
}

// Output of one element of the forward: xh is the normalized value (float32); kW / kB: the call
// has a weight / bias.
template <typename T, NormOp kOp, bool kW, bool kB>
__device__ __forceinline__ float fwd_value(float xh, float w, float b, float sc, float sh) {
  using Tr = OpTraits<kOp>;
  float y;
  if constexpr (Tr::kHfRms) {
    y = kW ? round_to<T>(xh) * w : xh;
  } else {
    y = kW ? xh * w : xh;
    if constexpr (kB) y += b;
    if constexpr (Tr::kAda) y = y * (1.f + sc) + sh;
  }
  return y;
}

template <typename T, NormOp kOp, int kVec, bool kW, bool kB>
__device__ __forceinline__ void fwd_out_elems(const Vec<T, kVec>& xv, float mean, float rstd, const Vec<T, kVec>& wv,
                                              const Vec<T, kVec>& bv, const Vec<T, kVec>& scv, const Vec<T, kVec>& shv,
                                              float (&out)[kVec]) {
  using Tr = OpTraits<kOp>;
  if constexpr (Tr::kAda && !kW && !kB) {
    // AdaLN without affine parameters (DiT, LTX-Video): y = (x − mean)·a + shift, a = rstd·(1 + scale)
    // = fma(rstd, scale, rstd): 3 float ops per element instead of 4 (sub, mul, add 1, fma).
#pragma unroll
    for (int j = 0; j < kVec; ++j) out[j] = fmaf(xv.get(j) - mean, fmaf(rstd, scv.get(j), rstd), shv.get(j));
  } else {
#pragma unroll
    for (int j = 0; j < kVec; ++j) {
      const float xh = (xv.get(j) - mean) * rstd;
      const float w = kW ? wv.get(j) : 1.f, b = kB ? bv.get(j) : 0.f;
      const float sc = Tr::kAda ? scv.get(j) : 0.f, sh = Tr::kAda ? shv.get(j) : 0.f;
      out[j] = fwd_value<T, kOp, kW, kB>(xh, w, b, sc, sh);
    }
  }
}

// One output vector of the forward from the row vector `xv` and the statistics; w, b, scale, shift
// are the matching parameter vectors (ignored where the op has none). Shared by all forward kernels.
// The element loop is specialized on whether weight and bias are present (a uniform branch): with
// one loop for every case, the absent ones still cost their unpacking and predicated math (AdaLN
// without weight/bias ran ~1.8x the instructions of LayerNorm per output vector).
template <typename T, NormOp kOp, int kVec>
__device__ __forceinline__ Vec<T, kVec> fwd_out(const Vec<T, kVec>& xv, float mean, float rstd, const NormParams& p,
                                                const Vec<T, kVec>& wv, const Vec<T, kVec>& bv, const Vec<T, kVec>& scv,
                                                const Vec<T, kVec>& shv) {
  using Tr = OpTraits<kOp>;
  const bool has_w = p.weight != nullptr, has_b = !Tr::kHfRms && p.bias != nullptr;
  float out[kVec];
  if (has_w) {
    if (has_b)
      fwd_out_elems<T, kOp, kVec, true, true>(xv, mean, rstd, wv, bv, scv, shv, out);
    else
      fwd_out_elems<T, kOp, kVec, true, false>(xv, mean, rstd, wv, bv, scv, shv, out);
  } else {
    if (has_b)
      fwd_out_elems<T, kOp, kVec, false, true>(xv, mean, rstd, wv, bv, scv, shv, out);
    else
      fwd_out_elems<T, kOp, kVec, false, false>(xv, mean, rstd, wv, bv, scv, shv, out);
  }
  return Vec<T, kVec>::from(out);
}

// a / b for 0 <= a, 0 < b: a 32-bit division when both fit (the 64-bit one is a long subroutine).
__device__ __forceinline__ int64_t div_nonneg(int64_t a, int64_t b) {
  return (uint64_t(a) | uint64_t(b)) <= UINT32_MAX ? int64_t(uint32_t(a) / uint32_t(b)) : a / b;
}

// AdaLN scale/shift group of x row r: g = r / ada_rpg, without a division when the rows fit in 31
// bits (a division is ~25 dependent instructions, the 64-bit one a long subroutine, paid per row).
__device__ __forceinline__ int64_t ada_group(int64_t r, const NormParams& p) {
  if (p.ada_rpg == 1) return r;
  if (p.rows <= INT_MAX && p.ada_rpg <= INT_MAX)  // multiply-high, add, shift (make_fast_div)
    return int64_t((__umulhi(p.ada_mul, uint32_t(r)) + uint32_t(r)) >> p.ada_shr);
  return r / p.ada_rpg;
}

// ---- backward -------------------------------------------------------------------------------
// Column sums. With u = dy·(1 + scale) (AdaLN with one scale row per x row) or u = dy (otherwise),
// every block accumulates A = Σ u·xh and D = Σ u over its rows for the columns its threads own.
//   RMSNorm/LayerNorm:        dw = Σ_blocks A, db = Σ_blocks D
//   AdaLN, per-row scale:     the same, and dscale = dy·(xh·w + b), dshift = dy written per row
//   AdaLN, grouped scale (R > 1 rows share a scale row; scale is constant within a group):
//     A_g, D_g summed per group, then dshift_g = D_g, dscale_g = w·A_g + b·D_g,
//     dw = Σ_g (1 + scale_g)·A_g, db = Σ_g (1 + scale_g)·D_g.
// So two accumulators per element suffice for every op.
//
// Work split: G groups of R consecutive rows (G = 1, R = rows unless grouped). With bpg > 1, block b
// works on group b / bpg, rows (b % bpg) + k·bpg, and writes partial row b; with bpg == 1, block b
// loops over groups b, b + gridDim.x, ... and writes partial row g at the end of each group.
struct BwdWork {
  int64_t groups;      // G
  int64_t group_rows;  // R
  int64_t bpg;         // blocks per group (1: groups per block instead)
  bool grouped;
  int64_t ld;               // row stride of the partial rows: N rounded up to 4 (16-byte rows for the reduction)
  float* part_a;            // [partial rows, ld]: Σ u·xh   (nullptr: not needed)
  float* part_d;            // [partial rows, ld]: Σ u
  int64_t chunk;            // norm_bwd_chunk: rows per chunk (a chunk never spans two groups)
  const float4* row_stats;  // split backward: {mean, rstd, mdn, mdnxh} per row (norm_bwd_rowstats)
};

// The rows of one block, in order: k = 0, 1, ... (see the work split above). row_of returns -1 past
// the end; group_end tells when a block that owns whole groups has finished one.
struct BwdSeq {
  int64_t b, grid, bpg, R, G;
  int64_t bgroup, blr;  // bpg > 1: this block's group b / bpg and first row in it b % bpg
  __device__ __forceinline__ BwdSeq(int64_t b_, int64_t grid_, int64_t bpg_, int64_t R_, int64_t G_)
      : b(b_), grid(grid_), bpg(bpg_), R(R_), G(G_) {
    bgroup = div_nonneg(b, bpg);
    blr = b - bgroup * bpg;
  }
  // Group of the block's k-th row (valid when row_of(k) >= 0).
  __device__ __forceinline__ int64_t group_of(int64_t k) const {
    return bpg > 1 ? bgroup : b + div_nonneg(k, R) * grid;
  }
  __device__ __forceinline__ int64_t row_of(int64_t k) const {
    if (bpg > 1) {
      const int64_t lr = blr + k * bpg;
      return lr < R ? bgroup * R + lr : -1;
    }
    const int64_t q = div_nonneg(k, R), grp = b + q * grid;
    return grp < G ? grp * R + (k - q * R) : -1;
  }
};

// dn = dy·(1 + scale)·w for the kVec elements at column c of a row (w, sc: the weight and the row's
// AdaLN scale row, or nullptr); wv, scv: the loaded vectors (zero when absent).
template <typename T, NormOp kOp, int kVec>
__device__ __forceinline__ void bwd_dn(const T* w, const T* sc, int64_t c, const Vec<T, kVec>& dyv, float (&dn)[kVec],
                                       Vec<T, kVec>& wv, Vec<T, kVec>& scv) {
  wv = w ? load_vec<T, kVec>(w + c) : Vec<T, kVec>::zero();
  scv = Vec<T, kVec>::zero();
  if constexpr (OpTraits<kOp>::kAda) scv = load_vec<T, kVec>(sc + c);
#pragma unroll
  for (int j = 0; j < kVec; ++j) {
    float g = dyv.get(j);
    if constexpr (OpTraits<kOp>::kAda) g *= 1.f + scv.get(j);
    dn[j] = w ? g * wv.get(j) : g;
  }
}

// The backward's row statistics (bwd_stats) from one pass over x and dy of `row` in global memory,
// the whole block as one team: the shifted sums {S2, G2[, S1, G1]}, K = x[row, 0], one reduction.
template <typename T, NormOp kOp, int kVec, int kS, int kUnroll>
__device__ __forceinline__ BwdStats row_bwd_stats(const NormParams& p, int64_t row, ReduceSmem<kS>& sm, int& slot) {
  using Tr = OpTraits<kOp>;
  using V = Vec<T, kVec>;
  const int64_t nvec = p.n / kVec;  // kVec > 1 only when kVec divides n (can_vectorize)
  const T* x = static_cast<const T*>(p.x) + row * p.x_stride;
  const T* dy = static_cast<const T*>(p.dy) + row * p.dy_stride;
  const T* w = static_cast<const T*>(p.weight);
  const T* sc = Tr::kAda ? static_cast<const T*>(p.scale) + ada_group(row, p) * p.scale_stride : nullptr;
  const float shift_k = Tr::kLayer ? to_float(x[0]) : 0.f;
  float st[kS];
#pragma unroll
  for (int q = 0; q < kS; ++q) st[q] = 0.f;
#pragma unroll kUnroll
  for (int64_t v = threadIdx.x; v < nvec; v += blockDim.x) {
    const int64_t c = v * kVec;
    const V xv = load_vec<T, kVec>(x + c), dyv = load_vec<T, kVec>(dy + c);
    float dn[kVec];
    V wv, scv;
    bwd_dn<T, kOp, kVec>(w, sc, c, dyv, dn, wv, scv);
#pragma unroll
    for (int j = 0; j < kVec; ++j) {
      const float d = xv.get(j) - shift_k;
      st[0] += d * d;
      st[1] += dn[j] * d;
      if constexpr (Tr::kLayer) {
        st[2] += d;
        st[3] += dn[j];
      }
    }
  }
  team_sum<kS>(st, int(blockDim.x), 0, sm, slot, 1);
  return bwd_stats<Tr::kLayer>(st, shift_k, 1.f / float(p.n), p.eps);
}

}  // namespace norm_detail
}  // namespace kernelforge
