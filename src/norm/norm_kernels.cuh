// Normalization kernels: RMSNorm, residual-add RMSNorm, LayerNorm, AdaLN — forward and backward.
//
// Forward: y[r, :] = norm(x[r, :]) (formulas in include/kernelforge/norm.h). Minimum traffic is one
// read of x and one write of y: 2·M·N·sizeof(T) bytes (add_rms_norm: 4·M·N). At ~3.0 TB/s copy
// bandwidth, M=16384 N=4096 bf16 -> 268 MB -> ~90 µs floor.
//   * A team of `tpr` threads (a power of two, 32..1024) owns one row; each thread holds kIters
//     vectors of kVec elements in registers (vector v = i·tpr + t, so a team's loads are
//     coalesced), so x is read from DRAM exactly once and the statistics cost only block reductions.
//   * Rows longer than one CTA can hold are split over a thread-block cluster (sm_90): each CTA holds
//     a slice in registers and the partial sums are exchanged through distributed shared memory.
//   * Longer still (or no clusters): a streaming kernel re-reads the row (correct, slower).
//
// Backward: with xh = (x - mean)·rstd (mean = 0 for RMS), g = dy·(1 + scale) (ada) or dy, dn = g·w:
//   dx = rstd·(dn - mean(dn) - xh·mean(dn·xh))        (mean(dn) only for LayerNorm)
//   dw = Σ_rows g·xh, db = Σ_rows g, dscale = Σ_group dy·(xh·w + b), dshift = Σ_group dy.
// Minimum traffic: read x, dy, write dx: 3·M·N·sizeof(T) (+ dsum for add_rms_norm). The column sums
// are accumulated per block in registers (each thread always owns the same columns), written as
// float32 partials [blocks, N], and summed in a fixed order by reduce_columns: deterministic.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <climits>
#include <cstdlib>
#include <mutex>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "common/bulk_copy.cuh"
#include "common/cluster.cuh"
#include "common/device.h"
#include "common/launch.cuh"
#include "common/vec.cuh"
#include "norm/norm_problem.h"

