// Softmax-family kernels: softmax and log_softmax over rows, forward and backward (formulas in
// include/kernelforge/softmax.h).
//
// Napkin math (H100 SXM 80 GB: ~3.0 TB/s device-to-device copy, 132 SMs, 50 MB L2):
//   forward:  read x, write y         2·M·N·sizeof(T) B; 16384x4096 bf16 -> 268 MB -> 90 µs at 3.0 TB/s,
//                                     94 µs at the 2.85 TB/s target; 4096x131072 bf16 -> 2.15 GB -> 754 µs.
//   backward: read g, y, write dx     3·M·N·sizeof(T) B; forward + backward = 5 passes.
//   Arithmetic per element: forward 2 MUFU ex2 (one for the sum, one for the output; log_softmax 1)
//   and ~10 float ops; at 3 TB/s a bf16 forward moves 7.5·10^11 elements/s against ~3.7·10^12 MUFU
//   ops/s: memory-bound, MUFU at ~40 % at most.
//
// Design: one reduction per row, the row held in registers between the reduction and the write, so
// x (g and y) are read from DRAM once.
//   * softmax_regs: a team of tpr threads (a power of two, 1..512; teams are aligned groups of a
//     block, several rows per block for short rows) owns a row; thread t holds kIters vectors of
//     kVec elements (vector v = rank·tpr·kIters + i·tpr + t: a team's loads are coalesced). The
//     forward reduces (m, s) pairs in ONE reduction: the online-softmax combine
//       (m1, s1) + (m2, s2) = (m, s1·exp(m1 − m) + s2·exp(m2 − m)),  m = max(m1, m2);
//     the backward reduces one sum (softmax: Σ g·y, log_softmax: Σ g).
//   * Rows longer than one CTA holds are split over a thread-block cluster (sm_90, up to 8 CTAs):
//     each CTA holds a slice in registers and the per-CTA results are combined through distributed
//     shared memory (every CTA combines the ranks in the same order: identical bits everywhere).
//   * Longer still, or no clusters (sm_75/sm_80): softmax_stream, one block per row, reads the row
//     twice (pass 1 online (m, s) or the sum, pass 2 writes; the second read is mostly an L2 hit).
// Vector width: 16 bytes when every base pointer and (with more than one row) every row stride in
// bytes allows it, else one element; a row's last, partial vector is read element by element and
// padded with -inf (forward: it adds exp(-inf) = 0 to s and nothing to the max) or 0 (backward).
// Special values as torch.softmax: fmaxf skips NaN, but a NaN, a +inf (exp(inf − inf)) or an
// all -inf row (exp(-inf − (-inf))) makes s, and so every output of the row, NaN.
// Math: float32; exp(v) = ex2.approx(v·log2 e) (relative error ~2^-22 for the arguments that
// matter), 1/s and log(s) once per row, precise; each output is rounded once to T.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdint>
#include <mutex>
#include <type_traits>
#include <vector>

#include "common/bulk_copy.cuh"
#include "common/cluster.cuh"
#include "common/device.h"
#include "common/launch.cuh"
#include "common/vec.cuh"
#include "softmax/softmax_problem.h"

namespace kernelforge {
namespace softmax_detail {

// ---- tuning (first guesses from the napkin math; to be measured on the H100, notes/softmax.md) ----
// Little's law: ~3 TB/s × ~0.8 µs DRAM latency ≈ 2.4 MB in flight, ~18 KB per SM. 16-byte vectors
// per thread aimed for: 2 (32 B; with ~1500+ resident threads per SM that is ~48 KB per SM).
struct SoftmaxTuning {
  int row_vecs;   // vectors per thread aimed for (teams grow first, up to kMaxTeam threads)
  int max_iters;  // register-resident vectors per thread: forward 8 x 16 B = 32 registers of x;
                  // backward 8 x (g, y) = 64 registers (still no spill under the 128-register cap)
};
constexpr SoftmaxTuning kFwdTuning = {2, 8};
constexpr SoftmaxTuning kBwdTuning = {2, 8};
constexpr int kMaxTeam = 512;      // threads per row per CTA: __launch_bounds__(512) = 128 registers/thread
constexpr int kMinBlock = 128;     // short rows are packed into blocks of at least this many threads
constexpr int kStreamTeam = 1024;  // threads per row of the streaming kernel
// Row slice per CTA aimed for in a cluster (bytes): more CTAs per row keep more of the row's loads
// in flight per SM (the norm family measured 32 KB slices ahead of 64 KB at 64-128 K-element rows).
// 4096x131072 bf16: 256 KB rows -> 8 CTAs x 512 threads x 4 vectors.
constexpr int kClusterSliceBytes = 32 * 1024;
constexpr int kWarps = (kMaxTeam > kStreamTeam ? kMaxTeam : kStreamTeam) / 32;  // warps of the largest block

constexpr float kLog2e = 1.4426950408889634f;

// exp2 on the MUFU (ex2.approx.ftz): ex2(-inf) = 0, ex2(NaN) = NaN; flushes results below 2^-126.
__device__ __forceinline__ float ex2(float v) {
  float r;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(v));
  return r;
}

// ---- reductions --------------------------------------------------------------------------------
// (m, s): a row's max and the sum of exp(x − m). The identity is (-inf, 0).
struct MaxSum {
  float m, s;
};
struct MaxSumOp {
  using V = MaxSum;
  static __device__ __forceinline__ V identity() { return {-INFINITY, 0.f}; }
  // Commutative in bits (fmaxf and + are): the butterfly lanes agree exactly. A part whose m equals
  // the new max keeps its s unscaled (this also covers m1 = m2 = -inf, where exp(m1 − m) would be
  // exp(NaN)); a NaN in s or m stays NaN.
  static __device__ __forceinline__ V combine(V a, V b) {
    const float m = fmaxf(a.m, b.m);
    const float sa = a.m == m ? a.s : a.s * ex2((a.m - m) * kLog2e);
    const float sb = b.m == m ? b.s : b.s * ex2((b.m - m) * kLog2e);
    return {m, sa + sb};
  }
  static __device__ __forceinline__ V shfl_xor(V v, int off) {
    return {__shfl_xor_sync(0xffffffffu, v.m, off), __shfl_xor_sync(0xffffffffu, v.s, off)};
  }
};
struct MaxOp {
  using V = float;
  static __device__ __forceinline__ V identity() { return -INFINITY; }
  static __device__ __forceinline__ V combine(V a, V b) { return fmaxf(a, b); }
  static __device__ __forceinline__ V shfl_xor(V v, int off) { return __shfl_xor_sync(0xffffffffu, v, off); }
};
struct SumOp {
  using V = float;
  static __device__ __forceinline__ V identity() { return 0.f; }
  static __device__ __forceinline__ V combine(V a, V b) { return a + b; }
  static __device__ __forceinline__ V shfl_xor(V v, int off) { return __shfl_xor_sync(0xffffffffu, v, off); }
};

// Shared slots of one reduction, double-buffered so consecutive reductions need one barrier each.
template <typename V>
struct RedSmem {
  V warp[2][kWarps];
  V cta[2];  // this CTA's result, read by the other CTAs of the cluster
};

// Reduces v over a team of tpr threads (a power of two; teams are aligned groups of the block, whose
// size is a multiple of 32), then over the CTAs of the cluster when cluster > 1 (then a team is the
// whole CTA). Every thread of the team (and cluster) receives identical bits. Every thread of the
// block must call it (it may contain __syncthreads and cluster barriers).
template <typename Op>
__device__ __forceinline__ typename Op::V team_reduce(typename Op::V v, int tpr, int team, RedSmem<typename Op::V>& sm,
                                                      int& slot, int cluster) {
  using V = typename Op::V;
  for (int off = (tpr < 32 ? tpr : 32) >> 1; off > 0; off >>= 1) v = Op::combine(v, Op::shfl_xor(v, off));
  if (tpr > 32) {
    const int warp = int(threadIdx.x) >> 5, lane = int(threadIdx.x) & 31, nw = tpr >> 5;
    if (lane == 0) sm.warp[slot][warp] = v;
    __syncthreads();
    v = lane < nw ? sm.warp[slot][team * nw + lane] : Op::identity();
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) v = Op::combine(v, Op::shfl_xor(v, off));
  }
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  if (cluster > 1) {  // lane r gets rank r's result (common/cluster.cuh), then the lanes are folded
    v = cluster_gather(v, &sm.cta[slot], cluster, Op::identity());
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) v = Op::combine(v, Op::shfl_xor(v, off));
  }
#else
  (void)cluster;
#endif
  slot ^= 1;
  return v;
}

