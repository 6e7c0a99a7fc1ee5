// Device helpers shared by the softmax-family kernels: the MUFU exp, the (m, s) / max / sum
// reductions over a team, a block and a cluster, and the per-vector formulas of each op.
//   (m, s): a row's max and the sum of exp(x - m), combined by the online-softmax rule
//     (m1, s1) + (m2, s2) = (m, s1·exp(m1 - m) + s2·exp(m2 - m)),  m = max(m1, m2);
//   softmax:      y = exp(x - m) · (1/s)          log_softmax:  y = (x - m) - log(s)
//   softmax bwd:  dx = y · (g - Σ g·y)            log bwd:      dx = g - exp(y) · Σ g
// Math: float32; exp(v) = ex2.approx(v·log2 e) (relative error ~2^-22 for the arguments that matter),
// 1/s and log(s) once per row, precise; each output is rounded once to T. Special values as
// torch.softmax: fmaxf skips NaN, but a NaN, a +inf (exp(inf - inf)) or an all -inf row
// (exp(-inf - (-inf))) makes s, and so every output of the row, NaN.
#pragma once

#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <type_traits>

#include "common/cluster.cuh"
#include "common/launch.cuh"
#include "common/vec.cuh"
#include "softmax/softmax_plan.h"
#include "softmax/softmax_problem.h"

namespace kernelforge {
namespace softmax_detail {

constexpr int kMaxTeam = kSoftmaxMaxTeam;           // softmax_regs: __launch_bounds__(512) = 128 registers/thread
constexpr int kStreamTeam = kSoftmaxStreamThreads;  // threads per row of the streaming kernel
constexpr int kBulkMaxStages = kSoftmaxBulkMaxStages;
constexpr int kBulkMaxTeam = kSoftmaxBulkMaxThreads;
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

// f over v[0..N) as a pairwise tree (v is overwritten).
template <int N, typename F>
__device__ __forceinline__ float tree_reduce(float (&v)[N], F f) {
#pragma unroll
  for (int w = 1; w < N; w *= 2)
#pragma unroll
    for (int i = 0; i + w < N; i += 2 * w) v[i] = f(v[i], v[i + w]);
  return v[0];
}

// Reduces v over a CTA of kW warps (kW a compile-time power of two): a warp butterfly, the kW partials
// through shared memory, a butterfly over them in every warp. Every thread receives identical bits.
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

}  // namespace softmax_detail
}  // namespace kernelforge