namespace kernelforge {
namespace norm_detail {

constexpr int kWarps = 32;  // warps in the largest (1024-thread) block

// ---- tuning tables (measured on H100, see notes/norm.md) ------------------------------------
struct NormTuning {
  int target_team;   // threads per row aimed for at large N: more vectors per thread beyond it
  int max_elems;     // register-resident elements per thread (forward; x only)
  int cluster_team;  // team size per CTA once a row is split over a cluster (sm_90)
  int min_block;     // rows of small N are packed into blocks of at least this many threads
};
template <typename T>
constexpr NormTuning kFwdTuning = {256, 64, 512, 128};
template <>
constexpr NormTuning kFwdTuning<float> = {256, 32, 512, 128};

constexpr int kFwdPersist = 0;  // register forward: persistent grid (1) or one row group per block (0)
// norm_fwd_row: 16-byte vectors of x per thread, by op (measured in notes/norm.md: 2 is best or level
// for every op at N = 2048-8192 since the packed vectors stopped spilling).
constexpr int kFwdRowIters = 2;
constexpr int kFwdMaxTeam = 512;     // register-resident forward: at most 512 threads (128 registers each)
constexpr int kBwdTargetTeam = 128;  // threads per row aimed for: 2 vectors per thread from N = 2048 (bf16)
constexpr int kBwdMaxTeam = 512;     // register-resident backward: 128 registers per thread
constexpr int kBwdMaxElems = 16;     // per thread: x, dy and up to four column accumulators
constexpr int kBwdMinTeam = 128;
constexpr int kBwdStreamTeam = 512;  // threads per row of the streaming backward (128 registers each)
// Split backward (long rows): column tiles of kSplitTeam threads x kSplitIters vectors (4096 bf16 columns).
constexpr int kSplitTeam = 256;
constexpr int kSplitIters = 2;
// norm_bwd_chunk (sm_90): threads per block aimed for (one 16-byte vector per thread up to 256
// vectors, two above), stages and shared memory per block (96 KB: two blocks per SM; twice that with
// two vectors per thread).
constexpr int kBwdChunkTeam = 256;
constexpr int kBwdChunkStages = 3;
constexpr int kBwdChunkSmem = 96 * 1024;
// Register cap of the backward register kernel (build-time switch for sweeps; 0: only the 512-thread
// launch bound, i.e. up to 128 registers).
#ifndef KF_BWD_MAXNREG
#define KF_BWD_MAXNREG 0
#endif
#if KF_BWD_MAXNREG > 0  // (the two qualifiers exclude each other; 512 x KF_BWD_MAXNREG must fit 64K)
#define KF_BWD_REG_ATTR __maxnreg__(KF_BWD_MAXNREG)
#else
#define KF_BWD_REG_ATTR __launch_bounds__(kBwdMaxTeam)
#endif
#ifndef KF_FWD_PARAMS_FIRST  // norm_fwd_row: AdaLN scale/shift loads of a row before its stores (sweeps)
#define KF_FWD_PARAMS_FIRST 0
#endif
#ifndef KF_BWD_ADA_REREAD  // build-time switch for sweeps (scripts/gpu_sweep.sh KF_SWEEP_FLAGS)
#define KF_BWD_ADA_REREAD 1
#endif

inline int pow2_ceil(int64_t v) {
  int p = 1;
  while (p < v) p <<= 1;
  return p;
}

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

// ---- forward, row in registers ----------------------------------------------------------------
// A team of 2^tpr_shift threads owns a row; thread t holds vectors t, t + tpr, ... (coalesced).
// Every load a row needs (x, residual, AdaLN scale/shift) is issued before the first reduction, and
// weight/bias are loaded once per block into registers (kParamRegs): a block's lifetime is then one
// DRAM round trip plus the reductions, with no L2 round trip after them. Little's law sets the
// bandwidth: bytes in flight per SM = resident threads x bytes per thread.
// persist == 0: one row group per block (the scheduler overlaps blocks). persist == 1: a resident
// grid loops over rows, prefetching the next row during the current one when the slice is small
// (kPipe). cluster > 1 (sm_90): a row is split over the CTAs of a cluster (DSMEM reductions).
template <typename T, NormOp kOp, int kVec, int kIters>
__global__ void __launch_bounds__(kFwdMaxTeam)
    norm_fwd_regs(const NormParams p, const int tpr_shift, const int cluster) {
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

// ---- forward, one row group per block -------------------------------------------------------------
// The simplest register kernel: a block of rpb teams handles rows blockIdx.x·rpb + team and exits
// (the grid loops only past 2^31-1 blocks); the hardware overlaps resident blocks. Bandwidth follows
// Little's law: bytes in flight per SM = resident threads × x bytes per thread, so registers are
// spent on x alone. Before the reductions only x (and residual) are loaded; weight, bias and AdaLN
// scale/shift are read after them, from L1/L2 (every block of an SM reads the same weight row; an
// L2 prefetch is issued early for the scale/shift row). Rows are addressed by one 64-bit base per
// tensor and 32-bit column offsets (N < 2^31).
// Register budget per thread of norm_fwd_row by op and x bytes per thread (16-byte slots 1, 2, 4,
// 8+): x takes 4 registers per slot and the rest ~24-40; capping the count raises resident threads,
// and so bytes in flight per SM. Measured in notes/norm.md. The kernel's blocks have <= 256 threads.
constexpr int kFwdRowMaxBlock = 256;
// kSmThreads (common/launch.cuh): resident threads per SM of the architecture being compiled.
// Blocks of 512 threads (kFwdRowBigBlock): 3 resident per SM (40 registers), 4 for
// AdaLN without weight and bias (32 registers, no spill; 16384x8192 187.1 -> 184.5 us). At 4, rms and
// LayerNorm spill 16 / 48 B and slow down (181.5 -> 196.8, 182.3 -> 239.1 us).
template <int kBlock, int kRegs, bool kPlain>
constexpr int kFwdRowMinBlocks = kBlock > kFwdRowMaxBlock ? std::max(1, std::min(kSmThreads / kBlock, kPlain ? 4 : 3))
                                                          : std::min(65536 / (kBlock * kRegs), kSmThreads / kBlock);
// Registers per thread by op (rows) and 16-byte x slots per thread 1 / 2 / 4 (columns); 8+ slots: 128.
// add_rms_norm at 4 slots holds x and residual in flight (32 registers): ptxas spilled 16 B at 64;
// at 72 (3 blocks of 256 threads per SM instead of 4) it does not, and 16384x8192 went 372 -> 362 us.
// LayerNorm at 2 slots fits 40 without a spill: 6 blocks of 256 per SM instead of 5 (16384x4096
// 94.5 -> 94.2 us, session 13). LayerNorm-kind AdaLN at 2 slots fits 40 without a spill once its
// scale/shift vectors are loaded per output vector (KF_FWD_PARAMS_FIRST=0; loaded all before the
// first store they took 47-48 registers and spilled 16 B with weight/bias): 6 blocks instead of 5,
// 16384x4096 97.5 -> 96.2 us (session 13; in session 6, at 48 registers, per-vector loads were slower).
#ifndef KF_FWD_REGS_ADD4  // sweeps
#define KF_FWD_REGS_ADD4 72
#endif
#ifndef KF_FWD_REGS_ADA2
#define KF_FWD_REGS_ADA2 40
#endif
constexpr int kFwdRowRegTable[5][3] = {
    {32, 40, 64},                // rms
    {40, 48, KF_FWD_REGS_ADD4},  // add_rms
    {40, 40, 64},                // layer
    {40, 48, 64},                // ada, rms kind
    {40, KF_FWD_REGS_ADA2, 64},  // ada, layer kind
};
// x registers per thread in 16-byte slots (4 registers each). A one-element vector of a 2-byte type
// still takes a whole 32-bit register: 16 bf16 elements are 4 slots, not 2. Counting bytes gave the
// scalar path (odd N, unaligned views) too small a budget and it spilled: 16384x4095 bf16 forward
// LayerNorm 589 -> 200 us, RMSNorm 415 -> 158, add_rms_norm 572 -> 247, AdaLN 392 -> 301 (session 13).
constexpr int fwd_row_slots(int elem_bytes, int vec, int iters) { return iters * std::max(vec * elem_bytes, 4) / 16; }
template <NormOp kOp, int kSlots>
constexpr int kFwdRowRegs = kSlots <= 0   ? 128
                            : kSlots <= 1 ? kFwdRowRegTable[int(kOp)][0]
                            : kSlots <= 2 ? kFwdRowRegTable[int(kOp)][1]
                            : kSlots <= 4 ? kFwdRowRegTable[int(kOp)][2]
                                          : 128;

// Blocks per SM the row kernel is compiled for (__launch_bounds__). kBody kernels get the register
// budget of twice their x slots, at least 64 (512-thread blocks: two per SM): at the aligned rows'
// budget ptxas spilled 20-140 B (the parameter loads take one of four widths).
#ifndef KF_FWD_BODY_WIDE  // sweeps: 0 = the aligned rows' budget
#define KF_FWD_BODY_WIDE 1
#endif
template <typename T, NormOp kOp, int kVec, int kIters, bool kEarly, bool kPlain, int kBlock, bool kBody>
constexpr int kFwdRowBounds =
    kEarly ? 1
    : !(kBody && KF_FWD_BODY_WIDE)
        ? kFwdRowMinBlocks<kBlock, kFwdRowRegs<kOp, fwd_row_slots(int(sizeof(T)), kVec, kIters)>, kPlain>
    : kBlock > kFwdRowMaxBlock
        ? 2
        : kFwdRowMinBlocks<kBlock, kFwdRowRegs<kOp, std::max(4, 2 * fwd_row_slots(int(sizeof(T)), kVec, kIters))>,
                           kPlain>;

// kEarly (a grid of at most one block per SM, e.g. decode rows): occupancy does not matter, latency
// does, so weight, bias and AdaLN scale/shift are loaded together with x, before the reductions
// (one memory round trip per block instead of two), and there is no register cap.
// kPlain (AdaLN without weight and bias, the DiT / LTX-Video case): the output loop is compiled for
// that case alone instead of branching per vector over the four weight/bias variants.
// kBlock: the largest block the instantiation takes: kFwdRowMaxBlock, or kFwdRowBigBlock (512 threads
// x 2 vectors for 8 KB rows of rms / LayerNorm / AdaLN without weight and bias).
// kBody (odd N, or views whose rows start off a 16-byte boundary, with x, y, residual and sum sharing
// their misalignment): each row's first hd = head_elems(x row) < kVec elements are a scalar head held
// by threads t < hd, 16-byte vectors of x / y start after it and the last one may be partial.
// Weight, bias and scale/shift are then read at columns hd + 8k, off their own 16-byte boundaries:
// load_vec_any (8-, 4- or 2-byte accesses, L1 hits). Padding elements of the partial vector hold the
// LayerNorm shift K, so they add exactly 0 to both shifted sums.
template <typename T, NormOp kOp, int kVec, int kIters, bool kEarly, bool kPlain = false, int kBlock = kFwdRowMaxBlock,
          bool kBody = false>
__global__ void __launch_bounds__(kBlock, kFwdRowBounds<T, kOp, kVec, kIters, kEarly, kPlain, kBlock, kBody>)
    norm_fwd_row(const NormParams p, const int tpr_shift) {
  static_assert(!(kBody && kEarly), "the scalar-head forward loads its parameters after the reduction");
  if constexpr (!arch_supports<T>()) {
    __trap();
  } else {
    pdl_wait();
    if constexpr (kEarly) {
      if (p.trigger) pdl_trigger();  // the whole grid is resident
    }
    using Tr = OpTraits<kOp>;
    using V = Vec<T, kVec>;
    constexpr int kR = Tr::kRes ? kIters : 1;  // residual vectors
    __shared__ ReduceSmem<Tr::kLayer ? 2 : 1> sm;
    int slot = 0;
    const int tpr = 1 << tpr_shift;
    const int rpb = int(blockDim.x) >> tpr_shift;
    const int team = int(threadIdx.x) >> tpr_shift;
    const int t = int(threadIdx.x) & (tpr - 1);
    const float inv_n = p.inv_n;
    for (int64_t base = int64_t(blockIdx.x) * rpb; base < p.rows; base += int64_t(gridDim.x) * rpb) {
      const int64_t row = base + team;
      const bool row_ok = row < p.rows;
      const int64_t r = row_ok ? row : 0;
      const T* __restrict__ xr = static_cast<const T*>(p.x) + r * p.x_stride;
      const T* __restrict__ rr = static_cast<const T*>(p.residual) + r * p.res_stride;
      // kBody: the head (hd elements, thread t < hd holds element t) and the row from hd on
      int n = int(p.n), hd = 0;
      float hx = 0.f, hr = 0.f;
      if constexpr (kBody) {
        hd = head_elems(xr, n);
        if (row_ok && t < hd) {
          hx = to_float(xr[t]);
          if constexpr (Tr::kRes) hr = to_float(rr[t]);
        }
      }
      const T* __restrict__ wg = p.weight ? static_cast<const T*>(p.weight) + hd : nullptr;
      const T* __restrict__ bg = p.bias ? static_cast<const T*>(p.bias) + hd : nullptr;
      // Scale/shift rows before the reductions only where they are used there (kEarly, or one row
      // per x row: an L2 prefetch, no division); else they are computed after (below), so that no
      // division delays the loads of x.
      const int64_t ge = !Tr::kAda ? 0 : kEarly ? ada_group(r, p) : r;
      const T* __restrict__ scr = static_cast<const T*>(p.scale) + ge * p.scale_stride + hd;
      const T* __restrict__ shr = static_cast<const T*>(p.shift) + ge * p.shift_stride + hd;
      V xv[kIters], rv[kR];
      constexpr int kE = kEarly ? kIters : 1;
      V we[kE], be[kE], sce[kE], she[kE];  // kEarly: parameters loaded with x
      const float shift_k = Tr::kLayer && row_ok ? to_float(xr[0]) : 0.f;
      xr += hd, rr += hd, n -= hd;
#pragma unroll
      for (int i = 0; i < kIters; ++i) {
        const int col = (t + i * tpr) * kVec;
        if (row_ok && col < n) {
          if constexpr (kBody) {
            xv[i] = load_row_vec<T, kVec>(xr, col, n, shift_k);
            if constexpr (Tr::kRes) rv[i] = load_row_vec<T, kVec>(rr, col, n, 0.f);
          } else {
            xv[i] = load_vec<T, kVec>(xr + col);
            if constexpr (Tr::kRes) rv[i] = load_vec<T, kVec>(rr + col);
          }
          if constexpr (kEarly) {
            if (wg) we[i] = load_vec<T, kVec>(wg + col);
            if constexpr (!Tr::kHfRms) {
              if (bg) be[i] = load_vec<T, kVec>(bg + col);
            }
            if constexpr (Tr::kAda) {
              sce[i] = load_vec<T, kVec>(scr + col);
              she[i] = load_vec<T, kVec>(shr + col);
            }
          }
        } else {
          xv[i] = rv[Tr::kRes ? i : 0] = V::zero();
        }
      }
      // A scale/shift row per x row (ada_rpg == 1): DRAM reads, start them now. In a loop of its own:
      // this branch inside the loop above split it, and the compiler then issued the last x load
      // only after the first use of x[row, 0] (one more DRAM round trip per row; Nsight Compute
      // source counters at 16384x8192, AdaLN 205 vs LayerNorm 176 us).
      if constexpr (Tr::kAda && !kEarly) {
        if (p.ada_rpg == 1) {
#pragma unroll
          for (int i = 0; i < kIters; ++i) {
            const int col = (t + i * tpr) * kVec;
            if (row_ok && col < n) {
              prefetch_l2(scr + col);
              prefetch_l2(shr + col);
            }
          }
        }
      }
      if constexpr (Tr::kRes) {  // s = T(x + residual), written out for the next block
        T* __restrict__ sr = static_cast<T*>(p.sum) + r * p.sum_stride;
        if constexpr (kBody) {
          if (row_ok && t < hd) {
            hx = round_to<T>(hx + hr);
            sr[t] = from_float<T>(hx);
          }
          sr += hd;
        }
#pragma unroll
        for (int i = 0; i < kIters; ++i) {
          float f[kVec];
#pragma unroll
          for (int j = 0; j < kVec; ++j) f[j] = xv[i].get(j) + rv[i].get(j);
          xv[i] = V::from(f);
          const int col = (t + i * tpr) * kVec;
          if (row_ok && col < n) {
            if constexpr (kBody)
              store_row_vec<T, kVec>(sr, col, n, f);
            else
              store_vec<T, kVec>(sr + col, xv[i]);
          }
        }
      }
      // One reduction for both statistics: the shifted sums S1, S2 of row_stats (K = x[row, 0]).
      constexpr int kS = Tr::kLayer ? 2 : 1;
      float st[kS];
#pragma unroll
      for (int k = 0; k < kS; ++k) st[k] = 0.f;
#pragma unroll
      for (int i = 0; i < kIters; ++i) {
        const bool ok = (t + i * tpr) * kVec < n;
#pragma unroll
        for (int j = 0; j < kVec; ++j) {
          const float d = xv[i].get(j) - shift_k;
          st[kS - 1] += ok ? d * d : 0.f;
          if constexpr (Tr::kLayer) st[0] += ok ? d : 0.f;
        }
      }
      if constexpr (kBody) {  // the head element (0 for threads without one)
        const float d = t < hd ? hx - shift_k : 0.f;
        st[kS - 1] += d * d;
        if constexpr (Tr::kLayer) st[0] += d;
      }
      team_sum<kS>(st, tpr, team, sm, slot, 1);
      const RowStats rs = row_stats<Tr::kLayer>(st[0], st[kS - 1], shift_k, inv_n, p.eps);
      const float mean = rs.mean, rstd = rs.rstd;
      T* __restrict__ yr = static_cast<T*>(p.y) + r * p.y_stride;
      // The scale/shift rows are recomputed here from a laundered row index, so that neither they nor
      // the group index stay live (in registers) across the reduction.
      int64_t rl = r;
      if constexpr (Tr::kAda && !kEarly) asm volatile("" : "+l"(rl));
      const int64_t gl = Tr::kAda ? ada_group(rl, p) : 0;
      const T* __restrict__ scl = static_cast<const T*>(p.scale) + gl * p.scale_stride + hd;
      const T* __restrict__ shl = static_cast<const T*>(p.shift) + gl * p.shift_stride + hd;
      if constexpr (kBody) {
        if (row_ok && t < hd) {  // the head: one element per thread, parameters at column t
          using V1 = Vec<T, 1>;
          V1 xh, wh = V1::zero(), bh = V1::zero(), sch = V1::zero(), shh = V1::zero();
          xh.set(0, hx);
          if (p.weight) wh = load_vec<T, 1>(wg + t - hd);
          if (!Tr::kHfRms && p.bias) bh = load_vec<T, 1>(bg + t - hd);
          if constexpr (Tr::kAda) {
            sch = load_vec<T, 1>(scl + t - hd);
            shh = load_vec<T, 1>(shl + t - hd);
          }
          store_vec<T, 1>(yr + t, fwd_out<T, kOp, 1>(xh, mean, rstd, p, wh, bh, sch, shh));
        }
        yr += hd;
      }
      // AdaLN scale/shift vectors: with KF_FWD_PARAMS_FIRST (off: more registers, fewer blocks per SM)
      // all of the row's are loaded before its first store, so that the block pays one L1/L2 round
      // trip after the reduction instead of one per vector (the compiler does not move loads across
      // the stores to y, which may alias).
      // Weight and bias stay per vector (the same for every row: L1 hits; more registers would spill).
      constexpr int kP =
          (KF_FWD_PARAMS_FIRST && Tr::kAda && !kEarly && kIters <= 2 && kBlock <= kFwdRowMaxBlock) ? kIters : 1;
      V scp[kP], shp[kP];
      // kBody: parameters at any element offset, and the row's last vector may be partial
      auto load_param = [&](const T* src, int col) {
        if constexpr (kBody)
          return load_vec_any<T, kVec>(src, col, n);
        else
          return load_vec<T, kVec>(src + col);
      };
      auto store_y = [&](int col, const V& v) {
        if constexpr (kBody)
          store_row_vec<T, kVec>(yr, col, n, v);
        else
          store_vec<T, kVec>(yr + col, v);
      };
      if constexpr (kP > 1) {
#pragma unroll
        for (int i = 0; i < kIters; ++i) {
          const int col = (t + i * tpr) * kVec;
          if (row_ok && col < n) {
            scp[i] = load_param(scl, col);
            shp[i] = load_param(shl, col);
          }
        }
      }
#pragma unroll
      for (int i = 0; i < kIters; ++i) {
        const int col = (t + i * tpr) * kVec;
        if (!(row_ok && col < n)) continue;
        V wv, bv, scv, shv;
        if constexpr (kEarly) {
          wv = we[i];
          bv = be[i];
          scv = sce[i];
          shv = she[i];
        } else {
          if constexpr (!kPlain) {
            if (wg) wv = load_param(wg, col);
            if constexpr (!Tr::kHfRms) {
              if (bg) bv = load_param(bg, col);
            }
          }
          if constexpr (Tr::kAda) {
            if constexpr (kP > 1) {
              scv = scp[i];
              shv = shp[i];
            } else {
              scv = load_param(scl, col);
              shv = load_param(shl, col);
            }
          }
        }
        launder(xv[i]);  // convert x again here rather than keep its float32 copy live (registers)
        if constexpr (kPlain) {
          float out[kVec];
          fwd_out_elems<T, kOp, kVec, false, false>(xv[i], mean, rstd, wv, bv, scv, shv, out);
          store_y(col, V::from(out));
        } else {
          store_y(col, fwd_out<T, kOp, kVec>(xv[i], mean, rstd, p, wv, bv, scv, shv));
        }
      }
    }
  }
}

// ---- forward, Hopper bulk-copy pipeline ----------------------------------------------------------
// sm_90: each CTA owns one slice of a row (the whole row, or 1/C of it inside a cluster of C CTAs).
// Thread 0 streams slices of the next S-1 rows into shared memory with cp.async.bulk (the copy
// engine, completion on an mbarrier), so DRAM reads stay in flight while the current row is
// reduced from shared memory and written out. Registers hold nothing row-sized: many threads per SM.
constexpr int kBulkMaxStages = 4;
// Vectors per thread whose parameters are loaded together in the output pass (registers: 4 per
// parameter vector; AdaLN may have four parameter tensors).
template <NormOp kOp>
constexpr int kBulkOutChunk = OpTraits<kOp>::kAda ? 2 : 4;

// kPV > 0 (not AdaLN): thread t's weight/bias vectors (v = t + c·tpr, c < kPV; svec <= kPV·tpr) are
// loaded once and held in registers for every row (no per-row L2 reads of the parameters).
// kChunk: the output pass's parameter vectors per chunk (1: loaded per vector, fewest registers).
template <typename T, NormOp kOp, int kVec, int kPV = 0, int kChunk = kBulkOutChunk<kOp>>
__global__ void __launch_bounds__(512) norm_fwd_bulk(const NormParams p, const int cluster, const int stages) {
  if constexpr (!arch_supports<T>()) {
    __trap();
  } else {
    pdl_wait();
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    using Tr = OpTraits<kOp>;
    using V = Vec<T, kVec>;
    extern __shared__ __align__(128) unsigned char dyn_smem[];
    __shared__ __align__(8) uint64_t bars[kBulkMaxStages];
    __shared__ ReduceSmem<Tr::kLayer ? 2 : 1> sm;
    int slot = 0;
    const int tpr = blockDim.x, t = threadIdx.x;
    const RowSlice<T, kVec> sl(p.n, cluster);  // this CTA's columns of every row
    const int64_t slice = sl.len, col0 = sl.col0, svec = sl.nvec;
    const int nbuf = Tr::kRes ? 2 : 1;
    T* stage_base = reinterpret_cast<T*>(dyn_smem);  // [stages][nbuf][slice]
    const float inv_n = 1.f / float(p.n), inv_slice = 1.f / float(slice);
    const bool has_w = p.weight != nullptr, has_b = p.bias != nullptr;

    auto issue = [&](int64_t row, int s) {  // thread 0 only
      mbar_expect(&bars[s], sl.bytes * nbuf);
      T* dst = stage_base + int64_t(s) * nbuf * slice;
      bulk_load_row(dst, static_cast<const T*>(p.x) + row * p.x_stride + col0, sl.bytes, &bars[s]);
      if constexpr (Tr::kRes)
        bulk_load_row(dst + slice, static_cast<const T*>(p.residual) + row * p.res_stride + col0, sl.bytes, &bars[s]);
    };
    const ClusterRows row_of(p.rows, cluster);
    bulk_pipeline_start(bars, stages, row_of, issue);
    constexpr int kR = kPV > 0 ? kPV : 1;
    V wr[kR], br[kR];
    if constexpr (kPV > 0) {
      static_assert(!Tr::kAda, "norm_fwd_bulk: AdaLN's scale/shift change per row group");
#pragma unroll
      for (int c = 0; c < kPV; ++c) {
        const int64_t v = t + int64_t(c) * tpr, col = col0 + v * kVec;
        wr[c] = br[c] = V::zero();
        if (v < svec && has_w) wr[c] = load_vec<T, kVec>(static_cast<const T*>(p.weight) + col);
        if (v < svec && has_b && !Tr::kHfRms) br[c] = load_vec<T, kVec>(static_cast<const T*>(p.bias) + col);
      }
    }
    __syncthreads();

    for (int64_t k = 0, row = row_of(0); row >= 0; row = row_of(++k)) {
      const int s = int(k % stages);
      mbar_wait(&bars[s], uint32_t((k / stages) & 1));
      T* xs = stage_base + int64_t(s) * nbuf * slice;
      if constexpr (Tr::kRes) {  // s = T(x + residual): written to `sum` and kept in shared memory
        for (int64_t v = t; v < svec; v += tpr) {
          V a = *reinterpret_cast<const V*>(xs + v * kVec);
          const V r = *reinterpret_cast<const V*>(xs + slice + v * kVec);
          float f[kVec];
#pragma unroll
          for (int j = 0; j < kVec; ++j) f[j] = a.get(j) + r.get(j);
          a = V::from(f);
          *reinterpret_cast<V*>(xs + v * kVec) = a;
          store_vec<T, kVec>(static_cast<T*>(p.sum) + row * p.sum_stride + col0 + v * kVec, a);
        }
      }
      // LayerNorm: the slice's sums shifted by its own first element K (row_stats' cancellation
      // argument, per slice; read from the stage, so no load waits on the row's critical path).
      const float shift_k = Tr::kLayer ? to_float(xs[0]) : 0.f;
      constexpr int kS = Tr::kLayer ? 2 : 1;
      float st[kS];
#pragma unroll
      for (int q = 0; q < kS; ++q) st[q] = 0.f;
      for (int64_t v = t; v < svec; v += tpr) {
        const V a = *reinterpret_cast<const V*>(xs + v * kVec);
#pragma unroll
        for (int j = 0; j < kVec; ++j) {
          const float d = a.get(j) - shift_k;
          st[kS - 1] += d * d;
          if constexpr (Tr::kLayer) st[0] += d;
        }
      }
      const int cslot = slot;
      // CTA sums (a barrier: every thread wrote its st first); RMSNorm adds the cluster's at once.
      team_sum<kS>(st, tpr, 0, sm, slot, Tr::kLayer ? 1 : cluster);
      float mean = 0.f, rstd;
      if constexpr (Tr::kLayer) {
        // Slice mean and squared deviations, m = slice: mean_r = K + S1/m, M2_r = S2 − S1²/m. Over the
        // cluster (Chan's combination of C equal parts): mean = Σ mean_r / C,
        // M2 = Σ (M2_r + m·(mean_r − mean)²); var = M2 / n, clamped at 0 (not fmaxf: NaN stays NaN).
        const float mr = shift_k + st[0] * inv_slice;
        float m2 = st[1] - st[0] * st[0] * inv_slice;
        mean = mr;
        if (cluster > 1) {
          Floats<2> mine = {{mr, m2}};
          const Floats<2> got = cluster_gather(mine, &sm.cluster[cslot], cluster, Floats<2>{});
          float a[1] = {got.v[0]};
          warp_sum<1>(a);
          mean = a[0] / float(cluster);
          const float dm = got.v[0] - mean;
          float b[1] = {(int(threadIdx.x & 31) < cluster) ? got.v[1] + float(slice) * dm * dm : 0.f};
          warp_sum<1>(b);
          m2 = b[0];
        }
        float var = m2 * inv_n;
        var = var < 0.f ? 0.f : var;
        rstd = rsqrtf(var + p.eps);
      } else {
        rstd = row_stats<false>(0.f, st[0], 0.f, inv_n, p.eps).rstd;
      }
      const int64_t g = Tr::kAda ? ada_group(row, p) : 0;
      // Output in chunks of kChunk vectors per thread: the chunk's parameter vectors (weight, bias,
      // AdaLN scale/shift: L2 hits, ~0.5 us each under load) are all loaded before its first store,
      // one round trip per chunk instead of one per vector (the compiler does not move loads across
      // the stores to y). With 8 vectors per thread the per-vector loads cost layer_norm 2048x131072
      // 1963 GB/s against 2755 without weight and bias (notes/norm.md, session 11).
      if constexpr (kPV > 0) {
#pragma unroll
        for (int c = 0; c < kPV; ++c) {  // packed words only: no float copies live across rows
          launder(wr[c]);
          launder(br[c]);
        }
#pragma unroll
        for (int c = 0; c < kPV; ++c) {
          const int64_t v = t + int64_t(c) * tpr;
          if (v >= svec) break;
          const V a = *reinterpret_cast<const V*>(xs + v * kVec);
          store_vec<T, kVec>(static_cast<T*>(p.y) + row * p.y_stride + col0 + v * kVec,
                             fwd_out<T, kOp, kVec>(a, mean, rstd, p, wr[c], br[c], wr[c], br[c]));
        }
      }
      for (int64_t v0 = t; kPV == 0 && v0 < svec; v0 += int64_t(kChunk) * tpr) {
        V wv[kChunk], bv[kChunk], scv[kChunk], shv[kChunk];
#pragma unroll
        for (int c = 0; c < kChunk; ++c) {
          const int64_t v = v0 + int64_t(c) * tpr, col = col0 + v * kVec;
          if (v >= svec) break;
          if (has_w) wv[c] = load_vec<T, kVec>(static_cast<const T*>(p.weight) + col);
          if constexpr (!Tr::kHfRms) {
            if (has_b) bv[c] = load_vec<T, kVec>(static_cast<const T*>(p.bias) + col);
          }
          if constexpr (Tr::kAda) {
            scv[c] = load_vec<T, kVec>(static_cast<const T*>(p.scale) + g * p.scale_stride + col);
            shv[c] = load_vec<T, kVec>(static_cast<const T*>(p.shift) + g * p.shift_stride + col);
          }
        }
#pragma unroll
        for (int c = 0; c < kChunk; ++c) {
          const int64_t v = v0 + int64_t(c) * tpr, col = col0 + v * kVec;
          if (v >= svec) break;
          const V a = *reinterpret_cast<const V*>(xs + v * kVec);
          store_vec<T, kVec>(static_cast<T*>(p.y) + row * p.y_stride + col,
                             fwd_out<T, kOp, kVec>(a, mean, rstd, p, wv[c], bv[c], scv[c], shv[c]));
        }
      }
      __syncthreads();  // every thread is done with stage s: refill it with the row `stages` ahead
      bulk_pipeline_refill(row_of(k + stages), s, issue);
    }
    cluster_exit_sync(cluster);
#endif
  }
}

// ---- forward, streaming (row re-read from memory; for rows no cluster can hold) -------------
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

// kBulk (sm_90, 16-byte aligned rows that fit a stage): x, dy (and dsum) of the next rows stream
// into shared memory through cp.async.bulk while the current row is processed; else plain loads.
// kTile (the split backward's pass 2, long rows): block (b, c) takes the columns of tile c (tpr·kIters
// vectors) of the rows of work unit b, with the row statistics read from wk.row_stats (no reduction).
// kBody (odd N, or rows off a 16-byte boundary, with x, dy, dx, dsum sharing their misalignment; plain
// loads): every row of a block starts the same hd = head_elems(x row) elements before a 16-byte
// boundary (the launcher makes blocks per group a multiple of the rows' alignment period), so thread t
// owns the columns hd + (i·tpr + t)·kVec + j of every row, plus head column t < hd: its column sums
// stay in registers as for aligned rows. The head is one element per thread t < hd; the body's last
// vector may be partial (padded with the LayerNorm shift K for x and 0 for dy: both add 0 to every
// sum); weight, bias and scale are read at any element offset (load_vec_any).
template <typename T, NormOp kOp, int kVec, int kIters, bool kBulk, bool kTile = false, bool kBody = false>
__global__ void KF_BWD_REG_ATTR norm_bwd_regs(const NormParams p, const BwdWork wk, const int stages) {
  if constexpr (!arch_supports<T>() || (kBulk && !kHasBulk) || (kBulk && kTile) || (kBody && (kBulk || kTile))) {
    __trap();
  } else {
    pdl_wait();
    using Tr = OpTraits<kOp>;
    using V = Vec<T, kVec>;
    constexpr int E = kIters * kVec;
    constexpr bool kNeedD = Tr::kLayer || Tr::kAda;
    __shared__ ReduceSmem<Tr::kLayer ? 4 : 2> sm;
    int slot = 0;
    const int tpr = blockDim.x, t = threadIdx.x;
    const int64_t n = p.n;
    const float inv_n = 1.f / float(n);
    const bool has_w = p.weight != nullptr, has_b = p.bias != nullptr;
    const int64_t tile0 = kTile ? int64_t(blockIdx.y) * tpr * kIters * kVec : 0;
    auto col_of = [&](int i) { return tile0 + (int64_t(i) * tpr + t) * kVec; };

    // kBody: the block's head length hd (that of its first row; every row of the block shares it) and
    // its body of nb = n - hd columns; the vectors' columns (col_of) count from hd.
    int hd = 0;
    if constexpr (kBody) {
      const int64_t row0 = BwdSeq(blockIdx.x, int64_t(gridDim.x), wk.bpg, wk.group_rows, wk.groups).row_of(0);
      if (row0 >= 0) hd = head_elems(static_cast<const T*>(p.x) + row0 * p.x_stride, n);
    }
    const int64_t nb = n - hd;
    const T* __restrict__ wg = has_w ? static_cast<const T*>(p.weight) + hd : nullptr;
    const T* __restrict__ bg = has_b ? static_cast<const T*>(p.bias) + hd : nullptr;
    V wv[kIters], bv[kIters];  // the same for every row: kept in registers
#pragma unroll
    for (int i = 0; i < kIters; ++i) {
      const int64_t col = col_of(i);
      wv[i] = bv[i] = V::zero();
      if constexpr (kBody) {
        if (col < nb && has_w) wv[i] = load_vec_any<T, kVec>(wg, int(col), int(nb));
        if (Tr::kAda && col < nb && has_b) bv[i] = load_vec_any<T, kVec>(bg, int(col), int(nb));
      } else {
        if (col < n && has_w) wv[i] = load_vec<T, kVec>(static_cast<const T*>(p.weight) + col);
        if (Tr::kAda && col < n && has_b) bv[i] = load_vec<T, kVec>(static_cast<const T*>(p.bias) + col);
      }
    }
    float acc_a[E], acc_d[E];
#pragma unroll
    for (int e = 0; e < E; ++e) acc_a[e] = acc_d[e] = 0.f;

    const int64_t b = blockIdx.x;
    const BwdSeq seq(b, int64_t(gridDim.x), wk.bpg, wk.group_rows, wk.groups);
    const bool per_group = wk.grouped && wk.bpg == 1;
    // kBody head column t < hd: its weight/bias and column sums
    const bool head = kBody && t < hd;
    float hw = 1.f, hb = 0.f, hacc_a = 0.f, hacc_d = 0.f;
    if constexpr (kBody) {
      if (head && has_w) hw = to_float(static_cast<const T*>(p.weight)[t]);
      if (Tr::kAda && head && has_b) hb = to_float(static_cast<const T*>(p.bias)[t]);
    }
    // The head's dn = dy·(1 + scale)·w, rounded as a product before any use: the statistics and dx
    // must see the same value (contracted into dx's subtraction as an FMA, a LayerNorm row of N = 1 gave
    // dx = rstd·(dn − mean(dn)) = 1e-5 instead of 0).
    auto head_dn = [](float dy, float sc, float w) {
      if constexpr (Tr::kAda) dy = __fmul_rn(dy, 1.f + sc);
      return __fmul_rn(dy, w);
    };
    // Writes the column sums to partial row prow (zeroing them when `reset`): body columns hd + col + j,
    // head column t.
    auto write_partial = [&](int64_t prow, bool reset) {
      float* pa = wk.part_a ? wk.part_a + prow * wk.ld + hd : nullptr;
      float* pd = wk.part_d ? wk.part_d + prow * wk.ld + hd : nullptr;
#pragma unroll
      for (int i = 0; i < kIters; ++i) {
        const int64_t col = col_of(i);
#pragma unroll
        for (int j = 0; j < kVec; ++j) {
          const int e = i * kVec + j;
          if (col + j < nb) {
            if (pa) pa[col + j] = acc_a[e];
            if constexpr (kNeedD) {
              if (pd) pd[col + j] = acc_d[e];
            }
          }
          if (reset) acc_a[e] = acc_d[e] = 0.f;
        }
      }
      if (head) {
        if (pa) pa[t - hd] = hacc_a;
        if constexpr (kNeedD) {
          if (pd) pd[t - hd] = hacc_d;
        }
        if (reset) hacc_a = hacc_d = 0.f;
      }
    };

    // Bulk pipeline state (kBulk only).
    extern __shared__ __align__(128) unsigned char dyn_smem[];
    __shared__ __align__(8) uint64_t bars[kBulkMaxStages];
    const int nbuf = p.dsum ? 3 : 2;
    const uint32_t row_bytes = uint32_t(n * sizeof(T));
    T* stage_base = reinterpret_cast<T*>(dyn_smem);
    auto issue = [&](int64_t row, int s) {
      mbar_expect(&bars[s], row_bytes * nbuf);
      T* dst = stage_base + int64_t(s) * nbuf * n;
      bulk_load_row(dst, static_cast<const T*>(p.x) + row * p.x_stride, row_bytes, &bars[s]);
      bulk_load_row(dst + n, static_cast<const T*>(p.dy) + row * p.dy_stride, row_bytes, &bars[s]);
      if (p.dsum) bulk_load_row(dst + 2 * n, static_cast<const T*>(p.dsum) + row * p.dsum_stride, row_bytes, &bars[s]);
    };
    if constexpr (kBulk) {
      bulk_pipeline_start(
          bars, stages, [&](int64_t s) { return seq.row_of(s); }, issue);
      __syncthreads();
    }

    for (int64_t k = 0;; ++k) {
      const int64_t row = seq.row_of(k);
      if (row < 0) break;
      float4 rst = {};
      if constexpr (kTile) rst = wk.row_stats[row];  // issued first: independent of the x loads
      // x, dy (and dsum) are loaded into registers once per row, from global memory (plain) or
      // from the stage (bulk), which is then released at once. kReread (bulk AdaLN when
      // KF_BWD_ADA_REREAD=1): they stay in the stage and are re-read per pass instead (fewer registers;
      // the stage is released only at the end of the row).
      constexpr bool kReread = kBulk && Tr::kAda && KF_BWD_ADA_REREAD;
      constexpr int kR = kReread ? 1 : kIters;
      V xv[kR], dyv[kR], dsv[kR], scv[kIters];
      // scale row: the group (a block's rows share one when bpg > 1), or the row itself (rpg = 1)
      const int64_t ga = Tr::kAda ? (wk.grouped ? seq.group_of(k) : row) : 0;
      const T* xs = nullptr;
      if constexpr (kBulk) {
        const int s = int(k % stages);
        mbar_wait(&bars[s], uint32_t((k / stages) & 1));
        xs = stage_base + int64_t(s) * nbuf * n;
      }
      // LayerNorm's shift K = x[row, 0] (see the statistics below), read before the stage is refilled.
      float shift_k = 0.f;
      if constexpr (Tr::kLayer && !kTile) {
        if constexpr (kBulk)
          shift_k = to_float(xs[0]);
        else
          shift_k = to_float(static_cast<const T*>(p.x)[row * p.x_stride]);
      }
      // kBody: this row's tensors from column hd on, and the head element of thread t < hd
      const T* __restrict__ xr = static_cast<const T*>(p.x) + row * p.x_stride + hd;
      const T* __restrict__ dyr = static_cast<const T*>(p.dy) + row * p.dy_stride + hd;
      const T* __restrict__ dsr = static_cast<const T*>(p.dsum) + row * p.dsum_stride + hd;
      const T* __restrict__ scr = static_cast<const T*>(p.scale) + ga * p.scale_stride + hd;
      float hx = 0.f, hdy = 0.f, hds = 0.f, hsc = 0.f;
      if constexpr (kBody) {
        if (head) {
          hx = to_float(xr[t - hd]);
          hdy = to_float(dyr[t - hd]);
          if (p.dsum) hds = to_float(dsr[t - hd]);
          if constexpr (Tr::kAda) hsc = to_float(scr[t - hd]);
        }
      }
      const V zero = V::zero();
#pragma unroll
      for (int i = 0; i < kIters; ++i) {
        const int64_t col = col_of(i);
        scv[i] = zero;
        if constexpr (kBody) {
          xv[i] = dyv[i] = dsv[i] = zero;
          if (col < nb) {
            xv[i] = load_row_vec<T, kVec>(xr, int(col), int(nb), shift_k);
            dyv[i] = load_row_vec<T, kVec>(dyr, int(col), int(nb), 0.f);
            if (p.dsum) dsv[i] = load_row_vec<T, kVec>(dsr, int(col), int(nb), 0.f);
            if constexpr (Tr::kAda) scv[i] = load_vec_any<T, kVec>(scr, int(col), int(nb));
          }
        } else if constexpr (kBulk && !kReread) {
          xv[i] = dyv[i] = dsv[i] = zero;
          if (col < n) {
            xv[i] = *reinterpret_cast<const V*>(xs + col);
            dyv[i] = *reinterpret_cast<const V*>(xs + n + col);
            if (p.dsum) dsv[i] = *reinterpret_cast<const V*>(xs + 2 * n + col);
          }
        } else if constexpr (!kBulk) {
          xv[i] = dyv[i] = dsv[i] = zero;
          if (col < n) {
            xv[i] = load_vec<T, kVec>(static_cast<const T*>(p.x) + row * p.x_stride + col);
            dyv[i] = load_vec<T, kVec>(static_cast<const T*>(p.dy) + row * p.dy_stride + col);
            if (p.dsum) dsv[i] = load_vec<T, kVec>(static_cast<const T*>(p.dsum) + row * p.dsum_stride + col);
          }
        }
        if constexpr (Tr::kAda && !kBody) {
          if (col < n) scv[i] = load_vec<T, kVec>(static_cast<const T*>(p.scale) + ga * p.scale_stride + col);
        }
      }
      if constexpr (kBulk && !kReread) {
        __syncthreads();  // the stage is in registers now: refill it with the row `stages` ahead
        bulk_pipeline_refill(seq.row_of(k + stages), int(k % stages), issue);
      }
      auto X = [&](int i) -> V {
        if constexpr (kReread)
          return col_of(i) < n ? *reinterpret_cast<const V*>(xs + col_of(i)) : zero;
        else
          return xv[i];
      };
      auto DY = [&](int i) -> V {
        if constexpr (kReread)
          return col_of(i) < n ? *reinterpret_cast<const V*>(xs + n + col_of(i)) : zero;
        else
          return dyv[i];
      };
      auto DS = [&](int i) -> V {
        if constexpr (kReread)
          return *reinterpret_cast<const V*>(xs + 2 * n + col_of(i));
        else
          return dsv[i];
      };
      // dn = dy·(1 + scale)·w : the gradient w.r.t. xh
      auto dn_of = [&](int i, int j) {
        float g = DY(i).get(j);
        if constexpr (Tr::kAda) g *= 1.f + scv[i].get(j);
        return has_w ? g * wv[i].get(j) : g;
      };
      // One reduction for every statistic (bwd_stats), with d = x - K (K = x[row, 0] for LayerNorm):
      // S1 = Σd, S2 = Σd², G1 = Σdn, G2 = Σdn·d — one barrier round instead of three.
      constexpr int kS = Tr::kLayer ? 4 : 2;  // {S2, G2} or {S2, G2, S1, G1}
      BwdStats bs = {rst.x, rst.y, rst.z, rst.w};
      if constexpr (!kTile) {
        float st[kS];
#pragma unroll
        for (int q = 0; q < kS; ++q) st[q] = 0.f;
#pragma unroll
        for (int i = 0; i < kIters; ++i) {
          const bool ok = col_of(i) < nb;
#pragma unroll
          for (int j = 0; j < kVec; ++j) {
            const float d = ok ? X(i).get(j) - shift_k : 0.f;  // padding: x = dy = 0 -> d = dn = 0
            const float dn = dn_of(i, j);
            st[0] += d * d;
            st[1] += dn * d;
            if constexpr (Tr::kLayer) {
              st[2] += d;
              st[3] += dn;
            }
          }
        }
        if constexpr (kBody) {  // the head element (0 for threads without one)
          const float d = head ? hx - shift_k : 0.f;
          const float dn = head_dn(hdy, hsc, hw);
          st[0] += d * d;
          st[1] += dn * d;
          if constexpr (Tr::kLayer) {
            st[2] += d;
            st[3] += dn;
          }
        }
        team_sum<kS>(st, tpr, 0, sm, slot, 1);
        bs = bwd_stats<Tr::kLayer>(st, shift_k, inv_n, p.eps);
      }
      const float mean = bs.mean, rstd = bs.rstd, mdn = bs.mdn, mdnxh = bs.mdnxh;
      if constexpr (!kReread) {
#pragma unroll
        for (int i = 0; i < kIters; ++i) {  // unpack again below rather than keep float copies live
          launder(xv[i]);
          launder(dyv[i]);
          if constexpr (Tr::kAda) launder(scv[i]);
        }
      }
#pragma unroll
      for (int i = 0; i < kIters; ++i) {  // weight/bias too: the same every row, but keeping their
        launder(wv[i]);                   // float32 copies live across rows costs 2x the registers
        if constexpr (Tr::kAda) launder(bv[i]);
      }
      T* __restrict__ dxr = static_cast<T*>(p.dx) + row * p.dx_stride + hd;
      T* __restrict__ dscr = static_cast<T*>(p.dscale) + row * n + hd;  // per-row AdaLN scale only
      T* __restrict__ dshr = static_cast<T*>(p.dshift) + row * n + hd;
      if constexpr (kBody) {
        if (head) {  // the head element: the same formulas at column t
          const float xh = (hx - mean) * rstd;
          float u = hdy;
          const float dn = head_dn(hdy, hsc, hw);
          dxr[t - hd] = from_float<T>(rstd * (dn - mdn - xh * mdnxh) + hds);
          if constexpr (Tr::kAda) {
            if (!wk.grouped) {
              if (p.dscale) dscr[t - hd] = from_float<T>(u * ((has_w ? xh * hw : xh) + hb));
              if (p.dshift) dshr[t - hd] = from_float<T>(u);
              u *= 1.f + hsc;
            }
          }
          hacc_a += u * xh;
          hacc_d += u;
        }
      }
#pragma unroll
      for (int i = 0; i < kIters; ++i) {
        const int64_t col = col_of(i);
        if (col >= nb) continue;
        float dxf[kVec], dscf[kVec];
#pragma unroll
        for (int j = 0; j < kVec; ++j) {
          const float xh = (X(i).get(j) - mean) * rstd;
          float dx = rstd * (dn_of(i, j) - mdn - xh * mdnxh);
          if (p.dsum) dx += DS(i).get(j);
          dxf[j] = dx;
          float u = DY(i).get(j);
          dscf[j] = 0.f;
          if constexpr (Tr::kAda) {
            if (!wk.grouped) {  // per-row scale: elementwise dscale/dshift, u includes (1 + scale)
              const float nrm = (has_w ? xh * wv[i].get(j) : xh) + bv[i].get(j);
              dscf[j] = u * nrm;
              u *= 1.f + scv[i].get(j);
            }
          }
          acc_a[i * kVec + j] += u * xh;
          if constexpr (kNeedD) acc_d[i * kVec + j] += u;
        }
        if constexpr (kBody) {
          store_row_vec<T, kVec>(dxr, int(col), int(nb), dxf);
          if constexpr (Tr::kAda) {
            if (!wk.grouped) {
              if (p.dscale) store_row_vec<T, kVec>(dscr, int(col), int(nb), dscf);
              if (p.dshift) store_row_vec<T, kVec>(dshr, int(col), int(nb), DY(i));
            }
          }
        } else {
          store_vec<T, kVec>(static_cast<T*>(p.dx) + row * p.dx_stride + col, V::from(dxf));
          if constexpr (Tr::kAda) {
            if (!wk.grouped) {
              if (p.dscale) store_vec<T, kVec>(static_cast<T*>(p.dscale) + row * n + col, V::from(dscf));
              if (p.dshift) store_vec<T, kVec>(static_cast<T*>(p.dshift) + row * n + col, DY(i));
            }
          }
        }
      }
      if constexpr (kReread) {
        __syncthreads();  // every thread is done with this stage: refill it with the row `stages` ahead
        bulk_pipeline_refill(seq.row_of(k + stages), int(k % stages), issue);
      }
      if (per_group && k - div_nonneg(k, wk.group_rows) * wk.group_rows ==
                           wk.group_rows - 1) {  // end of a group owned by this block
        const int64_t grp = row / wk.group_rows;
        if constexpr (kBody) {
          write_partial(grp, true);
        } else {
#pragma unroll
          for (int i = 0; i < kIters; ++i) {
            const int64_t col = col_of(i);
            if (col >= n) continue;
#pragma unroll
            for (int j = 0; j < kVec; ++j) {
              const int e = i * kVec + j;
              wk.part_a[grp * wk.ld + col + j] = acc_a[e];
              wk.part_d[grp * wk.ld + col + j] = acc_d[e];
              acc_a[e] = acc_d[e] = 0.f;
            }
          }
        }
      }
    }
    if (!per_group) {
      if constexpr (kBody) {
        write_partial(b, false);
      } else {
#pragma unroll
        for (int i = 0; i < kIters; ++i) {
          const int64_t col = col_of(i);
          if (col >= n) continue;
#pragma unroll
          for (int j = 0; j < kVec; ++j) {
            if (wk.part_a) wk.part_a[b * wk.ld + col + j] = acc_a[i * kVec + j];
            if constexpr (kNeedD) {
              if (wk.part_d) wk.part_d[b * wk.ld + col + j] = acc_d[i * kVec + j];
            }
          }
        }
      }
    }
  }
}

// ---- backward, chunks of rows staged in shared memory (sm_90) -----------------------------------
// norm_bwd_regs spends two block barriers per row (stage release, statistics); with 4 warps per block
// and 128 registers per thread it is latency-bound (notes/norm.md, design 9). This kernel works on a
// chunk of up to kC consecutive rows of one group at a time:
//   * x, dy (and dsum) of the next chunks stream into shared memory with cp.async.bulk (S stages,
//     one mbarrier per stage); DRAM traffic stays the minimum: read x, dy (dsum) once, write dx once.
//   * thread t owns the same columns (vectors t, t + T, ...) in every row, so the parameter factor
//     f = w·(1 + scale_g) and the column accumulators A = Σ u·xh, D = Σ u live in registers for
//     the block's lifetime (dn = dy·f; u = dy: this kernel takes no per-row AdaLN scale).
//   * pass 1: the thread's partial statistics of every row of the chunk (C·kS floats), one warp
//     transpose-reduction (31 shuffles for 32 values), one block barrier; then every warp sums the
//     warp partials in the same order, so all threads hold identical statistics (deterministic).
//   * pass 2: dx of the chunk's rows with x, dy re-read from the stage (shared memory has bandwidth to
//     spare: ~3 reads per element against ~13 B/clk of DRAM per SM), A and D accumulated.
// One barrier per chunk: the stage of chunk k-1 is refilled right after chunk k's barrier, when
// every thread is past chunk k-1. The column partials are written like norm_bwd_regs does.

// Sums K values (a power of two <= 32) over the lanes of a warp, transposed: every step hands half
// of the values to the partner lane, so that lane l ends with value l / (32 / K) in v[0] after 31
// shuffles for K = 32 (5·K for the plain butterfly). Lanes with the same value hold identical bits
// (a + b = b + a in the butterfly steps).
template <int K, int kOff>
__device__ __forceinline__ void warp_transpose_sum(float* v, int lane) {
  if constexpr (kOff > 0) {
    if constexpr (K > 1) {
      constexpr int H = K / 2;
      const bool up = (lane & kOff) != 0;
#pragma unroll
      for (int j = 0; j < H; ++j) {
        const float send = up ? v[j] : v[j + H];
        const float keep = up ? v[j + H] : v[j];
        v[j] = keep + __shfl_xor_sync(0xffffffffu, send, kOff);
      }
      warp_transpose_sum<H, kOff / 2>(v, lane);
    } else {
      v[0] += __shfl_xor_sync(0xffffffffu, v[0], kOff);
      warp_transpose_sum<1, kOff / 2>(v, lane);
    }
  }
}

template <typename T, NormOp kOp, int kVec, int kIters, int kC>
__global__ void __launch_bounds__(512) norm_bwd_chunk(const NormParams p, const BwdWork wk, const int stages) {
  using Tr = OpTraits<kOp>;
  if constexpr (!arch_supports<T>() || !kHasBulk) {
    __trap();
  } else {
    pdl_wait();
    using V = Vec<T, kVec>;
    constexpr int E = kIters * kVec;
    constexpr int kS = Tr::kLayer ? 4 : 2;  // {S2, G2[, S1, G1]} per row, as in norm_bwd_regs
    constexpr int K = kC * kS;              // statistics per chunk (wk.chunk <= kC rows): at most 32
    static_assert(K <= 32, "one statistic per lane");
    constexpr int kLanesPer = 32 / K;  // lanes holding each value after the transpose-sum
    constexpr bool kNeedD = Tr::kLayer || Tr::kAda;
    extern __shared__ __align__(128) unsigned char dyn_smem[];
    __shared__ __align__(8) uint64_t bars[kBulkMaxStages];
    __shared__ float red[2][16][K];  // warp partials (<= 16 warps), double-buffered
    const int tpr = blockDim.x, t = threadIdx.x, lane = t & 31, warp = t >> 5, nwarps = tpr >> 5;
    const int64_t n = p.n;
    const float inv_n = 1.f / float(n);
    const bool has_ds = Tr::kRes && p.dsum != nullptr;  // compile-time false except for add_rms_norm
    const int nbuf = has_ds ? 3 : 2;
    const uint32_t row_bytes = uint32_t(n * sizeof(T));
    const int64_t C = wk.chunk, R = wk.group_rows, U = (R + C - 1) / C;  // U chunks per group
    const BwdSeq seq(blockIdx.x, int64_t(gridDim.x), wk.bpg, U, wk.groups);
    const bool per_group = wk.grouped && wk.bpg == 1;
    T* stage_base = reinterpret_cast<T*>(dyn_smem);
    const int64_t stage_elems = C * nbuf * n;
    auto col_of = [&](int i) { return (int64_t(i) * tpr + t) * kVec; };

    // Chunk k of this block: rows row0 .. row0 + nr - 1 of group grp (false past the end).
    auto chunk_of = [&](int64_t k, int64_t& grp, int64_t& c, int64_t& row0, int& nr) {
      const int64_t u = seq.row_of(k);
      if (u < 0) return false;
      grp = seq.group_of(k);
      c = u - grp * U;
      row0 = grp * R + c * C;
      nr = int(R - c * C < C ? R - c * C : C);
      return true;
    };
    auto issue = [&](int64_t k, int s) {
      int64_t grp, c, row0;
      int nr;
      if (!chunk_of(k, grp, c, row0, nr)) return;
      mbar_expect(&bars[s], row_bytes * uint32_t(nbuf * nr));
      T* dst = stage_base + int64_t(s) * stage_elems;
      for (int r = 0; r < nr; ++r, dst += nbuf * n) {
        const int64_t row = row0 + r;
        bulk_load_row(dst, static_cast<const T*>(p.x) + row * p.x_stride, row_bytes, &bars[s]);
        bulk_load_row(dst + n, static_cast<const T*>(p.dy) + row * p.dy_stride, row_bytes, &bars[s]);
        if (has_ds)
          bulk_load_row(dst + 2 * n, static_cast<const T*>(p.dsum) + row * p.dsum_stride, row_bytes, &bars[s]);
      }
    };
    if (t == 0) {
      for (int s = 0; s < stages; ++s) mbar_init(&bars[s]);
      mbar_init_fence();
      for (int s = 0; s < stages; ++s) issue(s, s);
    }

    // f = w·(1 + scale_g) per owned element (w = 1 without weight; scale only for grouped AdaLN)
    float f[E], acc_a[E], acc_d[E];
    auto load_factors = [&](int64_t grp) {
#pragma unroll
      for (int i = 0; i < kIters; ++i) {
        const int64_t col = col_of(i);
        V wv = V::zero(), sv = V::zero();
        if (col < n && p.weight) wv = load_vec<T, kVec>(static_cast<const T*>(p.weight) + col);
        if constexpr (Tr::kAda) {
          if (col < n) sv = load_vec<T, kVec>(static_cast<const T*>(p.scale) + grp * p.scale_stride + col);
        }
#pragma unroll
        for (int j = 0; j < kVec; ++j) {
          float fe = p.weight ? wv.get(j) : 1.f;
          if constexpr (Tr::kAda) fe *= 1.f + sv.get(j);
          f[i * kVec + j] = fe;
        }
      }
    };
#pragma unroll
    for (int e = 0; e < E; ++e) acc_a[e] = acc_d[e] = 0.f;
    int64_t cur_grp = -1;
    auto flush = [&](int64_t pr) {  // the accumulators into partial row pr
#pragma unroll
      for (int i = 0; i < kIters; ++i) {
        const int64_t col = col_of(i);
        if (col >= n) continue;
#pragma unroll
        for (int j = 0; j < kVec; ++j) {
          if (wk.part_a) wk.part_a[pr * wk.ld + col + j] = acc_a[i * kVec + j];
          if constexpr (kNeedD) {
            if (wk.part_d) wk.part_d[pr * wk.ld + col + j] = acc_d[i * kVec + j];
          }
        }
      }
    };
    __syncthreads();  // barriers initialized

    int buf = 0;
    for (int64_t k = 0;; ++k) {
      int64_t grp, c, row0;
      int nr;
      if (!chunk_of(k, grp, c, row0, nr)) break;
      if (grp != cur_grp) {  // the factors change only with the AdaLN group
        if (Tr::kAda || cur_grp < 0) load_factors(grp);
        cur_grp = grp;
      }
      const int s = int(k % stages);
      mbar_wait(&bars[s], uint32_t((k / stages) & 1));
      const T* stg = stage_base + int64_t(s) * stage_elems;

      // pass 1: partial statistics of every row of the chunk, d = x - K (K = x[row, 0] for LayerNorm)
      float v[K], shift[kC];
#pragma unroll
      for (int q = 0; q < K; ++q) v[q] = 0.f;
#pragma unroll
      for (int r = 0; r < kC; ++r) {
        shift[r] = 0.f;
        if (r < nr) {
          const T* xs = stg + int64_t(r) * nbuf * n;
          if constexpr (Tr::kLayer) shift[r] = to_float(xs[0]);
#pragma unroll
          for (int i = 0; i < kIters; ++i) {
            const int64_t col = col_of(i);
            if (col >= n) continue;
            const V xv = *reinterpret_cast<const V*>(xs + col), dyv = *reinterpret_cast<const V*>(xs + n + col);
#pragma unroll
            for (int j = 0; j < kVec; ++j) {
              const float d = xv.get(j) - shift[r];
              const float dn = dyv.get(j) * f[i * kVec + j];
              v[r * kS + 0] += d * d;
              v[r * kS + 1] += dn * d;
              if constexpr (Tr::kLayer) {
                v[r * kS + 2] += d;
                v[r * kS + 3] += dn;
              }
            }
          }
        }
      }
      warp_transpose_sum<K, 16>(v, lane);
      if (lane % kLanesPer == 0) red[buf][warp][lane / kLanesPer] = v[0];
      __syncthreads();  // partials visible; every thread is past chunk k-1: refill its stage
      if (t == 0 && k > 0) {
        fence_proxy_async();
        issue(k - 1 + stages, int((k - 1) % stages));
      }
      float tot = 0.f;  // lane q < K: statistic q of the chunk, summed over the warps in order
      if (lane < K)
        for (int w = 0; w < nwarps; ++w) tot += red[buf][w][lane];
      buf ^= 1;
      // Lane r·kS turns the sums of row r into the row's coefficients (all rows at once; other lanes
      // compute values nobody reads): xh = x·rstd + mrs, dx = dn·rstd + cc − xh·bb (= rstd·(dn − mean(dn)
      // − xh·mean(dn·xh))). Pass 2 fetches them with 4 shuffles per row.
      float c_rstd, c_mrs, c_bb, c_cc;
      {
        float sums[kS];
        sums[0] = tot;
#pragma unroll
        for (int q = 1; q < kS; ++q) sums[q] = __shfl_down_sync(0xffffffffu, tot, q);
        const int rr = lane / kS;
        float sk = 0.f;
        if constexpr (Tr::kLayer) {
          if (lane < K && rr < nr) sk = to_float(stg[int64_t(rr) * nbuf * n]);
        }
        const BwdStats bs = bwd_stats<Tr::kLayer>(sums, sk, inv_n, p.eps);
        c_rstd = bs.rstd;
        c_mrs = -bs.mean * bs.rstd;
        c_bb = bs.mdnxh * bs.rstd;
        c_cc = -bs.mdn * bs.rstd;
      }

      // pass 2: dx, column sums
#pragma unroll
      for (int r = 0; r < kC; ++r) {
        if (r >= nr) continue;
        const float rstd = __shfl_sync(0xffffffffu, c_rstd, r * kS), mrs = __shfl_sync(0xffffffffu, c_mrs, r * kS);
        const float bb = __shfl_sync(0xffffffffu, c_bb, r * kS), cc = __shfl_sync(0xffffffffu, c_cc, r * kS);
        const T* xs = stg + int64_t(r) * nbuf * n;
        const int64_t row = row0 + r;
#pragma unroll
        for (int i = 0; i < kIters; ++i) {
          const int64_t col = col_of(i);
          if (col >= n) continue;
          const V xv = *reinterpret_cast<const V*>(xs + col), dyv = *reinterpret_cast<const V*>(xs + n + col);
          V dsv = V::zero();
          if (has_ds) dsv = *reinterpret_cast<const V*>(xs + 2 * n + col);
          float dxf[kVec];
#pragma unroll
          for (int j = 0; j < kVec; ++j) {
            const float xh = fmaf(xv.get(j), rstd, mrs);
            const float u = dyv.get(j);
            float dx = fmaf(-xh, bb, fmaf(u * f[i * kVec + j], rstd, cc));
            if (has_ds) dx += dsv.get(j);
            dxf[j] = dx;
            acc_a[i * kVec + j] = fmaf(u, xh, acc_a[i * kVec + j]);
            if constexpr (kNeedD) acc_d[i * kVec + j] += u;
          }
          store_vec<T, kVec>(static_cast<T*>(p.dx) + row * p.dx_stride + col, V::from(dxf));
        }
      }
      if (per_group && c == U - 1) {  // end of a group owned by this block
        flush(grp);
#pragma unroll
        for (int e = 0; e < E; ++e) acc_a[e] = acc_d[e] = 0.f;
      }
    }
    if (!per_group) flush(int64_t(blockIdx.x));
  }
}

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

// Split backward for long rows, pass 1: the statistics of every row, {mean, rstd, mdn, mdnxh} into
// wk.row_stats (16 B per row). Pass 2 is norm_bwd_regs<..., kTile = true>: a 2-D grid of column tiles
// and row sets, each thread owning fixed columns (column sums in registers, no read-modify-write of
// partial rows). Traffic: x, dy read twice, dx written once (5 passes instead of the ideal 3, but at
// streaming speed; norm_bwd_stream read-modify-wrote a float32 partial row per row: 1281 GB/s
// effective fwd+bwd at 4096x65536).
template <typename T, NormOp kOp, int kVec>
__global__ void __launch_bounds__(kBwdStreamTeam) norm_bwd_rowstats(const NormParams p, float4* row_stats) {
  if constexpr (!arch_supports<T>()) {
    __trap();
  } else {
    pdl_wait();
    constexpr int kS = OpTraits<kOp>::kLayer ? 4 : 2;
    __shared__ ReduceSmem<kS> sm;
    int slot = 0;
    for (int64_t row = blockIdx.x; row < p.rows; row += gridDim.x) {
      const BwdStats bs = row_bwd_stats<T, kOp, kVec, kS, 4>(p, row, sm, slot);
      if (threadIdx.x == 0) row_stats[row] = make_float4(bs.mean, bs.rstd, bs.mdn, bs.mdnxh);
    }
  }
}

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

// Column sums of the backward's float32 partial rows, for up to two slabs (A and D) in one launch:
//   out_s[o, c] = Σ_{r < R} f_r[c] · part_s[(o·R + r)·ld + c]
// with f_r[c] = 1 + scale[r·scale_stride + c] when `scale` is given (AdaLN's Σ_g (1 + scale_g)·A_g),
// else 1. Block (8, 32): thread x owns 4 adjacent columns (one float4 per row), thread y sums the rows
// r ≡ y (mod 32) in order, keeping kColUnroll float4 loads in flight; then y = 0 adds the 32 slices
// in order. The order is fixed, so the result is bit-identical on every run. Bytes: the slabs are
// read once (R·ld·4 B each); at R ~ 1000 partial rows and N = 2048 that is 8 MB per slab, so the
// load parallelism matters (the previous 4-byte, 8-slice version ran at a fraction of the bandwidth).
constexpr int kColTileX = 8, kColTileY = 32, kColUnroll = 8;
template <typename OutT, typename T>
struct ColSums {
  const float* part[2];
  OutT* out[2];
  int64_t n, ld, R, out_rows;
  int64_t out_ld;  // row stride of the outputs: ld (float partial-layout rows) or n (parameter gradients)
  const T* scale;
  int64_t scale_stride;
};

template <typename OutT, typename T>
__global__ void __launch_bounds__(kColTileX* kColTileY) reduce_columns(const ColSums<OutT, T> a) {
  if constexpr (!arch_supports<T>()) {
    __trap();
  } else {
    pdl_wait();
    __shared__ float4 sm[kColTileY][kColTileX];
    const int tx = threadIdx.x, ty = threadIdx.y;
    const int64_t c0 = (int64_t(blockIdx.x) * kColTileX + tx) * 4;  // first of this thread's 4 columns
    const float* __restrict__ part = a.part[blockIdx.z];
    OutT* __restrict__ out = a.out[blockIdx.z];
    for (int64_t o = blockIdx.y; o < a.out_rows; o += gridDim.y) {
      float4 s = make_float4(0.f, 0.f, 0.f, 0.f);
      if (c0 < a.ld) {
        const float* src = part + o * a.R * a.ld + c0;
        for (int64_t r0 = ty; r0 < a.R; r0 += int64_t(kColTileY) * kColUnroll) {
          float4 v[kColUnroll];
#pragma unroll
          for (int u = 0; u < kColUnroll; ++u) {  // all loads first: kColUnroll x 16 B in flight
            const int64_t r = r0 + int64_t(u) * kColTileY;
            v[u] = r < a.R ? *reinterpret_cast<const float4*>(src + r * a.ld) : make_float4(0.f, 0.f, 0.f, 0.f);
          }
#pragma unroll
          for (int u = 0; u < kColUnroll; ++u) {
            const int64_t r = r0 + int64_t(u) * kColTileY;
            float f[4] = {1.f, 1.f, 1.f, 1.f};
            if (a.scale && r < a.R) {
#pragma unroll
              for (int q = 0; q < 4; ++q)
                if (c0 + q < a.n) f[q] = 1.f + to_float(a.scale[r * a.scale_stride + c0 + q]);
            }
            s.x += f[0] * v[u].x;
            s.y += f[1] * v[u].y;
            s.z += f[2] * v[u].z;
            s.w += f[3] * v[u].w;
          }
        }
      }
      sm[ty][tx] = s;
      __syncthreads();
      if (ty == 0 && c0 < a.n) {
        float4 tot = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
        for (int k = 0; k < kColTileY; ++k) {
          tot.x += sm[k][tx].x;
          tot.y += sm[k][tx].y;
          tot.z += sm[k][tx].z;
          tot.w += sm[k][tx].w;
        }
        const float t4[4] = {tot.x, tot.y, tot.z, tot.w};
#pragma unroll
        for (int q = 0; q < 4; ++q) {
          if (c0 + q >= a.n) break;
          out[o * a.out_ld + c0 + q] = from_float<OutT>(t4[q]);
        }
      }
      __syncthreads();
    }
  }
}

// Grouped AdaLN: dshift_g = D_g, dscale_g = w·A_g + b·D_g (elementwise over [G, N]; A, D rows have
// stride ld).
template <typename T>
__global__ void ada_group_grads(const float* __restrict__ a, const float* __restrict__ d, int64_t n, int64_t ld,
                                int64_t total, const T* __restrict__ w, const T* __restrict__ bias,
                                T* __restrict__ dscale, T* __restrict__ dshift) {
  if constexpr (!arch_supports<T>()) {
    __trap();
  } else {
    pdl_wait();
    for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < total; i += int64_t(gridDim.x) * blockDim.x) {
      const int64_t g = i / n, c = i - g * n, k = g * ld + c;
      const float wc = w ? to_float(w[c]) : 1.f, bc = bias ? to_float(bias[c]) : 0.f;
      if (dscale) dscale[i] = from_float<T>(wc * a[k] + bc * d[k]);
      if (dshift) dshift[i] = from_float<T>(d[k]);
    }
  }
}

// ---- host side --------------------------------------------------------------------------------
inline bool aligned_to(const void* ptr, int64_t stride_elems, size_t elem, size_t bytes) {
  return reinterpret_cast<uintptr_t>(ptr) % bytes == 0 && (stride_elems * int64_t(elem)) % int64_t(bytes) == 0;
}

// kVec = 16 / sizeof(T) when every pointer, row stride and N allow 16-byte accesses.
template <typename T>
bool can_vectorize(const NormParams& p) {
  constexpr int kVec = 16 / sizeof(T);
  const size_t e = sizeof(T);
  if (p.n % kVec != 0) return false;
  const void* rows[] = {p.x, p.residual, p.y, p.sum, p.dy, p.dsum, p.dx};
  const int64_t strides[] = {p.x_stride,  p.res_stride,  p.y_stride, p.sum_stride,
                             p.dy_stride, p.dsum_stride, p.dx_stride};
  for (int i = 0; i < 7; ++i)
    if (rows[i] && !aligned_to(rows[i], p.rows > 1 ? strides[i] : 0, e, 16)) return false;
  const void* vecs[] = {p.weight, p.bias, p.dscale, p.dshift};
  for (const void* v : vecs)
    if (v && !aligned_to(v, 0, e, 16)) return false;
  if (p.scale && !aligned_to(p.scale, p.ada_groups > 1 ? p.scale_stride : 0, e, 16)) return false;
  if (p.shift && !aligned_to(p.shift, p.ada_groups > 1 ? p.shift_stride : 0, e, 16)) return false;
  return true;
}

// The forward's row tensors (x, y, residual, sum) all start every row at the same offset from a
// 16-byte boundary (base pointers and row strides differ by multiples of 16 bytes), so one scalar
// head per row aligns them all. The parameters may sit anywhere (norm_fwd_row's load_vec_any).
template <typename T>
bool can_align_body(const NormParams& p) {
  const int64_t e = int64_t(sizeof(T));
  if (reinterpret_cast<uintptr_t>(p.x) % sizeof(T) != 0) return false;
  const void* rows[] = {p.y, p.residual, p.sum};
  const int64_t strides[] = {p.y_stride, p.res_stride, p.sum_stride};
  for (int i = 0; i < 3; ++i) {
    const int64_t diff = p.rows > 1 ? (strides[i] - p.x_stride) * e : 0;
    if (rows[i] && !shares_misalignment(p.x, rows[i], diff)) return false;
  }
  return true;
}

// The backward's row tensors (x, dy, dx, dsum; dscale and dshift when they are per-row [rows, N]
// outputs) likewise, for norm_bwd_regs<..., kBody>.
template <typename T>
bool can_align_body_bwd(const NormParams& p) {
  const int64_t e = int64_t(sizeof(T));
  if (reinterpret_cast<uintptr_t>(p.x) % sizeof(T) != 0) return false;
  const void* rows[] = {p.dy, p.dx, p.dsum, p.dscale, p.dshift};
  const int64_t strides[] = {p.dy_stride, p.dx_stride, p.dsum_stride, p.n, p.n};
  const bool per_row = p.ada_rpg == 1;  // dscale/dshift: [rows, N] only with one scale row per x row
  for (int i = 0; i < 5; ++i) {
    if (i >= 3 && !per_row) continue;
    const int64_t diff = p.rows > 1 ? (strides[i] - p.x_stride) * e : 0;
    if (rows[i] && !shares_misalignment(p.x, rows[i], diff)) return false;
  }
  return true;
}

// Blocks of `kernel` resident per SM at `threads` threads and `smem` dynamic shared memory; the
// first call per (kernel, threads, smem) also raises the kernel's dynamic shared memory limit.
// Cached: these runtime queries cost microseconds, which a decode-sized call cannot afford.
inline int cached_blocks_per_sm(const void* kernel, int threads, size_t smem) {
  struct Key {
    const void* k;
    int t;
    size_t s;
    int v;
  };
  static std::mutex mu;
  static std::vector<Key> cache;
  std::lock_guard<std::mutex> lock(mu);
  for (const Key& e : cache)
    if (e.k == kernel && e.t == threads && e.s == smem) return e.v;
  int per_sm = 0;
  // Raised for any dynamic size: static + dynamic shared memory over 48 KB needs the attribute too.
  if (smem > 0 && cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, 200 * 1024) != cudaSuccess)
    per_sm = -1;
  if (per_sm == 0 && (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, threads, smem) != cudaSuccess))
    per_sm = -1;
  if (per_sm < 1) {
    cudaGetLastError();
    per_sm = 0;
  }
  cache.push_back({kernel, threads, smem, per_sm});
  return per_sm;
}