// The (m, s) of kVec values: m = max, s = Σ exp(x − m) (s = 0 when every value is -inf).
template <typename T, int kVec>
__device__ __forceinline__ MaxSum vec_max_sum(const Vec<T, kVec>& a) {
  float m = -INFINITY;
#pragma unroll
  for (int j = 0; j < kVec; ++j) m = fmaxf(m, a.get(j));
  const float base = m == -INFINITY ? 0.f : m;
  float s = 0.f;
#pragma unroll
  for (int j = 0; j < kVec; ++j) s += ex2((a.get(j) - base) * kLog2e);
  return {m, s};
}

// The row's outputs for one vector, from the reduction's result.
//   softmax:      y = exp(x − m) · (1/s)                 (inv = 1/s)
//   log_softmax:  y = (x − m) − log(s)                   (lse_off = log(s))
//   softmax bwd:  dx = y · (g − Σ g·y)                   (r = Σ g·y)
//   log bwd:      dx = g − exp(y) · Σ g                  (r = Σ g)
template <typename T, bool kLog, int kVec>
__device__ __forceinline__ void fwd_out(const Vec<T, kVec>& a, float m, float k, float (&f)[kVec]) {
#pragma unroll
  for (int j = 0; j < kVec; ++j) {
    const float d = a.get(j) - m;
    f[j] = kLog ? d - k : ex2(d * kLog2e) * k;
  }
}
template <typename T, bool kLog, int kVec>
__device__ __forceinline__ void bwd_out(const Vec<T, kVec>& g, const Vec<T, kVec>& y, float r, float (&f)[kVec]) {
#pragma unroll
  for (int j = 0; j < kVec; ++j) {
    const float gj = g.get(j), yj = y.get(j);
    f[j] = kLog ? fmaf(-ex2(yj * kLog2e), r, gj) : yj * (gj - r);
  }
}
template <typename T, bool kLog, int kVec>
__device__ __forceinline__ float bwd_partial(const Vec<T, kVec>& g, const Vec<T, kVec>& y) {
  float acc = 0.f;
#pragma unroll
  for (int j = 0; j < kVec; ++j) acc = kLog ? acc + g.get(j) : fmaf(g.get(j), y.get(j), acc);
  return acc;
}

// ---- forward modes 1 and 4 (see softmax_regs) -----------------------------------------------------
// f over v[0..N) as a pairwise tree (v is overwritten).
template <int N, typename F>
__device__ __forceinline__ float tree_reduce(float (&v)[N], F f) {
#pragma unroll
  for (int w = 1; w < N; w *= 2)
#pragma unroll
    for (int i = 0; i + w < N; i += 2 * w) v[i] = f(v[i], v[i + w]);
  return v[0];
}

// Special values: M = fmaxf over the row skips NaN; a NaN, a +inf (inf − inf) or an all −inf row
// (−inf − (−inf)) gives a NaN exponential and so a NaN S and row, as mode 0.
template <typename T, bool kLog, int kVec, int kIters, int kMode>
__device__ __forceinline__ void fwd_modes(Vec<T, kVec> (&a)[kIters], const SoftmaxParams& p, int64_t row, bool row_ok,
                                          int v0, int tpr, int team, RedSmem<float>& smf, int& slot_f) {
  const int n = int(p.n);
  constexpr int kN = kIters * kVec;
  float t[kN];  // pairwise trees: log2(kN) dependent steps instead of kN
#pragma unroll
  for (int i = 0; i < kIters; ++i)
#pragma unroll
    for (int j = 0; j < kVec; ++j) t[i * kVec + j] = a[i].get(j);
  const float m = tree_reduce(t, [](float u, float v) { return fmaxf(u, v); });
#pragma unroll
  for (int i = 0; i < kIters; ++i) launder(a[i]);  // packed across the reduction: 4 registers per vector
  float e[kLog ? 1 : kIters][kLog ? 1 : kVec];
  const float big_m = team_reduce<MaxOp>(m, tpr, team, smf, slot_f, 1);
  float s = 0.f;
#pragma unroll
  for (int i = 0; i < kIters; ++i)
#pragma unroll
    for (int j = 0; j < kVec; ++j) {
      const float ej = ex2((a[i].get(j) - big_m) * kLog2e);
      if constexpr (!kLog && kMode != 4) e[i][j] = ej;
      t[i * kVec + j] = ej;
    }
  s = tree_reduce(t, [](float u, float v) { return u + v; });
  if constexpr (kLog || kMode == 4) {
#pragma unroll
    for (int i = 0; i < kIters; ++i) launder(a[i]);
  }
  s = team_reduce<SumOp>(s, tpr, team, smf, slot_f, 1);
  if (!row_ok) return;
  T* out = static_cast<T*>(p.out) + row * p.out_stride;
  const float k = kLog ? logf(s) : 1.f / s;
#pragma unroll
  for (int i = 0; i < kIters; ++i) {
    const int c = (v0 + i * tpr) * kVec;
    if (c >= n) continue;
    float f[kVec];
#pragma unroll
    for (int j = 0; j < kVec; ++j) {
      if constexpr (kLog) {
        f[j] = (a[i].get(j) - big_m) - k;
      } else if constexpr (kMode == 4) {
        f[j] = ex2((a[i].get(j) - big_m) * kLog2e) * k;
      } else {
        f[j] = e[i][j] * k;
      }
    }
    store_row_vec<T, kVec>(out, c, n, f);
  }
}

