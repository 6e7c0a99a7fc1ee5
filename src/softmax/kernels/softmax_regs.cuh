// softmax_regs: softmax / log_softmax forward and backward, a team of tpr threads per row.
//   forward:  one (m, s) reduction (kOnline), or a max then a sum reduction (the two-reduction modes),
//             y = exp(x - m) / s or (x - m) - log s;   backward: one Σ (g·y, or g) reduction, dx from it.
// Minimum traffic: forward 2·M·N·sizeof(T) bytes (read x, write y), backward 3·M·N·sizeof(T); the row
// stays in registers (kIters vectors of kVec elements per thread) between the reduction and the write,
// so it is read from DRAM once.
// Why it exists: the general register kernel. Its plans (softmax_plan.cpp) take short rows (teams of
// 1..64 threads packed into blocks of >= 128), every backward row one CTA holds (at 16-byte vectors,
// or with a scalar head for odd n), rows whose pointers allow only one element per access, and on
// sm_90 backward rows longer than one CTA holds (a cluster of up to 8 CTAs, each a slice in registers).
//
// Rows base + team for base = (blockIdx.x / cluster)·rpb, stepping by the grid (the grid is capped
// at 2^31 − 1 blocks). cluster > 1 (sm_90): one team per CTA, CTA rank r holds vectors
// [r·tpr·kIters, (r + 1)·tpr·kIters) of the row, and the per-CTA results are combined through
// distributed shared memory (every CTA combines the ranks in the same order: identical bits
// everywhere). Column offsets are 32-bit (n < 2^31, and the padded columns of the last CTA stay
// below kMaxCluster·kMaxTeam·8·kVec), row offsets 64-bit.
//
// Forward modes (kMode; one CTA per row group only, the row's exponentials held in float registers):
//   kOnline:           one (m, s) reduction; exp is computed twice per element (for s, and for y).
//   kMaxThenSum:       a max reduction, then e_j = exp(x_j − M) once per element, a sum reduction,
//                      y = e_j / S (log_softmax: y = x_j − M − log S, exp once per element for S).
//   kMaxThenSumRepeat: (softmax) kMaxThenSum keeping x packed across the sum reduction and computing
//                      exp again for y.
// The two-reduction modes with one or two 16-byte vectors per thread ask ptxas for 4 resident
// 512-thread blocks (32 registers): 16384x2048 bf16 2506 -> 2591 GB/s, 4096 2521 -> 2669 against the
// 39 registers ptxas picks unasked.
// The backward with the scalar head (kScalarHead) at two vectors per thread takes 64 registers
// unasked (36 without the head): 2 resident 512-thread blocks, 64 KB of loads in flight per SM.
// Asking for 3 blocks (40 registers) spills 24 B, for 4 (32) 136 B, so it stays unasked.
#pragma once

#include "softmax/kernels/common.cuh"

namespace kernelforge {
namespace softmax_detail {

// ---- the forward's two-reduction modes -----------------------------------------------------------
// Special values: M = fmaxf over the row skips NaN; a NaN, a +inf (inf − inf) or an all −inf row
// (−inf − (−inf)) gives a NaN exponential and so a NaN S and row, as kOnline.
template <typename T, bool kLog, int kVec, int kIters, SoftmaxRegsMode kMode>
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
      if constexpr (!kLog && kMode != SoftmaxRegsMode::kMaxThenSumRepeat) e[i][j] = ej;
      t[i * kVec + j] = ej;
    }
  s = tree_reduce(t, [](float u, float v) { return u + v; });
  if constexpr (kLog || kMode == SoftmaxRegsMode::kMaxThenSumRepeat) {
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
      } else if constexpr (kMode == SoftmaxRegsMode::kMaxThenSumRepeat) {
        f[j] = ex2((a[i].get(j) - big_m) * kLog2e) * k;
      } else {
        f[j] = e[i][j] * k;
      }
    }
    store_row_vec<T, kVec>(out, c, n, f);
  }
}

// ---- the kernel ----------------------------------------------------------------------------------
constexpr int regs_min_blocks(int vec_bytes, int iters, SoftmaxRegsMode mode) {
  if ((mode == SoftmaxRegsMode::kMaxThenSum || mode == SoftmaxRegsMode::kMaxThenSumRepeat) && vec_bytes == 16 &&
      iters <= 2)
    return kSmThreads / kMaxTeam;
  return 0;
}
// kScalarHead (backward, one CTA per row group): rows whose pointers share a misalignment (odd n):
// the row's first hd elements (up to the next 16-byte boundary) are a scalar head held by threads
// t < hd, the vectors start after it and the last one may be partial.
template <typename T, bool kLog, bool kBwd, int kVec, int kIters, SoftmaxRegsMode kMode = SoftmaxRegsMode::kOnline,
          bool kScalarHead = false>
__global__ void __launch_bounds__(kMaxTeam, regs_min_blocks(int(sizeof(T)) * kVec, kIters, kMode))
    softmax_regs(const SoftmaxParams p, const int tpr_shift, const int cluster) {
  static_assert(!kScalarHead || (kBwd && kMode == SoftmaxRegsMode::kOnline), "the scalar head is the backward's");
  if constexpr (!arch_supports<T>()) {
    __trap();
  } else {
    pdl_wait();  // before the first global access (common/launch.cuh)
    if (p.trigger) pdl_trigger();
    using V = Vec<T, kVec>;
    using Op = std::conditional_t<kBwd, SumOp, MaxSumOp>;
    __shared__ RedSmem<typename Op::V> sm;
    __shared__ RedSmem<float> smf;  // the float reductions of the forward's two-reduction modes
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
      Vec<T, 1> ha = Vec<T, 1>::zero(), hb = Vec<T, 1>::zero();  // kScalarHead: this thread's head element
      if constexpr (kScalarHead) {
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
      if constexpr (!kBwd && kMode != SoftmaxRegsMode::kOnline) {
        fwd_modes<T, kLog, kVec, kIters, kMode>(a, p, row, row_ok, v0, tpr, team, smf, slot_f);
        continue;
      }
      typename Op::V part;
      if constexpr (kBwd) {
        part = 0.f;
#pragma unroll
        for (int i = 0; i < kIters; ++i) part += bwd_partial<T, kLog, kVec>(a[i], b[i]);
        if constexpr (kScalarHead) part += bwd_partial<T, kLog, 1>(ha, hb);  // 0 for threads without a head
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
        if constexpr (kScalarHead) {
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

}  // namespace softmax_detail
}  // namespace kernelforge