// Resident blocks of `kernel` at `threads` per block, cached per kernel instantiation and size.
template <typename Kernel>
int resident_blocks(Kernel kernel, int threads, const DeviceInfo& dev) {
  static int cache[11] = {};  // index log2(threads); per instantiation (same arch on all GPUs)
  int idx = 0;
  while ((1 << idx) < threads) ++idx;
  if (cache[idx] == 0) {
    int per_sm = 1;
    if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, threads, 0) != cudaSuccess || per_sm < 1) {
      cudaGetLastError();
      per_sm = 1;
    }
    cache[idx] = per_sm;
  }
  return cache[idx] * dev.sm_count;
}

// Blocks above kFwdRowMaxBlock: 512 threads with two vectors each. (1024 x 1 and 512 x 1 were slower
// everywhere in the session-12 sweep: rms 16384x8192 207.4 us, 16384x4096 99.0 vs 94.2.)
// Largest block of norm_fwd_row by op (KF_TUNE row_max_block): 512 lets 8192-element bf16 rows take
// 512 threads x 2 vectors (40 registers, 3 blocks per SM) instead of 256 x 4 (64, 4 blocks per SM):
// session 12 (prof_norm, 16384x8192) rms 183.4 -> 181.9 us, layer 183.5 -> 181.8 us.
// AdaLN without weight and bias too (its 512-thread kernel holds 4 blocks per SM: 16384x8192 187.1 ->
// 184.5 us; with weight or bias, or at 3 blocks per SM, AdaLN keeps 256: 189.7 us).
template <NormOp kOp>
int fwd_row_block_cap(const NormParams& p) {
  if (kOp == NormOp::kRms || kOp == NormOp::kLayer) return 512;
  if (OpTraits<kOp>::kAda && p.weight == nullptr && p.bias == nullptr) return 512;
  return kFwdRowMaxBlock;
}
template <int kIters>
constexpr int kFwdRowBigBlock = kIters == 2 ? 512 : kFwdRowMaxBlock;
// RMSNorm rows of 129-256 16-byte vectors (2048 bf16) take the kEarly kernel (weight loaded together
// with x, no register cap) for every grid: session 12, prof_norm fwd at 16384x2048, two rounds, 50.0 /
// 50.1 -> 49.0 / 49.1 us (2687 -> 2741 GB/s); at 4096 it is slower (93.6 -> 97.1 us), and for
// LayerNorm at 2048 it changes nothing (weight and bias: twice the registers).
constexpr bool kFwdEarlyRms = true;