// ---- the register kernel -------------------------------------------------------------------------
// Rows base + team for base = (blockIdx.x / cluster)·rpb, stepping by the grid (the grid is capped
// at 2^31 − 1 blocks). cluster > 1 (sm_90): one team per CTA, CTA rank r holds vectors
// [r·tpr·kIters, (r + 1)·tpr·kIters) of the row. Column offsets are 32-bit (n < 2^31, and the padded
// columns of the last CTA stay below kMaxCluster·kMaxTeam·8·kVec), row offsets 64-bit.
//
// Forward modes (kMode; one CTA per row group only, the row's exponentials held in float registers):
//   0: one (m, s) reduction; exp is computed twice per element (for s, and for y).
//   1: a max reduction, then e_j = exp(x_j − M) once per element, a sum reduction, y = e_j / S
//      (log_softmax: y = x_j − M − log S, exp once per element for S). Two cheap reductions.
//   4: (softmax) mode 1 keeping x packed across the sum reduction and computing exp again for y.
// (Session 8 also measured a per-thread m_t with one (m, s) reduction, and mode 1 without its register
// cap: both slower, removed; notes/softmax.md.)
// Mode 1 with one or two 16-byte vectors per thread asks ptxas for 4 resident 512-thread blocks (32
// registers): 16384x2048 bf16 2506 -> 2591 GB/s, 4096 2521 -> 2669 against 39 registers (mode 3).
// The backward with the scalar head (kBody) at two vectors per thread takes 64 registers unasked (36
// without the head): 2 resident 512-thread blocks, 64 KB of loads in flight per SM. Asking for 3
// blocks (40 registers) spills 24 B, for 4 (32) 136 B. KF_SM_BODY_MINB: sweeps (0: unasked).
#ifndef KF_SM_BODY_MINB
#define KF_SM_BODY_MINB 0
#endif
constexpr int regs_min_blocks(int vec_bytes, int iters, int mode, bool body) {
  if ((mode == 1 || mode == 4) && vec_bytes == 16 && iters <= 2) return kSmThreads / kMaxTeam;
  return body && iters == 2 ? KF_SM_BODY_MINB : 0;
}
// kBody (backward, one CTA per row group): rows whose pointers share a misalignment (odd n;
// SoftmaxParams::body): the row's first hd elements (up to the next 16-byte boundary) are a scalar
// head held by threads t < hd, the vectors start after it and the last one may be partial.
template <typename T, bool kLog, bool kBwd, int kVec, int kIters, int kMode = 0, bool kBody = false>
__global__ void __launch_bounds__(kMaxTeam, regs_min_blocks(int(sizeof(T)) * kVec, kIters, kMode, kBody))
    softmax_regs(const SoftmaxParams p, const int tpr_shift, const int cluster) {
  static_assert(!kBody || (kBwd && kMode == 0), "the scalar head is the backward's");
  if constexpr (!arch_supports<T>()) {
    __trap();
  } else {
    pdl_wait();  // before the first global access (common/launch.cuh)
    if (p.trigger) pdl_trigger();
    using V = Vec<T, kVec>;
    using Op = std::conditional_t<kBwd, SumOp, MaxSumOp>;
    __shared__ RedSmem<typename Op::V> sm;
    __shared__ RedSmem<float> smf;  // the float reductions of forward mode 1
    int slot = 0, slot_f = 0;
    const int tpr = 1 << tpr_shift;
    const int rpb = int(blockDim.x) >> tpr_shift;
    const int team = int(threadIdx.x) >> tpr_shift;
    const int t = int(threadIdx.x) & (tpr - 1);
    const int n_all = int(p.n);
    const int v0 = cluster_rank(cluster) * tpr * kIters + t;
    const float pad = kBwd ? 0.f : -INFINITY;
    const int64_t step = int64_t(gridDim.x / cluster) * rpb;
    for (int64_t base = int64_t(blockIdx.x / cluster) * rpb; base < p.rows; base += step) {
      const int64_t row = base + team;
      const bool row_ok = row < p.rows;
      const T* in = static_cast<const T*>(p.in) + row * p.in_stride;
      const T* yin = kBwd ? static_cast<const T*>(p.y) + row * p.y_stride : nullptr;
      int n = n_all, hd = 0;
      Vec<T, 1> ha = Vec<T, 1>::zero(), hb = Vec<T, 1>::zero();  // kBody: this thread's head element
      if constexpr (kBody) {
        hd = head_elems(in, n);
        if (row_ok && t < hd) ha = load_vec<T, 1>(in + t), hb = load_vec<T, 1>(yin + t);
        in += hd, yin += hd, n -= hd;
      }
      V a[kIters], b[kBwd ? kIters : 1];
#pragma unroll
      for (int i = 0; i < kIters; ++i) {  // every load first: kIters (x2) accesses in flight
        const int c = (v0 + i * tpr) * kVec;
        const bool ok = row_ok && c < n;
        a[i] = ok ? load_row_vec<T, kVec>(in, c, n, pad) : V::zero();
        if constexpr (kBwd) {
          b[i] = ok ? load_row_vec<T, kVec>(yin, c, n, 0.f) : V::zero();
        } else if (!ok) {
#pragma unroll
          for (int j = 0; j < kVec; ++j) a[i].set(j, -INFINITY);
        }
      }
      if constexpr (!kBwd && kMode != 0) {
        fwd_modes<T, kLog, kVec, kIters, kMode>(a, p, row, row_ok, v0, tpr, team, smf, slot_f);
        continue;
      }
      typename Op::V part;
      if constexpr (kBwd) {
        part = 0.f;
#pragma unroll
        for (int i = 0; i < kIters; ++i) part += bwd_partial<T, kLog, kVec>(a[i], b[i]);
        if constexpr (kBody) part += bwd_partial<T, kLog, 1>(ha, hb);  // 0 for threads without a head
      } else {
        // this thread's (m, s) over all its values: one max, then one sum (no per-vector rescaling)
        float m = -INFINITY;
#pragma unroll
        for (int i = 0; i < kIters; ++i)
#pragma unroll
          for (int j = 0; j < kVec; ++j) m = fmaxf(m, a[i].get(j));
#pragma unroll
        for (int i = 0; i < kIters; ++i) launder(a[i]);  // unpack again below: 4 registers per vector, not 8
        const float base_m = m == -INFINITY ? 0.f : m;
        float s = 0.f;
#pragma unroll
        for (int i = 0; i < kIters; ++i)
#pragma unroll
          for (int j = 0; j < kVec; ++j) s += ex2((a[i].get(j) - base_m) * kLog2e);
        part = {m, s};
      }
      const typename Op::V r = team_reduce<Op>(part, tpr, team, sm, slot, cluster);
      if (row_ok) {
        T* out = static_cast<T*>(p.out) + row * p.out_stride;
        if constexpr (kBody) {
          if (t < hd) {
            float f[1];
            bwd_out<T, kLog, 1>(ha, hb, r, f);
            out[t] = from_float<T>(f[0]);
          }
          out += hd;
        }
        float k = 0.f;
        if constexpr (!kBwd) k = kLog ? logf(r.s) : 1.f / r.s;
#pragma unroll
        for (int i = 0; i < kIters; ++i) {
          const int c = (v0 + i * tpr) * kVec;
          if (c >= n) continue;
          float f[kVec];
          launder(a[i]);  // keep the packed vector live across the reduction, unpack here
          if constexpr (kBwd) {
            launder(b[i]);
            bwd_out<T, kLog, kVec>(a[i], b[i], r, f);
          } else {
            fwd_out<T, kLog, kVec>(a[i], r.m, k, f);
          }
          store_row_vec<T, kVec>(out, c, n, f);
        }
      }
    }
    cluster_exit_sync(cluster);
  }
}

// ---- the forward row kernel (one row per CTA, compile-time team) -----------------------------------
// The common forward: 16-byte vectors, n a multiple of kVec, one CTA of kTpr (128..512) threads per
// row, kIters (1, 2; 4 at 512 threads for 16-32 KB rows) vectors per thread. Same algorithm as mode 1
// of softmax_regs (a max reduction, e = exp(x − M) once per element kept in float registers, a sum
// reduction, y = e · (1/S)), compiled for this case alone: no cluster, no partial vectors (except
// kBody's last), the team size and warp count known to the compiler
// (unrolled butterflies), the max taken over packed pairs (each value unpacked once for its exp, again
// for log_softmax's output). Nsight Compute at 16384x8192 bf16
// counted ~530 issued instructions per warp and row for softmax_regs (mode 4) against ~325 for
// Liger's Triton kernel (65.8 vs 46.0 % SM throughput, 2.61 vs 2.95 TB/s): the generic kernel's
// per-row overhead, not the exps, kept it below the memory rate.
// exp(x − M) = ex2((x − M)·log2 e): x − M first. (A single FFMA, ex2(fma(x, log2 e, −M·log2 e)), has an
// exponent error of ~|M|·2^-24 absolute: at |M| = 1e30 or 6e4 the special-value tests failed.)
// Resident CTAs asked of ptxas: every resident thread (sm_90: 2048, 32 registers) at 1-2 vectors per
// thread, half of them at 4 (64 registers: e = exp(x - M) of 32 elements stays in registers).
template <int kTpr, int kIters>
constexpr int kRowMinBlocks = std::max(1, kSmThreads / kTpr / (kIters > 2 ? 2 : 1));
template <int kW, typename Op>
__device__ __forceinline__ float block_reduce(float v, float (&sm)[kW]) {
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) v = Op::combine(v, Op::shfl_xor(v, off));
  if constexpr (kW > 1) {
    const int lane = int(threadIdx.x) & 31;
    if (lane == 0) sm[threadIdx.x >> 5] = v;
    __syncthreads();
    v = sm[lane & (kW - 1)];  // every warp reduces the kW partials the same way: identical bits
#pragma unroll
    for (int off = kW / 2; off > 0; off >>= 1) v = Op::combine(v, Op::shfl_xor(v, off));
  }
  return v;
}

// Max over the packed values of a thread's vectors: bf16/fp16 pairs with one HMNMX2 per two elements
// (sm_80+; exact, and like fmaxf it returns the other operand when one is NaN), float32 with FMNMX.
template <typename T, int kVec, int kIters>
__device__ __forceinline__ float packed_max(const Vec<T, kVec> (&a)[kIters]) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  if constexpr (!std::is_same<T, float>::value && kVec * sizeof(T) == 16) {
    using H2 = std::conditional_t<std::is_same<T, __nv_bfloat16>::value, __nv_bfloat162, __half2>;
    constexpr int kW = Vec<T, kVec>::kWords;
    H2 h[kIters * kW];
#pragma unroll
    for (int i = 0; i < kIters; ++i)
#pragma unroll
      for (int k = 0; k < kW; ++k) memcpy(&h[i * kW + k], &a[i].w[k], 4);
#pragma unroll
    for (int w = 1; w < kIters * kW; w *= 2)
#pragma unroll
      for (int i = 0; i + w < kIters * kW; i += 2 * w) h[i] = __hmax2(h[i], h[i + w]);
    return fmaxf(to_float(h[0].x), to_float(h[0].y));
  } else  // NOLINT(readability/braces): the float32 / pre-sm_80 path below
#endif
  {
    float t[kIters * kVec];
#pragma unroll
    for (int i = 0; i < kIters; ++i)
#pragma unroll
      for (int j = 0; j < kVec; ++j) t[i * kVec + j] = a[i].get(j);
    return tree_reduce(t, [](float u, float v) { return fmaxf(u, v); });
  }
}

// kBody: rows whose pointers share a misalignment (odd n; SoftmaxParams::body): the row's first hd
// elements (up to the next 16-byte boundary) are a scalar head held by threads t < hd, the vectors
// start after it and the last one may be partial.
template <typename T, bool kLog, int kVec, int kIters, int kTpr, bool kBody = false>
__global__ void __launch_bounds__(kTpr, kRowMinBlocks<kTpr, kIters>) softmax_fwd_row(const SoftmaxParams p) {
  if constexpr (!arch_supports<T>()) {
    __trap();
  } else {
    pdl_wait();
    if (p.trigger) pdl_trigger();
    using V = Vec<T, kVec>;
    constexpr int kW = kTpr / 32;
    constexpr int kN = kIters * kVec;
    __shared__ float red[2][kW];  // max, then sum: one barrier per reduction
    const int t = int(threadIdx.x);
    for (int64_t row = blockIdx.x; row < p.rows; row += gridDim.x) {
      const T* in = static_cast<const T*>(p.in) + row * p.in_stride;
      T* out = static_cast<T*>(p.out) + row * p.out_stride;
      int n = int(p.n), hd = 0;
      float hx = -INFINITY;  // kBody: this thread's head element
      if constexpr (kBody) {
        hd = head_elems(in, n);
        if (t < hd) hx = to_float(in[t]);
        in += hd, out += hd, n -= hd;
      }
      V a[kIters];
#pragma unroll
      for (int i = 0; i < kIters; ++i) {
        const int c = (t + i * kTpr) * kVec;
        if (c < n) {
          a[i] = kBody ? load_row_vec<T, kVec>(in, c, n, -INFINITY) : load_vec<T, kVec>(in + c);
        } else {
#pragma unroll
          for (int j = 0; j < kVec; ++j) a[i].set(j, -INFINITY);
        }
      }
      float tm = packed_max<T, kVec, kIters>(a);
      if constexpr (kBody) tm = fmaxf(tm, hx);
      const float m = block_reduce<kW, MaxOp>(tm, red[0]);
      float e[kN];  // softmax: kept for y; log_softmax: only summed (x stays packed in a)
#pragma unroll
      for (int i = 0; i < kIters; ++i)
#pragma unroll
        for (int j = 0; j < kVec; ++j) {
          const float xj = a[i].get(j);
          e[i * kVec + j] = ex2((xj - m) * kLog2e);
        }
      float part[kIters];  // per vector a pairwise tree, then over the vectors (fewer live registers)
#pragma unroll
      for (int i = 0; i < kIters; ++i) {
        float v[kVec];
#pragma unroll
        for (int j = 0; j < kVec; ++j) v[j] = e[i * kVec + j];
        part[i] = tree_reduce(v, [](float u, float w) { return u + w; });
      }
      float ts = tree_reduce(part, [](float u, float w) { return u + w; });
      const float he = kBody && t < hd ? ex2((hx - m) * kLog2e) : 0.f;
      if constexpr (kBody) ts += he;
      const float s = block_reduce<kW, SumOp>(ts, red[1]);
      const float k = kLog ? logf(s) : 1.f / s;
      if constexpr (kBody) {
        if (t < hd) out[t - hd] = from_float<T>(kLog ? (hx - m) - k : he * k);
      }
#pragma unroll
      for (int i = 0; i < kIters; ++i) {
        const int c = (t + i * kTpr) * kVec;
        if (c >= n) continue;
        float f[kVec];
#pragma unroll
        for (int j = 0; j < kVec; ++j) f[j] = kLog ? (a[i].get(j) - m) - k : e[i * kVec + j] * k;
        if constexpr (kBody) {
          store_row_vec<T, kVec>(out, c, n, f);
        } else {
          store_vec<T, kVec>(out + c, V::from(f));
        }
      }
    }
  }
}

// ---- the streaming kernel ------------------------------------------------------------------------
// One 1024-thread block per row, a persistent grid of kStreamBlocksPerSm blocks per SM looping over
// rows: pass 1 reads the row (kStreamUnroll vectors in flight per thread) and reduces (per chunk: the
// chunk's max, then one exp per element; (m, s) combined once per chunk), pass 2 reads it again and
// writes. With one row per SM in flight the rows being worked on take 132 x 256 KB = 33 MB at
// 131072 bf16 (< the 50 MB L2): pass 2 reads L2, not DRAM; y is stored with the evict-first hint
// (st.global.cs) so that it does not push the rows out.
constexpr int kStreamUnroll = 4;
constexpr int kStreamBlocksPerSm = 1;
// CTAs per row on sm_90 (KF_TUNE sm_stream_cluster): 2 from 256 KB rows, else 1. Forward GB/s, bf16,
// cluster 1 / 2 / 4: 4096x65536 2196 / 1764 / 1238; 4096x131072 1913 / 2077 / 1615; 2048x262144
// 1835 / 1873 / 1914 (larger clusters were slower even sized to the resident count: open).
constexpr int64_t kStreamClusterRowBytes = 256 * 1024;

template <typename T, int kVec>
__device__ __forceinline__ void store_row_vec_cs(T* dst, int c, int n, const float (&f)[kVec]) {
  if constexpr (kVec * sizeof(T) == 16) {
    if (c <= n - kVec) {
      const Vec<T, kVec> v = Vec<T, kVec>::from(f);
      uint4 r;
      memcpy(&r, &v.w, 16);
      asm volatile("st.global.cs.v4.b32 [%0], {%1, %2, %3, %4};" ::"l"(dst + c), "r"(r.x), "r"(r.y), "r"(r.z), "r"(r.w)
                   : "memory");
      return;
    }
  }
  store_row_vec<T, kVec>(dst, c, n, f);
}

// cluster > 1 (sm_90): the row's vectors are split into `cluster` contiguous slices, one per CTA of
// the cluster, and the reduction is finished over the cluster (distributed shared memory): each SM
// then keeps 1/cluster of a row in L2 between the passes.
template <typename T, bool kLog, bool kBwd, int kVec>
__global__ void __launch_bounds__(kStreamTeam) softmax_stream(const SoftmaxParams p, const int cluster) {
  if constexpr (!arch_supports<T>()) {
    __trap();
  } else {
    pdl_wait();
    using V = Vec<T, kVec>;
    using Op = std::conditional_t<kBwd, SumOp, MaxSumOp>;
    __shared__ RedSmem<typename Op::V> sm;
    int slot = 0;
    const int tpr = int(blockDim.x);
    const int64_t cstep = int64_t(tpr) * kVec;
    constexpr int kU = kBwd ? kStreamUnroll / 2 : kStreamUnroll;  // backward: x and y vectors
    const float pad = kBwd ? 0.f : -INFINITY;
    const int rank = cluster_rank(cluster);
    for (int64_t row = blockIdx.x / cluster; row < p.rows; row += gridDim.x / cluster) {
      const T* in = static_cast<const T*>(p.in) + row * p.in_stride;
      const T* yin = kBwd ? static_cast<const T*>(p.y) + row * p.y_stride : nullptr;
      T* out = static_cast<T*>(p.out) + row * p.out_stride;
      // p.body: the row's first hd elements (up to the next 16-byte boundary; every pointer of the
      // call has the same misalignment) are a scalar head, taken by rank 0's first hd threads; the
      // vectors start after it.
      int hd = 0;
      if (kVec > 1 && p.body) {
        hd = head_elems(in, p.n);
      }
      const bool head = rank == 0 && int(threadIdx.x) < hd;
      const T* in_row = in;
      T* out_row = out;
      const T* y_row = yin;
      in += hd, out += hd;
      if constexpr (kBwd) yin += hd;
      const int64_t n = p.n - hd;
      const int nn = int(n);
      // this CTA's columns [cb, ce) of the body: slices of whole vectors, the last one ends at n
      const int64_t slice = ((n + kVec - 1) / kVec + cluster - 1) / cluster * kVec;
      const int64_t cb = rank * slice;
      const int64_t ce = cb + slice < n ? cb + slice : n;
      typename Op::V acc = Op::identity();
      Vec<T, 1> ha, hb;
      if (head) {
        ha = load_row_vec<T, 1>(in_row, int(threadIdx.x), hd, pad);
        if constexpr (kBwd) {
          hb = load_row_vec<T, 1>(y_row, int(threadIdx.x), hd, 0.f);
          acc += bwd_partial<T, kLog, 1>(ha, hb);
        } else {
          acc = MaxSumOp::combine(acc, vec_max_sum<T, 1>(ha));
        }
      }
      for (int64_t c0 = cb + int64_t(threadIdx.x) * kVec; c0 < ce; c0 += cstep * kU) {
        V a[kU], b[kBwd ? kU : 1];
#pragma unroll
        for (int u = 0; u < kU; ++u) {  // every load of the chunk first
          const int64_t c = c0 + u * cstep;
          const bool ok = c < ce;
          a[u] = ok ? load_row_vec<T, kVec>(in, int(c), nn, pad) : V::zero();
          if constexpr (kBwd) {
            b[u] = ok ? load_row_vec<T, kVec>(yin, int(c), nn, 0.f) : V::zero();
          } else if (!ok) {
#pragma unroll
            for (int j = 0; j < kVec; ++j) a[u].set(j, -INFINITY);
          }
        }
        if constexpr (kBwd) {
#pragma unroll
          for (int u = 0; u < kU; ++u) acc += bwd_partial<T, kLog, kVec>(a[u], b[u]);
        } else {
          float cm = -INFINITY;
#pragma unroll
          for (int u = 0; u < kU; ++u)
#pragma unroll
            for (int j = 0; j < kVec; ++j) cm = fmaxf(cm, a[u].get(j));
          const float base = cm == -INFINITY ? 0.f : cm;
          float cs = 0.f;
#pragma unroll
          for (int u = 0; u < kU; ++u)
#pragma unroll
            for (int j = 0; j < kVec; ++j) cs += ex2((a[u].get(j) - base) * kLog2e);
          acc = MaxSumOp::combine(acc, MaxSum{cm, cs});
        }
      }
      const typename Op::V r = team_reduce<Op>(acc, tpr, 0, sm, slot, cluster);
      float k = 0.f;
      if constexpr (!kBwd) k = kLog ? logf(r.s) : 1.f / r.s;
      if (head) {
        float f[1];
        if constexpr (kBwd) {
          bwd_out<T, kLog, 1>(ha, hb, r, f);
        } else {
          fwd_out<T, kLog, 1>(ha, r.m, k, f);
        }
        store_row_vec<T, 1>(out_row, int(threadIdx.x), hd, f);
      }
      for (int64_t c0 = cb + int64_t(threadIdx.x) * kVec; c0 < ce; c0 += cstep * kU) {
        V a[kU], b[kBwd ? kU : 1];
#pragma unroll
        for (int u = 0; u < kU; ++u) {
          const int64_t c = c0 + u * cstep;
          if (c < ce) {
            a[u] = load_row_vec<T, kVec>(in, int(c), nn, pad);
            if constexpr (kBwd) b[u] = load_row_vec<T, kVec>(yin, int(c), nn, 0.f);
          }
        }
#pragma unroll
        for (int u = 0; u < kU; ++u) {
          const int64_t c = c0 + u * cstep;
          if (c >= ce) continue;
          float f[kVec];
          if constexpr (kBwd) {
            bwd_out<T, kLog, kVec>(a[u], b[u], r, f);
          } else {
            fwd_out<T, kLog, kVec>(a[u], r.m, k, f);
          }
          store_row_vec_cs<T, kVec>(out, int(c), nn, f);
        }
      }
    }
    cluster_exit_sync(cluster);
  }
}