// kBody: the row kernel with the scalar head (norm_fwd_row); the caller ensures it is the row kernel's
// case (tpr <= kFwdRowMaxBlock, or 512 x 2 over more than one wave of blocks).
template <typename T, NormOp kOp, int kVec, int kIters, bool kBody = false>
Status launch_fwd_regs(const NormParams& p, int tpr, int cluster, const DeviceInfo& dev, cudaStream_t stream) {
  if (kBody && cluster != 1) return Status::Cuda("norm forward: no scalar-head kernel for a cluster");
  const int block = std::max(tpr, tune("min_block", kFwdTuning<T>.min_block));
  const int rpb = block / tpr;
  int shift = 0;
  while ((1 << shift) < tpr) ++shift;
  auto kernel = norm_fwd_regs<T, kOp, kVec, kIters>;
  int64_t units = ceil_div(p.rows, rpb);
  if (cluster == 1) {
    if (tune("fwd_persist", kFwdPersist) != 0) {
      // Persistent: as many blocks as fit at once (times a wave factor), each looping over rows.
      const int64_t resident = int64_t(resident_blocks(kernel, block, dev)) * tune("fwd_waves", 1);
      units = std::min(units, std::max<int64_t>(resident, 1));
    } else if (block <= kFwdRowMaxBlock || (block <= kFwdRowBigBlock<kIters> && units > dev.sm_count)) {
      units = std::min<int64_t>(units, INT_MAX);  // one row group per block (the kernel loops past 2^31-1)
      Launch row(dim3(unsigned(units)), dim3(block), 0, stream, use_pdl(dev));
      constexpr int kB = kFwdRowBigBlock<kIters>;
      if constexpr (kB > kFwdRowMaxBlock) {
        if (block > kFwdRowMaxBlock) {  // 512 x 2 (fwd_row_block_cap)
          if constexpr (OpTraits<kOp>::kAda) {
            if (p.weight == nullptr && p.bias == nullptr && tune("ada_plain", 1) != 0)
              return launched(row(norm_fwd_row<T, kOp, kVec, kIters, false, true, kB, kBody>, p, shift),
                              "norm forward");
          }
          return launched(row(norm_fwd_row<T, kOp, kVec, kIters, false, false, kB, kBody>, p, shift), "norm forward");
        }
      }
      // kEarly: grids of at most one block per SM (decode), and RMSNorm's 2048-element rows (kFwdEarlyRms)
      if constexpr (!kBody) {
        if ((units <= dev.sm_count && tune("early", 1) != 0) || tune("early_all", 0) != 0 ||
            (kFwdEarlyRms && kOp == NormOp::kRms && p.n / kVec > 128 && p.n / kVec <= 256 &&
             tune("rms_early", 1) != 0)) {
          NormParams q = p;
          q.trigger = units <= dev.sm_count;
          return launched(row(norm_fwd_row<T, kOp, kVec, kIters, true>, q, shift), "norm forward");
        }
      }
      if constexpr (OpTraits<kOp>::kAda) {
        if (p.weight == nullptr && p.bias == nullptr && tune("ada_plain", 1) != 0)
          return launched(row(norm_fwd_row<T, kOp, kVec, kIters, false, true, kFwdRowMaxBlock, kBody>, p, shift),
                          "norm forward");
      }
      return launched(row(norm_fwd_row<T, kOp, kVec, kIters, false, false, kFwdRowMaxBlock, kBody>, p, shift),
                      "norm forward");
    } else if constexpr (kBody) {
      return Status::Cuda("norm forward: no scalar-head kernel for this configuration");
    } else {  // 512-thread teams: the persistent kernel
      units = std::min<int64_t>(units, int64_t(resident_blocks(kernel, block, dev)) * tune("fwd_waves", 1));
    }
    Launch persistent(dim3(unsigned(units)), dim3(block), 0, stream, use_pdl(dev));
    return launched(persistent(kernel, p, shift, 1), "norm forward");
  }
  units = std::min<int64_t>(units, INT_MAX / cluster);
  Launch cl(dim3(unsigned(units * cluster)), dim3(block), 0, stream, use_pdl(dev), cluster);
  return launched(cl(kernel, p, shift, cluster), "norm forward (cluster)");
}