// ---- the bulk-copy kernels (sm_90) ----------------------------------------------------------------
// A persistent grid; each CTA owns a slice of n / C columns of the rows it visits (C CTAs of a cluster
// per row; C = 1: the whole row). Thread 0 streams this CTA's slices of its next S rows into shared
// memory with cp.async.bulk (common/bulk_copy.cuh): while one row is reduced and written, the next
// S − 1 are in flight from DRAM, so the load, reduce and write phases of a CTA overlap without
// occupancy. Shared memory per CTA: S · (1 forward, 2 backward) · slice bytes.
// Backward (softmax_bulk_bwd; off by default, KF_TUNE sm_bulk_bwd=1: slower than the register cluster
// so far): g and y slices, one Σ reduction, dx from shared memory.
constexpr int kBulkMaxStages = 4;
constexpr int kBulkMaxTeam = 512;
template <typename T, bool kLog, int kVec>
__global__ void __launch_bounds__(kBulkMaxTeam)
    softmax_bulk_bwd(const SoftmaxParams p, const int cluster, const int stages) {
  if constexpr (!arch_supports<T>() || !kHasBulk) {
    __trap();
  } else {
    pdl_wait();
    using V = Vec<T, kVec>;
    extern __shared__ __align__(128) unsigned char dyn_smem[];
    __shared__ __align__(8) uint64_t bars[kBulkMaxStages];
    __shared__ RedSmem<float> sm;
    int slot = 0;
    const int tpr = int(blockDim.x), t = int(threadIdx.x);
    const RowSlice<T, kVec> sl(p.n, cluster);  // this CTA's columns of every row
    const int slice = sl.len, col0 = sl.col0, svec = sl.nvec;
    T* const stage_base = reinterpret_cast<T*>(dyn_smem);  // [stages][g, y][slice]
    auto issue = [&](int64_t row, int s) {                 // thread 0 only
      mbar_expect(&bars[s], sl.bytes * 2);
      T* dst = stage_base + int64_t(s) * 2 * slice;
      bulk_load_row(dst, static_cast<const T*>(p.in) + row * p.in_stride + col0, sl.bytes, &bars[s]);
      bulk_load_row(dst + slice, static_cast<const T*>(p.y) + row * p.y_stride + col0, sl.bytes, &bars[s]);
    };
    const ClusterRows row_of(p.rows, cluster);
    bulk_pipeline_start(bars, stages, row_of, issue);
    __syncthreads();
    for (int64_t k = 0, row = row_of(0); row >= 0; row = row_of(++k)) {
      const int s = int(k % stages);
      mbar_wait(&bars[s], uint32_t((k / stages) & 1));
      const T* gs = stage_base + int64_t(s) * 2 * slice;
      float acc = 0.f;
      for (int v = t; v < svec; v += tpr)
        acc += bwd_partial<T, kLog, kVec>(*reinterpret_cast<const V*>(gs + v * kVec),
                                          *reinterpret_cast<const V*>(gs + slice + v * kVec));
      const float r = team_reduce<SumOp>(acc, tpr, 0, sm, slot, cluster);  // (a barrier)
      T* out = static_cast<T*>(p.out) + row * p.out_stride + col0;
      for (int v = t; v < svec; v += tpr) {
        float f[kVec];
        bwd_out<T, kLog, kVec>(*reinterpret_cast<const V*>(gs + v * kVec),
                               *reinterpret_cast<const V*>(gs + slice + v * kVec), r, f);
        store_vec<T, kVec>(out + v * kVec, V::from(f));
      }
      __syncthreads();  // every thread is done with stage s: refill it with the row `stages` ahead
      bulk_pipeline_refill(row_of(k + stages), s, issue);
    }
    cluster_exit_sync(cluster);
  }
}

// Forward (softmax_bulk_fwd), the slice held in registers: each thread copies its kIters (<= 8) vectors
// (v = t + i·tpr) of the stage to registers, so the stage is free again as soon as the (m, s)
// reduction's barrier has passed: thread 0 refills it with the row S ahead right there, and the row's
// writes overlap the next loads (refilling after the output pass, as the backward does, measured
// 2358 vs 2682 GB/s at 4096x131072: notes/softmax.md).
// Per thread: max over the packed values, s_t = Σ exp(x − m_t), one (m, s) reduction over the cluster,
// y from registers (exp recomputed).
template <typename T, bool kLog, int kVec, int kIters>
__global__ void __launch_bounds__(kBulkMaxTeam, 1)
    softmax_bulk_fwd(const SoftmaxParams p, const int cluster, const int stages) {
  if constexpr (!arch_supports<T>() || !kHasBulk) {
    __trap();
  } else {
    pdl_wait();
    using V = Vec<T, kVec>;
    extern __shared__ __align__(128) unsigned char dyn_smem[];
    __shared__ __align__(8) uint64_t bars[kBulkMaxStages];
    __shared__ RedSmem<MaxSum> sm;
    int slot = 0;
    const int tpr = int(blockDim.x), t = int(threadIdx.x);
    const RowSlice<T, kVec> sl(p.n, cluster);  // this CTA's columns (the host: svec <= tpr·kIters)
    const int slice = sl.len, col0 = sl.col0, svec = sl.nvec;
    T* const stage_base = reinterpret_cast<T*>(dyn_smem);  // [stages][slice]
    auto issue = [&](int64_t row, int s) {                 // thread 0 only
      mbar_expect(&bars[s], sl.bytes);
      bulk_load_row(stage_base + int64_t(s) * slice, static_cast<const T*>(p.in) + row * p.in_stride + col0, sl.bytes,
                    &bars[s]);
    };
    const ClusterRows row_of(p.rows, cluster);
    bulk_pipeline_start(bars, stages, row_of, issue);
    __syncthreads();
    for (int64_t k = 0, row = row_of(0); row >= 0; row = row_of(++k)) {
      const int s = int(k % stages);
      mbar_wait(&bars[s], uint32_t((k / stages) & 1));
      const T* xs = stage_base + int64_t(s) * slice;
      V a[kIters];
#pragma unroll
      for (int i = 0; i < kIters; ++i) {
        const int v = t + i * tpr;
        if (v < svec) {
          a[i] = *reinterpret_cast<const V*>(xs + v * kVec);
        } else {
#pragma unroll
          for (int j = 0; j < kVec; ++j) a[i].set(j, -INFINITY);
        }
      }
      const float mt = packed_max<T, kVec, kIters>(a);
      const float base = mt == -INFINITY ? 0.f : mt;  // an all -inf part adds exp(-inf) = 0
      float part[kIters];
#pragma unroll
      for (int i = 0; i < kIters; ++i) {
        float e[kVec];
#pragma unroll
        for (int j = 0; j < kVec; ++j) {
          const float xj = a[i].get(j);
          e[j] = ex2((xj - base) * kLog2e);
        }
        part[i] = tree_reduce(e, [](float u, float w) { return u + w; });
      }
      const float st = tree_reduce(part, [](float u, float w) { return u + w; });
      const MaxSum r = team_reduce<MaxSumOp>(MaxSum{mt, st}, tpr, 0, sm, slot, cluster);
      // team_reduce's barrier: every thread of this CTA has read stage s; refill it at once
      bulk_pipeline_refill(row_of(k + stages), s, issue);
      const float m = r.m;
      const float kk = kLog ? logf(r.s) : 1.f / r.s;
      T* out = static_cast<T*>(p.out) + row * p.out_stride + col0;
#pragma unroll
      for (int i = 0; i < kIters; ++i) {
        const int v = t + i * tpr;
        if (v >= svec) continue;
        float f[kVec];
#pragma unroll
        for (int j = 0; j < kVec; ++j) {
          const float xj = a[i].get(j);
          if constexpr (kLog) {
            f[j] = (xj - m) - kk;
          } else {
            f[j] = ex2((xj - m) * kLog2e) * kk;
          }
        }
        store_vec<T, kVec>(out + v * kVec, V::from(f));
      }
    }
    cluster_exit_sync(cluster);
  }
}

// ---- launch plan ----------------------------------------------------------------------------------
inline int pow2_ceil(int64_t v) {
  int p = 1;
  while (p < v) p <<= 1;
  return p;
}
inline int log2_of(int pow2) {
  int s = 0;
  while ((1 << s) < pow2) ++s;
  return s;
}

// 16-byte vectors when every base pointer and (with more than one row) every row stride allows.
template <typename T>
bool can_vectorize(const SoftmaxParams& p) {
  uintptr_t bits =
      reinterpret_cast<uintptr_t>(p.in) | reinterpret_cast<uintptr_t>(p.y) | reinterpret_cast<uintptr_t>(p.out);
  if (p.rows > 1) bits |= static_cast<uintptr_t>(p.in_stride | p.y_stride | p.out_stride) * sizeof(T);
  return bits % 16 == 0;
}

// Every row of every pointer starts at the same offset from a 16-byte boundary: the pointers differ
// by multiples of 16 bytes, and so do their row strides (in bytes).
template <typename T>
bool can_align_body(const SoftmaxParams& p) {
  const int64_t e = int64_t(sizeof(T));
  return reinterpret_cast<uintptr_t>(p.in) % sizeof(T) == 0 &&
         shares_misalignment(p.in, p.out, (p.in_stride - p.out_stride) * e) &&
         (p.y == nullptr || shares_misalignment(p.in, p.y, (p.in_stride - p.y_stride) * e));
}

struct Plan {
  int tpr = 0;      // threads per row per CTA (0: the streaming kernel)
  int iters = 1;    // vectors per thread
  int cluster = 1;  // CTAs per row
};

// The launch plan (notes/softmax.md has the table):
//   1. one CTA per row group: tpr = the power of two giving ~row_vecs vectors per thread (<= 512),
//      iters = the power of two covering the row; problems under one wave of blocks (decode) take
//      one vector per thread where 512 threads cover the row (the latency is one load + reduction).
//   2. sm_90, row over max_iters·512 vectors: a cluster of C = ceil(row bytes / 32 KB) CTAs (<= 8)
//      of 512 threads, iters = the power of two covering the row over C CTAs, C then trimmed.
//   3. otherwise the streaming kernel.
template <typename T, bool kBwd, int kVec>
Plan make_plan(const SoftmaxParams& p) {
  constexpr SoftmaxTuning tun = kBwd ? kBwdTuning : kFwdTuning;
  const int max_iters = std::min(tun.max_iters, std::max(1, tune("sm_max_iters", tun.max_iters)));
  const int team_cap = std::min(kMaxTeam, std::max(1, pow2_ceil(tune("sm_team", kMaxTeam))));
  const int64_t nvec = ceil_div(p.n, kVec);
  Plan pl;
  if (tune("sm_stream", 0) != 0) return pl;
  const int want = std::max(1, tune(kBwd ? "sm_bwd_vecs" : "sm_fwd_vecs", tun.row_vecs));
  const int tpr = int(std::min<int64_t>(team_cap, pow2_ceil(ceil_div(nvec, want))));
  const int iters = pow2_ceil(ceil_div(nvec, tpr));
  if (iters <= max_iters) {
    pl.tpr = tpr;
    pl.iters = iters;
    const int block = std::max(tpr, kMinBlock);
    const int64_t units = ceil_div(p.rows, block / tpr);
    if (iters > 1 && nvec <= team_cap && units < p.sm_count && tune("sm_small", 1) != 0) {
      pl.tpr = pow2_ceil(nvec);  // decode: one vector per thread
      pl.iters = 1;
    }
    return pl;
  }
  // Forward rows longer than one CTA holds: the streaming kernel (over a cluster on sm_90) measured
  // ahead of the register-cluster kernel (4096x131072 bf16: 1966 vs 1810 GB/s with one CTA per row);
  // the backward keeps the register cluster (its streaming version was slower: 1870 vs 2280 fwd+bwd).
  if (!kBwd && tune("sm_long_regs", 0) == 0) return pl;
  if (p.capability < 90 || tune("sm_clusters", 1) == 0) return pl;
  const int64_t row_bytes = p.n * int64_t(sizeof(T));
  const int slice = std::max(1024, tune("sm_slice", kClusterSliceBytes));
  const int c0 = int(std::min<int64_t>(kMaxCluster, std::max<int64_t>(2, ceil_div(row_bytes, slice))));
  const int it = pow2_ceil(ceil_div(nvec, int64_t(c0) * team_cap));
  if (it > max_iters) return pl;
  pl.tpr = team_cap;
  pl.iters = it;
  pl.cluster = int(ceil_div(nvec, int64_t(team_cap) * it));
  return pl;
}

// Clusters (cluster = 1: CTAs) of `kernel` resident at once for (cluster size, block, dynamic shared
// memory), cached (the runtime queries cost microseconds, which a decode-sized call cannot afford):
// 0 when the shape cannot run. A kernel using dynamic shared memory gets its limit raised to
// kBulkMaxSmem on the first query (static + dynamic over 48 KB needs the attribute): one value for
// every shape, as the attribute belongs to the kernel, not to a launch (raising it per shape to that
// shape's size broke a later launch of a larger cached shape: "invalid argument").
constexpr int64_t kBulkMaxSmem = 200 * 1024;
inline int cached_active_clusters(const void* kernel, int cluster, int block, cudaLaunchConfig_t cfg, int sm_count) {
  struct Key {
    const void* k;
    int c, b;
    size_t smem;
    int v;
  };
  static std::mutex mu;
  static std::vector<Key> cache;
  std::lock_guard<std::mutex> lock(mu);
  const size_t smem = cfg.dynamicSmemBytes;
  for (const Key& e : cache)
    if (e.k == kernel && e.c == cluster && e.b == block && e.smem == smem) return e.v;
  int v = 0;
  cudaError_t err = cudaSuccess;
  if (smem > 0) err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(kBulkMaxSmem));
  if (err == cudaSuccess) {
    if (cluster > 1) {
      err = cudaOccupancyMaxActiveClusters(&v, kernel, &cfg);
    } else {
      err = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&v, kernel, block, smem);
      v *= sm_count;
    }
  }
  if (err != cudaSuccess) {
    cudaGetLastError();
    v = 0;
  }
  cache.push_back({kernel, cluster, block, smem, v});
  return v;
}

// The bulk-copy kernel's plan (sm_90, 16-byte vectors): C = ceil(row bytes / 64 KB) CTAs per row
// (trimmed to C <= 8, raised until C | n with 16-byte slices), S = 64 KB / (slice · buffers) stages
// (2..4), tpr = pow2(vectors per slice / 2) in [128, 512]; a persistent grid of the resident clusters.
// Slices of 64 KB (one CTA of 2 x 64 KB stages per SM) measured ahead of 32 KB (three CTAs per SM, twice
// the CTAs per row), forward GB/s bf16: 4096x131072 2376 vs 2270, 4096x65536 2505 vs 2505, 2048x262144
// 2292 vs 2294 (the streaming kernel: 2043 / 2181 / 1843). KF_TUNE: sm_bulk_slice, sm_bulk_smem,
// sm_bulk_vpt.
constexpr int kBulkSliceBytes = 64 * 1024;
constexpr int kBulkStageBudget = 64 * 1024;
// Forward rows longer than the one-CTA row kernel takes (4 vectors x 512 threads = 32 KB) take the
// bulk kernel when there is a wave of rows: softmax_regs holds them at 8 vectors per thread (128
// registers, 1 CTA per SM, no overlap of load, reduce and write). Session 13, prof_softmax bf16
// forward GB/s, softmax_regs -> bulk: 8192x24576 1644 -> 2794, 8192x32000 1775 -> 2831 (Liger 2817
// in kforge bench); 16-32 KB rows: softmax_regs 2214 / 2381, bulk 2842 / 2833, softmax_fwd_row at
// 512 x 4 2925 / 3006 (16384x12288 / 16384x16384; 1024 x 2 2893 / 3005). The backward keeps
// softmax_regs there (the bulk backward and the register cluster measured no faster at 12288-32000).
constexpr int64_t kBulkMinRowFwd = 32 * 1024 + 1;