// Bulk-copy pipeline (sm_90, 16-byte aligned rows): slice = N / C elements per CTA, S stages.
// Largest row slice per CTA before splitting over a cluster (measured: 32 KB slices beat 64 KB at
// 4096x65536 / 2048x131072 bf16, rms 2735 / 2623 vs 2581 / 2482 GB/s: more CTAs share a row, so more
// of them are resident and streaming).
constexpr int kBulkSliceBytes = 32 * 1024;
// Smallest row (bytes) that takes the bulk pipeline instead of the register kernel, by op (measured:
// the row kernel wins up to 16 KB rows for every op; AdaLN at 16384x8192 187.6 vs 200.4 us, at
// 4096x16384 118.4 vs 101.9 once its x loads were issued together, session 6).
template <NormOp kOp>
constexpr int kBulkMinRowBytes = 32 * 1024;
constexpr int kBulkStageBudget = 64 * 1024;  // shared memory for the stages of one CTA
// Vectors per thread of a row slice (threads per CTA = slice vectors / this, 128 to 512). Session 11
// sweep (prof_norm fwd GB/s, bf16, 4096x65536 / 2048x131072, output parameters loaded per chunk):
// 2 -> rms 2661 / 2577, layer 2428 / 2193; 8 -> rms 2701 / 2690, layer 2575 / 2516.
constexpr int kBulkVecsPerThread = 8;
// Ops whose weight/bias vectors of the thread's columns stay in registers across rows (norm_fwd_bulk
// kPV): no per-row L2 reads of the parameters (they were 2x the x bytes for LayerNorm). Same sweep:
// rms 2693 / 2686 -> 2743 / 2789, layer 2585 / 2550 -> 2592 / 2649; add_rms_norm (two stage buffers)
// 2667 / 2627 -> 2596 / 2517, so not there. LayerNorm's kernel then takes 98 registers (two CTAs per SM),
// so a third stage costs no occupancy: 96 KB of stages (4096x65536 2592 -> 2613).
template <NormOp kOp>
constexpr bool kBulkParamRegs = kOp == NormOp::kRms || kOp == NormOp::kLayer;
constexpr int kBulkStageBudgetLayerRegs = 96 * 1024;
// ... but not in clusters of 2 to 7: at 4096x65536 (cluster 4) the 512-thread kernel with per-vector
// parameter loads stays ahead (kforge bench 2641 vs 2584 GB/s; 2048x131072, cluster 8: 2309 vs 2642;
// 8192x16384, one CTA per row: prof_norm 2721 vs 2789).
constexpr int kBulkLayerRegsMinCluster = 8;