// One persistent launch of a bulk-copy kernel: as many clusters as are resident at once (at most one
// per row); false when the shape cannot run (no resident cluster).
inline bool launch_bulk(void (*kernel)(SoftmaxParams, int, int), const SoftmaxParams& p, int cluster, int tpr,
                        int stages, int64_t smem, bool pdl, cudaStream_t stream, Status* st) {
  Launch probe(dim3(unsigned(cluster)), dim3(unsigned(tpr)), size_t(smem), stream, false, cluster);
  const int active = cached_active_clusters(reinterpret_cast<const void*>(kernel), cluster, tpr, probe.cfg, p.sm_count);
  if (active < 1) return false;
  const int64_t units = std::min<int64_t>(p.rows, active);
  Launch l(dim3(unsigned(units * cluster)), dim3(unsigned(tpr)), size_t(smem), stream, pdl, cluster);
  *st = launched(l(kernel, p, cluster, stages), "softmax (bulk)");
  return true;
}

template <typename T, bool kLog, bool kBwd, int kVec>
bool try_bulk(const SoftmaxParams& p, bool pdl, cudaStream_t stream, Status* st) {
  if constexpr (kVec * sizeof(T) != 16) {
    return false;
  } else {
    if (p.capability < 90) return false;
    constexpr int kBuf = kBwd ? 2 : 1;
    const int64_t row_bytes = p.n * int64_t(sizeof(T));
    const int64_t slice_cap = std::max(1024, tune("sm_bulk_slice", kBulkSliceBytes));
    int cluster = int(std::min<int64_t>(kMaxCluster, ceil_div(row_bytes, slice_cap)));
    while (cluster <= kMaxCluster && (p.n % cluster != 0 || ((p.n / cluster) * int64_t(sizeof(T))) % 16 != 0))
      ++cluster;
    if (cluster > kMaxCluster) return false;
    const int64_t slice_bytes = row_bytes / cluster;
    const int64_t budget = tune("sm_bulk_smem", kBulkStageBudget);
    const int stages = int(std::min<int64_t>(kBulkMaxStages, std::max<int64_t>(2, budget / (slice_bytes * kBuf))));
    const int64_t smem = int64_t(stages) * kBuf * slice_bytes;
    if (smem > kBulkMaxSmem) return false;
    const int64_t svec = (p.n / cluster) / kVec;
    const int tpr =
        std::min(kBulkMaxTeam, std::max(128, pow2_ceil(ceil_div(svec, std::max(1, tune("sm_bulk_vpt", 2))))));
    if constexpr (kBwd) {
      return launch_bulk(softmax_bulk_bwd<T, kLog, kVec>, p, cluster, tpr, stages, smem, pdl, stream, st);
    } else {
      switch (pow2_ceil(ceil_div(svec, tpr))) {  // vectors per thread: at most 8 (64 KB slices, 512 threads)
        case 1:
          return launch_bulk(softmax_bulk_fwd<T, kLog, kVec, 1>, p, cluster, tpr, stages, smem, pdl, stream, st);
        case 2:
          return launch_bulk(softmax_bulk_fwd<T, kLog, kVec, 2>, p, cluster, tpr, stages, smem, pdl, stream, st);
        case 4:
          return launch_bulk(softmax_bulk_fwd<T, kLog, kVec, 4>, p, cluster, tpr, stages, smem, pdl, stream, st);
        case 8:
          return launch_bulk(softmax_bulk_fwd<T, kLog, kVec, 8>, p, cluster, tpr, stages, smem, pdl, stream, st);
        default:
          return false;  // larger slices (KF_TUNE sm_bulk_slice): the plan's other kernels
      }
    }
  }
}

template <typename T, bool kLog, bool kBwd, int kVec>
Status launch_stream(const SoftmaxParams& p, bool pdl, cudaStream_t stream) {
  auto kernel = softmax_stream<T, kLog, kBwd, kVec>;
  const int64_t bps = std::max(1, tune("sm_stream_bps", kStreamBlocksPerSm));
  const int64_t blocks = std::max<int64_t>(1, p.sm_count) * bps;  // resident at once
  const int def = p.n * int64_t(sizeof(T)) >= kStreamClusterRowBytes ? 2 : 1;
  int cluster = p.capability >= 90 ? std::min(kMaxCluster, std::max(1, tune("sm_stream_cluster", def))) : 1;
  // no more CTAs per row than 16-byte vectors per CTA slice can use (short rows: one CTA)
  while (cluster > 1 && p.n < int64_t(cluster) * kStreamTeam * kVec) cluster >>= 1;
  if (cluster > 1) {
    // persistent: as many clusters as are resident at once (fewer than blocks / cluster where a
    // GPC's SM count is not a multiple of the cluster size; a second wave doubled the time)
    Launch probe(dim3(unsigned(blocks)), dim3(kStreamTeam), 0, stream, false, cluster);
    const int active =
        cached_active_clusters(reinterpret_cast<const void*>(kernel), cluster, kStreamTeam, probe.cfg, p.sm_count);
    const int64_t units = std::min<int64_t>({p.rows, blocks / cluster, int64_t(active) * bps});
    if (units >= 1) {
      Launch l(dim3(unsigned(units * cluster)), dim3(kStreamTeam), 0, stream, pdl, cluster);
      return launched(l(kernel, p, cluster), "softmax (streaming, cluster)");
    }
  }
  const int64_t grid = std::min<int64_t>(p.rows, blocks);
  Launch l(dim3(unsigned(grid)), dim3(kStreamTeam), 0, stream, pdl);
  return launched(l(kernel, p, 1), "softmax (streaming)");
}

// The forward mode (softmax_regs) for a one-CTA-per-row-group launch whose exponentials fit in 16
// float registers per thread; the cluster kernel and the backward take mode 0.
template <typename T, bool kLog, bool kBwd, int kVec, int kIters>
auto pick_regs_kernel(const Plan& pl) {
  if constexpr (!kBwd && kIters * kVec <= 16) {
    // default: mode 1, except softmax with 512-thread teams: mode 4 (16384x8192 bf16, one run: mode 0
    // 2584, mode 1 2542, mode 4 2619 GB/s; at 2048 / 4096 mode 1 2605 / 2694, mode 4 2548 / 2645)
    const int def = (!kLog && pl.tpr >= kMaxTeam) ? 4 : 1;
    const int mode = pl.cluster > 1 ? 0 : tune("sm_fwd_mode", def);
    if (mode == 1) return softmax_regs<T, kLog, kBwd, kVec, kIters, 1>;
    if (mode == 4) return softmax_regs < T, kLog, kBwd, kVec, kIters, kLog ? 1 : 4 > ;
  }
  return softmax_regs<T, kLog, kBwd, kVec, kIters, 0>;
}

// softmax_fwd_row for a forward one-CTA plan with 16-byte vectors, n % kVec == 0, 128..512 threads
// per row and 1..2 vectors per thread, or 512 threads x 4 (KF_TUNE sm_row=0: softmax_regs instead).
template <typename T, bool kLog, int kVec, int kIters, int kTpr, bool kBody = false>
Status launch_fwd_row(const SoftmaxParams& p, bool pdl, cudaStream_t stream) {
  const int64_t grid = std::min<int64_t>(p.rows, INT_MAX);
  SoftmaxParams q = p;  // the whole grid resident at once: let the next kernel in
  q.trigger = pdl && grid <= p.sm_count;
  Launch l(dim3(unsigned(grid)), dim3(kTpr), 0, stream, pdl);
  return launched(l(softmax_fwd_row<T, kLog, kVec, kIters, kTpr, kBody>, q), "softmax (row)");
}
template <typename T, bool kLog, int kVec, int kIters>
bool try_fwd_row(const SoftmaxParams& p, const Plan& pl, bool pdl, cudaStream_t stream, Status* st) {
  if constexpr (kVec * sizeof(T) != 16 || kIters > 4) {
    return false;
  } else {
    if (pl.cluster != 1 || p.n % kVec != 0 || tune("sm_row", 1) == 0) return false;
    if constexpr (kIters == 4) {  // 16-32 KB rows: 512 threads x 4 vectors (KF_TUNE sm_row4=0: off)
      if (pl.tpr != kMaxTeam || tune("sm_row4", 1) == 0) return false;
      *st = launch_fwd_row<T, kLog, kVec, 4, kMaxTeam>(p, pdl, stream);
      return true;
    } else {
      switch (pl.tpr) {
        case 128:
          *st = launch_fwd_row<T, kLog, kVec, kIters, 128>(p, pdl, stream);
          return true;
        case 256:
          *st = launch_fwd_row<T, kLog, kVec, kIters, 256>(p, pdl, stream);
          return true;
        case 512:
          *st = launch_fwd_row<T, kLog, kVec, kIters, 512>(p, pdl, stream);
          return true;
        default:
          return false;
      }
    }
  }
}