template <typename T, NormOp kOp, int kVec>
bool try_fwd_bulk(const NormParams& p, const DeviceInfo& dev, cudaStream_t stream, Status* st) {
  using Tr = OpTraits<kOp>;
  if (kVec == 1 || dev.capability < 90 || tune("bulk", 1) == 0) return false;
  const int64_t row_bytes = p.n * int64_t(sizeof(T));
  if (row_bytes < tune("bulk_min_row", kBulkMinRowBytes<kOp>)) return false;
  // Few rows (decode): the pipeline has nothing to overlap; its setup only adds latency.
  if (p.rows < int64_t(dev.sm_count) * tune("bulk_min_waves", 2)) return false;
  const int slice_cap = tune("bulk_slice", kBulkSliceBytes);
  int cluster = int(ceil_div(row_bytes, slice_cap));
  while (cluster <= kMaxCluster && (p.n % cluster != 0 || ((p.n / cluster) * int64_t(sizeof(T))) % 16 != 0)) ++cluster;
  if (cluster > kMaxCluster) return false;
  const int64_t slice_bytes = row_bytes / cluster;
  const int nbuf = Tr::kRes ? 2 : 1;
  // LayerNorm in clusters of 2 to kBulkLayerRegsMinCluster - 1 CTAs: the session-10 configuration (512
  // threads, per-vector parameter loads, 32 registers: three CTAs per SM).
  const bool layer_small =
      Tr::kLayer && !Tr::kAda && cluster > 1 && cluster < tune("bulk_layer_regs_cluster", kBulkLayerRegsMinCluster);
  const bool preg = kBulkParamRegs<kOp> && !layer_small && tune("bulk_preg", 1) != 0;
  const int budget = tune("bulk_smem", (preg && Tr::kLayer) ? kBulkStageBudgetLayerRegs : kBulkStageBudget);
  const int stages = int(std::min<int64_t>(kBulkMaxStages, std::max<int64_t>(2, budget / (slice_bytes * nbuf))));
  const size_t smem = size_t(stages) * nbuf * size_t(slice_bytes);
  if (smem > 200 * 1024) return false;
  const int64_t svec = (p.n / cluster) / kVec;
  const int vpt = tune("bulk_vpt", layer_small ? 2 : kBulkVecsPerThread);
  int tpr = std::min(512, std::max(128, pow2_ceil(ceil_div(svec, vpt))));
  auto kernel = norm_fwd_bulk<T, kOp, kVec>;
  if constexpr (kBulkParamRegs<kOp>) {  // weight/bias in registers (KF_TUNE bulk_preg=0: off)
    constexpr int kPV = kBulkVecsPerThread;
    if (preg && svec <= int64_t(512) * kPV) {
      kernel = norm_fwd_bulk<T, kOp, kVec, kPV>;
      tpr = std::max(128, pow2_ceil(ceil_div(svec, kPV)));
    }
    if (layer_small) kernel = norm_fwd_bulk<T, kOp, kVec, 0, 1>;
  }
  const int per_sm = cached_blocks_per_sm(reinterpret_cast<const void*>(kernel), tpr, smem);
  if (per_sm < 1) return false;
  int64_t ctas = int64_t(per_sm) * dev.sm_count;
  Launch cl(dim3(unsigned(std::max<int64_t>(cluster, (ctas / cluster) * cluster))), dim3(tpr), smem, stream, false,
            cluster);
  cudaLaunchConfig_t& cfg = cl.cfg;
  if (cluster > 1) {  // clusters must fit inside a GPC: size the persistent grid by resident clusters
    int clusters = 0;
    if (cudaOccupancyMaxActiveClusters(&clusters, kernel, &cfg) != cudaSuccess || clusters < 1) {
      cudaGetLastError();
      return false;
    }
    ctas = int64_t(clusters) * cluster;
  }
  ctas = std::min<int64_t>(ctas, p.rows * cluster);
  cfg.gridDim = dim3(unsigned(std::max<int64_t>(ctas, cluster)));
  Launch bulk(cfg.gridDim, cfg.blockDim, smem, stream, use_pdl(dev), cluster);
  cudaError_t err = bulk(kernel, p, cluster, stages);
  if (err != cudaSuccess) {
    cudaGetLastError();
    return false;  // e.g. no room for this cluster shape: the register kernels take it
  }
  *st = check_launch("norm forward (bulk)");
  return true;
}

// kBody: rows with a scalar head (norm_fwd_row); rows past the row kernel's reach (more than
// kMaxIters vectors per thread at its largest block) take the one-element kernels instead.
template <typename T, NormOp kOp, int kVec, bool kBody = false>
Status fwd_with_vec(const NormParams& p, const DeviceInfo& dev, cudaStream_t stream) {
  if constexpr (kVec > 1 && !kBody) {
    Status st;
    if (try_fwd_bulk<T, kOp, kVec>(p, dev, stream, &st)) return st;
  }
  constexpr NormTuning cfg = kFwdTuning<T>;
  constexpr int kMaxIters = kVec == 1 ? 16 : cfg.max_elems / kVec;
  const int64_t nvec = kBody ? ceil_div(p.n, kVec) : p.n / kVec;  // kBody: covers the body after any head
  if (kVec > 1 && tune("fwd_persist", kFwdPersist) == 0) {        // one row group per block (norm_fwd_row)
    const int want = tune("row_iters", kFwdRowIters);
    const int max_block = tune("row_max_block", fwd_row_block_cap<kOp>(p));
    int tpr = int(std::min<int64_t>(max_block, std::max<int64_t>(32, pow2_ceil(ceil_div(nvec, want)))));
    int it = pow2_ceil(ceil_div(nvec, tpr));
    // The big blocks take two vectors per thread, and grids of more than one block per SM (the
    // decode kernel, kEarly, keeps its 256-thread blocks).
    if (tpr > kFwdRowMaxBlock && (it != 2 || p.rows <= dev.sm_count)) {
      tpr = kFwdRowMaxBlock;
      it = pow2_ceil(ceil_div(nvec, tpr));
    }
    if (it <= kMaxIters) {
      switch (it) {
        case 1:
          return launch_fwd_regs<T, kOp, kVec, 1, kBody>(p, tpr, 1, dev, stream);
        case 2:
          return launch_fwd_regs<T, kOp, kVec, 2, kBody>(p, tpr, 1, dev, stream);
        case 4:
          return launch_fwd_regs<T, kOp, kVec, 4, kBody>(p, tpr, 1, dev, stream);
        default:
          if constexpr (kMaxIters >= 8) return launch_fwd_regs<T, kOp, kVec, 8, kBody>(p, tpr, 1, dev, stream);
      }
    }
  }
  if constexpr (kBody) return fwd_with_vec<T, kOp, 1>(p, dev, stream);
  const int target_team = tune("fwd_team", cfg.target_team);
  const int cluster_team = tune("cluster_team", cfg.cluster_team);
  const int iters = std::min(kMaxIters, pow2_ceil(ceil_div(nvec, target_team)));
  const bool clusters = dev.capability >= 90 && tune("clusters", 1) != 0;
  const int team_cap = std::min(tune("team_cap", kFwdMaxTeam), kFwdMaxTeam);
  int tpr = 0, cluster = 1;
  if (nvec <= int64_t(team_cap) * iters) {
    tpr = std::min(team_cap, std::max(32, pow2_ceil(ceil_div(nvec, iters))));
  } else if (clusters && nvec <= int64_t(cluster_team) * iters * kMaxCluster) {
    tpr = cluster_team;
    cluster = int(ceil_div(nvec, int64_t(tpr) * iters));
  }
  if (tpr == 0) {  // streaming: one 1024-thread block per row
    const int64_t grid = std::min<int64_t>(p.rows, INT_MAX);
    Launch ls(dim3(unsigned(grid)), dim3(1024), 0, stream, use_pdl(dev));
    return launched(ls(norm_fwd_stream<T, kOp, kVec>, p), "norm forward (streaming)");
  }
  switch (iters) {
    case 1:
      return launch_fwd_regs<T, kOp, kVec, 1>(p, tpr, cluster, dev, stream);
    case 2:
      return launch_fwd_regs<T, kOp, kVec, 2>(p, tpr, cluster, dev, stream);
    case 4:
      return launch_fwd_regs<T, kOp, kVec, 4>(p, tpr, cluster, dev, stream);
    case 8:
      return launch_fwd_regs<T, kOp, kVec, 8>(p, tpr, cluster, dev, stream);
    default:
      if constexpr (kMaxIters >= 16) return launch_fwd_regs<T, kOp, kVec, 16>(p, tpr, cluster, dev, stream);
      return Status::Cuda("norm forward: no kernel for this configuration");
  }
}

template <typename T, NormOp kOp>
Status fwd_op(const NormParams& p, const DeviceInfo& dev, cudaStream_t stream) {
  if (can_vectorize<T>(p)) return fwd_with_vec<T, kOp, 16 / sizeof(T)>(p, dev, stream);
  // Odd N or rows off a 16-byte boundary whose row tensors share that offset: a scalar head per row,
  // 16-byte vectors after it (KF_TUNE norm_body=0: the one-element kernels).
  if (can_align_body<T>(p) && tune("norm_body", 1) != 0)
    return fwd_with_vec<T, kOp, 16 / sizeof(T), true>(p, dev, stream);
  return fwd_with_vec<T, kOp, 1>(p, dev, stream);
}

// out_s = column sums of the slabs part_s (s < 2; an absent output or slab is skipped), one launch.
template <typename OutT, typename T>
Status reduce_into(const float* part_a, OutT* out_a, const float* part_d, OutT* out_d, int64_t n, int64_t ld,
                   int64_t rows_per_out, int64_t out_rows, int64_t out_ld, const T* scale, int64_t scale_stride,
                   bool pdl, cudaStream_t stream) {
  ColSums<OutT, T> a = {};
  int slabs = 0;
  if (part_a && out_a) {
    a.part[slabs] = part_a;
    a.out[slabs++] = out_a;
  }
  if (part_d && out_d) {
    a.part[slabs] = part_d;
    a.out[slabs++] = out_d;
  }
  if (slabs == 0) return Status::Ok();
  a.n = n;
  a.ld = ld;
  a.R = rows_per_out;
  a.out_rows = out_rows;
  a.out_ld = out_ld;
  a.scale = scale;
  a.scale_stride = scale_stride;
  const dim3 grid(unsigned(ceil_div(ld / 4, kColTileX)), unsigned(std::min<int64_t>(out_rows, 65535)), unsigned(slabs));
  Launch lr(grid, dim3(kColTileX, kColTileY), 0, stream, pdl);
  return launched(lr(reduce_columns<OutT, T>, a), "norm backward (column reduction)");
}