template <typename T, bool kLog, bool kBwd, int kVec, int kIters>
Status launch_regs(const SoftmaxParams& p, const Plan& pl, bool pdl, cudaStream_t stream) {
  if constexpr (!kBwd) {
    Status st;
    if (try_fwd_row<T, kLog, kVec, kIters>(p, pl, pdl, stream, &st)) return st;
  }
  auto kernel = pick_regs_kernel<T, kLog, kBwd, kVec, kIters>(pl);
  if constexpr (kBwd && kVec > 1) {
    if (p.body) kernel = softmax_regs<T, kLog, kBwd, kVec, kIters, 0, true>;  // dispatch_vec: one CTA per row
  }
  const int block = pl.cluster > 1 ? pl.tpr : std::max(pl.tpr, kMinBlock);
  const int rpb = block / pl.tpr;
  const int64_t units = std::min<int64_t>(ceil_div(p.rows, rpb), INT_MAX / pl.cluster);
  const dim3 grid(unsigned(units * pl.cluster));
  if (pl.cluster > 1) {
    Launch probe(grid, dim3(block), 0, stream, false, pl.cluster);
    if (cached_active_clusters(reinterpret_cast<const void*>(kernel), pl.cluster, block, probe.cfg, p.sm_count) < 1)
      return launch_stream<T, kLog, kBwd, kVec>(p, pdl, stream);  // no room for this cluster shape
    Launch l(grid, dim3(block), 0, stream, pdl, pl.cluster);
    return launched(l(kernel, p, log2_of(pl.tpr), pl.cluster), "softmax (cluster)");
  }
  SoftmaxParams q = p;  // at most one block per SM: the whole grid is resident, let the next kernel in
  q.trigger = pdl && units <= p.sm_count;
  Launch l(grid, dim3(block), 0, stream, pdl);
  return launched(l(kernel, q, log2_of(pl.tpr), 1), "softmax");
}

template <typename T, bool kLog, bool kBwd, int kVec>
Status with_vec(const SoftmaxParams& p, cudaStream_t stream) {
  DeviceInfo dev;
  dev.capability = p.capability;
  const bool pdl = use_pdl(dev);
  const Plan pl = make_plan<T, kBwd, kVec>(p);
  // The bulk-copy kernel (sm_90) for the rows no one-CTA register kernel holds (forward; backward with
  // KF_TUNE sm_bulk_bwd=1 until measured), and forward rows over 32 KB (kBulkMinRowFwd; KF_TUNE
  // sm_bulk_min_row bytes); not for grids under one wave of rows (decode: nothing to overlap), nor rows
  // with a scalar head (p.body: the bulk kernels copy whole 16-byte-aligned rows).
  const int64_t row_bytes = p.n * int64_t(sizeof(T));
  const bool long_row = pl.tpr == 0 || pl.cluster > 1;
  const bool bulk = !p.body && tune("sm_bulk", 1) != 0 && p.rows >= tune("sm_bulk_min_rows", p.sm_count) &&
                    ((long_row && (!kBwd || tune("sm_bulk_bwd", 0) != 0)) ||
                     row_bytes >= tune("sm_bulk_min_row", kBwd ? INT_MAX : int(kBulkMinRowFwd)));
  if (bulk) {
    Status st;
    if (try_bulk<T, kLog, kBwd, kVec>(p, pdl, stream, &st)) return st;
  }
  switch (pl.tpr == 0 ? 0 : pl.iters) {
    case 1:
      return launch_regs<T, kLog, kBwd, kVec, 1>(p, pl, pdl, stream);
    case 2:
      return launch_regs<T, kLog, kBwd, kVec, 2>(p, pl, pdl, stream);
    case 4:
      return launch_regs<T, kLog, kBwd, kVec, 4>(p, pl, pdl, stream);
    case 8:
      return launch_regs<T, kLog, kBwd, kVec, 8>(p, pl, pdl, stream);
    default:
      return launch_stream<T, kLog, kBwd, kVec>(p, pdl, stream);
  }
}

template <typename T, bool kLog, bool kBwd>
Status dispatch_vec(const SoftmaxParams& p, cudaStream_t stream) {
  constexpr int kVec = 16 / int(sizeof(T));
  if (can_vectorize<T>(p)) return with_vec<T, kLog, kBwd, kVec>(p, stream);
  // Rows whose pointers share their misalignment (odd n, contiguous): a scalar head per row up to
  // the next 16-byte boundary, 16-byte vectors after it (SoftmaxParams::body), instead of one
  // element per access (session 13: 8192x32001 bf16 forward 747 GB/s on the one-element path).
  if (can_align_body<T>(p) && tune("sm_body", 1) != 0) {
    SoftmaxParams q = p;
    q.body = true;
    DeviceInfo dev;
    dev.capability = p.capability;
    const bool pdl = use_pdl(dev);
    // Forward rows of 129 to 4 x 512 vectors: the row kernel with the head, at the team size of the
    // aligned rows' plan (session 13, bf16 forward GB/s: 16384x8191 935 streaming -> 2854, Liger 2481).
    const int64_t nvec = ceil_div(p.n, kVec);
    if constexpr (!kBwd) {
      if (nvec > 128 && nvec <= 4 * kMaxTeam && tune("sm_body_row", 1) != 0) {
        const int tpr = int(std::min<int64_t>(kMaxTeam, pow2_ceil(ceil_div(nvec, 2))));
        switch (tpr * int(pow2_ceil(ceil_div(nvec, tpr)))) {  // threads x vectors per thread
          case 256:
            return launch_fwd_row<T, kLog, kVec, 2, 128, true>(q, pdl, stream);
          case 512:
            return launch_fwd_row<T, kLog, kVec, 2, 256, true>(q, pdl, stream);
          case 1024:
            return launch_fwd_row<T, kLog, kVec, 2, kMaxTeam, true>(q, pdl, stream);
          default:
            return launch_fwd_row<T, kLog, kVec, 4, kMaxTeam, true>(q, pdl, stream);
        }
      }
    }
    // Backward rows one CTA holds: the register kernel with the head (16384 x 4095 bf16 fwd+bwd on
    // the one-element path: 2230 GB/s, Liger 2577), where every team has at least hd threads.
    if constexpr (kBwd) {
      const Plan pl = make_plan<T, kBwd, kVec>(q);
      if (p.n <= int64_t(kMaxTeam) * 8 && pl.tpr >= kVec && pl.cluster == 1 && tune("sm_body_regs", 1) != 0)
        return with_vec<T, kLog, kBwd, kVec>(q, stream);
    }
    // Longer rows, and the backward past the one-element register kernel (8 elements per thread).
    if (p.n > tune("sm_body_stream_min", kMaxTeam * 8)) return launch_stream<T, kLog, kBwd, kVec>(q, pdl, stream);
  }
  return with_vec<T, kLog, kBwd, 1>(p, stream);
}

template <typename T>
Status dispatch(bool log, bool bwd, const SoftmaxParams& p, cudaStream_t stream) {
  if (p.rows == 0 || p.n == 0) return Status::Ok();
  if (log) return bwd ? dispatch_vec<T, true, true>(p, stream) : dispatch_vec<T, true, false>(p, stream);
  return bwd ? dispatch_vec<T, false, true>(p, stream) : dispatch_vec<T, false, false>(p, stream);
}

}  // namespace softmax_detail

// One definition per dtype, instantiated in softmax_<dtype>.cu.
#define KF_SOFTMAX_DEFINE(T)                                                                       \
  template <>                                                                                      \
  Status launch_softmax<T>(bool log, bool backward, const SoftmaxParams& p, cudaStream_t stream) { \
    return softmax_detail::dispatch<T>(log, backward, p, stream);                                  \
  }

}  // namespace kernelforge