// kBody: the register kernel with a scalar head per row (norm_bwd_regs), plain loads; rows its
// registers cannot hold take the one-element kernels.
template <typename T, NormOp kOp, int kVec, bool kBody = false>
Status bwd_with_vec(const NormParams& p, const DeviceInfo& dev, void* workspace, size_t* workspace_bytes,
                    cudaStream_t stream) {
  using Tr = OpTraits<kOp>;
  // Plain kernel: AdaLN also holds scale and bias per element, so half the elements per thread.
  // The bulk kernel keeps x/dy in shared memory and takes the full count for every op.
  constexpr int kMaxIters = std::max(1, kBwdMaxElems / kVec);
  // sm_90 with 16-byte aligned rows: stream x/dy(/dsum) rows through shared memory (bulk copies).
  const int nbuf = p.dsum ? 3 : 2;
  const int64_t stage_bytes = int64_t(nbuf) * p.n * int64_t(sizeof(T));
  const int budget = tune("bwd_bulk_smem", 96 * 1024);
  const bool bulk_ok = kVec > 1 && !kBody && dev.capability >= 90 && tune("bulk", 1) != 0 && 2 * stage_bytes <= budget;
  // (kBody: AdaLN keeps the full count, spilling, unless KF_TUNE body_ada_full=0: sweep)
  const bool halve = Tr::kAda && !bulk_ok && (!kBody || tune("body_ada_full", 1) == 0);
  const int max_iters = halve ? std::max(1, kMaxIters / 2) : kMaxIters;
  const int64_t nvec = kBody ? ceil_div(p.n, kVec) : p.n / kVec;  // kBody: covers the body after any head
  const int iters = std::min(max_iters, pow2_ceil(ceil_div(nvec, tune("bwd_team", kBwdTargetTeam))));
  const bool regs = nvec <= int64_t(kBwdMaxTeam) * iters;
  if constexpr (kBody) {
    if (!regs) return bwd_with_vec<T, kOp, 1>(p, dev, workspace, workspace_bytes, stream);
  }
  const int tpr =
      regs ? std::min(kBwdMaxTeam, std::max(kBwdMinTeam, pow2_ceil(ceil_div(nvec, iters)))) : kBwdStreamTeam;

  bool bulk = regs && bulk_ok && p.rows >= int64_t(dev.sm_count) * tune("bulk_min_waves", 2);
  int stages = bulk ? int(std::min<int64_t>(kBulkMaxStages, budget / stage_bytes)) : 1;
  size_t smem = bulk ? size_t(stages) * size_t(stage_bytes) : 0;
  int threads = tpr;
  int64_t chunk = 1;  // rows per work unit (norm_bwd_chunk: rows per chunk)

  using Kernel = void (*)(const NormParams, const BwdWork, const int);
  Kernel kernel = nullptr;
  auto pick = [&](auto k_plain, auto k_bulk) { kernel = bulk ? Kernel(k_bulk) : Kernel(k_plain); };
  if constexpr (kBody) {  // (the plain kernel with the head; no bulk, chunk or split kernel)
    if (iters == 1)
      kernel = norm_bwd_regs<T, kOp, kVec, 1, false, false, true>;
    else if (iters == 2)
      kernel = norm_bwd_regs<T, kOp, kVec, 2, false, false, true>;
    else if constexpr (kMaxIters >= 4) {
      if (iters == 4) kernel = norm_bwd_regs<T, kOp, kVec, 4, false, false, true>;
    }
  }
  // Chunked kernel (norm_bwd_chunk): sm_90, 16-byte rows of up to 2 vectors per thread at <= 512
  // threads, many rows, and no per-row AdaLN scale (its dscale/dshift are row tensors).
  if constexpr (kVec > 1 && !kBody) {
    const int64_t team = tune("bwd_chunk_team", kBwdChunkTeam);
    const int citers = nvec <= team ? 1 : 2;
    const int64_t cthreads = ceil_div(ceil_div(nvec, citers), 32) * 32;
    const int cstages = std::max(2, std::min(kBulkMaxStages, tune("bwd_chunk_stages", kBwdChunkStages)));
    const int64_t crow = int64_t(nbuf) * p.n * int64_t(sizeof(T));  // stage bytes per row
    const int64_t group_rows = (Tr::kAda && p.ada_rpg > 1) ? p.ada_rpg : p.rows;
    // (two vectors per thread: one block per SM, so that 2 rows per chunk fit at N = 8192 bf16)
    const int64_t cbudget = tune("bwd_chunk_smem", citers == 1 ? kBwdChunkSmem : 2 * kBwdChunkSmem);
    const int64_t crows = std::min<int64_t>(
        {int64_t(tune("bwd_chunk_rows", 8)), int64_t(citers == 1 ? 8 : 2), group_rows, cbudget / (crow * cstages)});
    if (dev.capability >= 90 && tune("bwd_chunk", 1) != 0 && (!Tr::kAda || p.ada_rpg > 1) && cthreads <= 512 &&
        crows >= 1 && p.rows >= int64_t(dev.sm_count) * tune("bulk_min_waves", 2)) {
      if (citers == 1)
        kernel = crows <= 4 ? Kernel(norm_bwd_chunk<T, kOp, kVec, 1, 4>) : Kernel(norm_bwd_chunk<T, kOp, kVec, 1, 8>);
      else
        kernel = crows <= 1 ? Kernel(norm_bwd_chunk<T, kOp, kVec, 2, 1>) : Kernel(norm_bwd_chunk<T, kOp, kVec, 2, 2>);
      bulk = true;
      threads = int(cthreads);
      chunk = crows;
      stages = cstages;
      smem = size_t(cstages) * size_t(crows * crow);
    }
  }
  // Split backward (rows too long for one block's registers, 16-byte vectors): norm_bwd_rowstats, then
  // norm_bwd_regs<..., kTile> over column tiles of kSplitTeam threads x kSplitIters vectors.
  int64_t tiles = 1;
  bool split = false;
  if constexpr (kVec > 1 && !kBody) {
    if (kernel == nullptr && !regs && tune("bwd_split", 1) != 0) {
      kernel = norm_bwd_regs<T, kOp, kVec, kSplitIters, false, true>;
      split = true;
      threads = kSplitTeam;
      tiles = ceil_div(p.n, int64_t(kSplitTeam) * kSplitIters * kVec);
    }
  }
  if (kernel != nullptr) {
  } else if (!regs)
    kernel = norm_bwd_stream<T, kOp, kVec>;
  else if (iters == 1)
    pick(norm_bwd_regs<T, kOp, kVec, 1, false>, norm_bwd_regs<T, kOp, kVec, 1, (kVec > 1)>);
  else if (iters == 2) {
    if constexpr (kMaxIters >= 2)
      pick(norm_bwd_regs<T, kOp, kVec, 2, false>, norm_bwd_regs<T, kOp, kVec, 2, (kVec > 1)>);
  } else if (iters == 4) {
    if constexpr (kMaxIters >= 4)
      pick(norm_bwd_regs<T, kOp, kVec, 4, false>, norm_bwd_regs<T, kOp, kVec, 4, (kVec > 1)>);
  } else if (iters == 8) {
    if constexpr (kMaxIters >= 8)
      pick(norm_bwd_regs<T, kOp, kVec, 8, false>, norm_bwd_regs<T, kOp, kVec, 8, (kVec > 1)>);
  } else if (iters == 16) {
    if constexpr (kMaxIters >= 16)
      pick(norm_bwd_regs<T, kOp, kVec, 16, false>, norm_bwd_regs<T, kOp, kVec, 16, (kVec > 1)>);
  }
  if (kernel == nullptr) return Status::Cuda("norm backward: no kernel for this configuration");

  BwdWork wk = {};
  wk.grouped = Tr::kAda && p.ada_rpg > 1;
  wk.groups = wk.grouped ? p.ada_groups : 1;
  wk.group_rows = wk.grouped ? p.ada_rpg : p.rows;
  wk.chunk = chunk;
  int64_t target;
  if (bulk) {
    const int per_sm = cached_blocks_per_sm(reinterpret_cast<const void*>(kernel), threads, smem);
    if (per_sm < 1)
      return Status::Cuda("norm backward: cannot reserve " + std::to_string(smem) + " bytes of shared memory");
    target = int64_t(per_sm) * dev.sm_count * tune("bwd_waves", 1);
  } else {
    target = int64_t(resident_blocks(kernel, threads, dev)) * tune("bwd_waves", 1);
    if (split) target = std::max<int64_t>(1, ceil_div(target * tune("bwd_split_waves", 2), tiles));
  }
  // kBody: the rows of a block must share their head length. Row r's head follows the misalignment
  // of x + r·x_stride, periodic in r with period P = 16 / gcd(16, row stride in bytes mod 16); with
  // blocks per group a multiple of P, block b's rows (b % bpg) + k·bpg of its group all have the same.
  int64_t period = 1;
  if constexpr (kBody) {
    const int64_t sb = p.rows > 1 ? (p.x_stride * int64_t(sizeof(T))) % 16 : 0;
    while (period < 16 && (sb * period) % 16 != 0) period *= 2;
  }
  int64_t nblocks;
  if (wk.groups >= target && period == 1) {
    wk.bpg = 1;
    nblocks = std::min<int64_t>(target, INT_MAX);
  } else {  // blocks per group: at most one per work unit (row or chunk) of the group
    wk.bpg = std::max<int64_t>(1, std::min(ceil_div(wk.group_rows, chunk), ceil_div(target, wk.groups)));
    // (rounded down: one more block than the resident ones would run a second wave of blocks; 136
    // instead of 132 blocks doubled the time of a 16384x8191 RMSNorm backward)
    wk.bpg = std::max<int64_t>(period, wk.bpg / period * period);
    nblocks = wk.groups * wk.bpg;
    if constexpr (kBody) {
      if (nblocks > INT_MAX) return bwd_with_vec<T, kOp, 1>(p, dev, workspace, workspace_bytes, stream);
    }
  }
  // Partial rows: one per block, or one per group when a block owns whole groups. Grouped AdaLN
  // with bpg > 1 also needs the per-group sums A, D [G, N] before the final step.
  const int64_t prows = (wk.grouped && wk.bpg == 1) ? wk.groups : nblocks;
  const bool need_a = p.dweight || (wk.grouped && p.dscale);
  const bool need_d = ((Tr::kLayer || Tr::kAda) && p.dbias) || (wk.grouped && (p.dscale || p.dshift));
  const bool staged = wk.grouped && wk.bpg > 1;
  wk.ld = ceil_div(p.n, 4) * 4;
  const int64_t slab = prows * wk.ld, gslab = staged ? wk.groups * wk.ld : 0;
  const int64_t stats_floats = split ? 4 * p.rows : 0;  // row_stats: float4 per row
  // (+16 bytes: the partial rows start on a 16-byte boundary whatever the caller's alignment)
  const size_t need =
      size_t((need_a ? slab + gslab : 0) + (need_d ? slab + gslab : 0) + stats_floats) * sizeof(float) + 16;
  if (workspace == nullptr) {
    *workspace_bytes = need;
    return Status::Ok();
  }
  if (*workspace_bytes < need)
    return Status::Invalid("norm backward: workspace too small: need " + std::to_string(need) + " bytes, got " +
                           std::to_string(*workspace_bytes));
  float* ws = reinterpret_cast<float*>((reinterpret_cast<uintptr_t>(workspace) + 15) & ~uintptr_t(15));
  float* ga = nullptr;
  float* gd = nullptr;
  if (need_a) {
    wk.part_a = ws;
    ws += slab;
    ga = staged ? ws : wk.part_a;
    ws += gslab;
  }
  if (need_d) {
    wk.part_d = ws;
    ws += slab;
    gd = staged ? ws : wk.part_d;
    ws += gslab;
  }

  const bool pdl = use_pdl(dev);
  Status s;
  if constexpr (kVec > 1) {
    if (split) {
      float4* row_stats = reinterpret_cast<float4*>(ws);
      wk.row_stats = row_stats;
      auto sk = norm_bwd_rowstats<T, kOp, kVec>;
      const int64_t sgrid = std::min<int64_t>(p.rows, resident_blocks(sk, kBwdStreamTeam, dev));
      Launch ls(dim3(unsigned(sgrid)), dim3(kBwdStreamTeam), 0, stream, pdl);
      if (!(s = launched(ls(sk, p, row_stats), "norm backward (row statistics)")).ok()) return s;
    }
  }
  Launch lb(dim3(unsigned(nblocks), unsigned(tiles)), dim3(threads), smem, stream, pdl);
  s = launched(lb(kernel, p, wk, stages), "norm backward");
  if (!s.ok()) return s;
  const T* no_scale = nullptr;
  T* dw = static_cast<T*>(p.dweight);
  T* db = static_cast<T*>(p.dbias);
  if (!wk.grouped)  // dw = Σ A, db = Σ D over the blocks' partial rows
    return reduce_into<T, T>(wk.part_a, dw, wk.part_d, (Tr::kLayer || Tr::kAda) ? db : nullptr, p.n, wk.ld, nblocks, 1,
                             p.n, no_scale, 0, pdl, stream);
  // Grouped AdaLN without weight and bias (DiT-style): dscale_g = A_g and dshift_g = D_g, so the
  // per-group reduction writes them directly (one kernel instead of two).
  if (staged && !p.weight && !p.bias)
    return reduce_into<T, T>(p.dscale ? wk.part_a : nullptr, static_cast<T*>(p.dscale), p.dshift ? wk.part_d : nullptr,
                             static_cast<T*>(p.dshift), p.n, wk.ld, wk.bpg, wk.groups, p.n, no_scale, 0, pdl, stream);
  // Grouped AdaLN: per-group sums (when several blocks shared a group), then the parameter grads.
  if (staged) {
    if (!(s = reduce_into<float, T>(wk.part_a, ga, wk.part_d, gd, p.n, wk.ld, wk.bpg, wk.groups, wk.ld, no_scale, 0,
                                    pdl, stream))
             .ok())
      return s;
  }
  if (p.dscale || p.dshift) {
    const int64_t total = wk.groups * p.n;
    const int64_t grid = std::min<int64_t>(ceil_div(total, 256), int64_t(dev.sm_count) * 16);
    Launch lg(dim3(unsigned(grid)), dim3(256), 0, stream, pdl);
    const float* cga = ga;
    const float* cgd = gd;
    s = launched(lg(ada_group_grads<T>, cga, cgd, p.n, wk.ld, total, static_cast<const T*>(p.weight),
                    static_cast<const T*>(p.bias), static_cast<T*>(p.dscale), static_cast<T*>(p.dshift)),
                 "ada_norm backward (scale/shift)");
    if (!s.ok()) return s;
  }
  const T* sc = static_cast<const T*>(p.scale);
  return reduce_into<T, T>(ga, dw, gd, db, p.n, wk.ld, wk.groups, 1, p.n, sc, p.scale_stride, pdl, stream);
}

template <typename T, NormOp kOp>
Status bwd_op(const NormParams& p, const DeviceInfo& dev, void* ws, size_t* bytes, cudaStream_t stream) {
  if (can_vectorize<T>(p)) return bwd_with_vec<T, kOp, 16 / sizeof(T)>(p, dev, ws, bytes, stream);
  // Odd N or rows off a 16-byte boundary whose row tensors share their misalignment: a scalar head
  // per row, 16-byte vectors after it (KF_TUNE norm_body=0: the one-element kernels).
  if (can_align_body_bwd<T>(p) && tune("norm_body", 1) != 0)
    return bwd_with_vec<T, kOp, 16 / sizeof(T), true>(p, dev, ws, bytes, stream);
  return bwd_with_vec<T, kOp, 1>(p, dev, ws, bytes, stream);
}

}  // namespace norm_detail

// One definition per dtype, instantiated in norm_fwd_<dtype>.cu / norm_bwd_<dtype>.cu.
#define KF_NORM_FWD_DEFINE(T)                                                                             \
  template <>                                                                                             \
  Status launch_norm_fwd<T>(NormOp op, const NormParams& p, const DeviceInfo& dev, cudaStream_t stream) { \
    using namespace norm_detail;                                                                          \
    if (p.rows == 0 || p.n == 0) return Status::Ok();                                                     \
    switch (op) {                                                                                         \
      case NormOp::kRms:                                                                                  \
        return fwd_op<T, NormOp::kRms>(p, dev, stream);                                                   \
      case NormOp::kAddRms:                                                                               \
        return fwd_op<T, NormOp::kAddRms>(p, dev, stream);                                                \
      case NormOp::kLayer:                                                                                \
        return fwd_op<T, NormOp::kLayer>(p, dev, stream);                                                 \
      case NormOp::kAdaRms:                                                                               \
        return fwd_op<T, NormOp::kAdaRms>(p, dev, stream);                                                \
      case NormOp::kAdaLayer:                                                                             \
        return fwd_op<T, NormOp::kAdaLayer>(p, dev, stream);                                              \
    }                                                                                                     \
    return Status::Invalid("norm forward: unknown op");                                                   \
  }

#define KF_NORM_BWD_DEFINE(T)                                                                               \
  template <>                                                                                               \
  Status launch_norm_bwd<T>(NormOp op, const NormParams& p, const DeviceInfo& dev, void* ws, size_t* bytes, \
                            cudaStream_t stream) {                                                          \
    using namespace norm_detail;                                                                            \
    switch (op) {                                                                                           \
      case NormOp::kRms:                                                                                    \
        return bwd_op<T, NormOp::kRms>(p, dev, ws, bytes, stream);                                          \
      case NormOp::kAddRms:                                                                                 \
        return bwd_op<T, NormOp::kAddRms>(p, dev, ws, bytes, stream);                                       \
      case NormOp::kLayer:                                                                                  \
        return bwd_op<T, NormOp::kLayer>(p, dev, ws, bytes, stream);                                        \
      case NormOp::kAdaRms:                                                                                 \
        return bwd_op<T, NormOp::kAdaRms>(p, dev, ws, bytes, stream);                                       \
      case NormOp::kAdaLayer:                                                                               \
        return bwd_op<T, NormOp::kAdaLayer>(p, dev, ws, bytes, stream);                                     \
    }                                                                                                       \
    return Status::Invalid("norm backward: unknown op");                                                    \
  }

}  // namespace kernelforge
