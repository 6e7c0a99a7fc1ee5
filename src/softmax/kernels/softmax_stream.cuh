// softmax_stream: softmax / log_softmax forward and backward, one 1024-thread CTA (or a cluster of
// CTAs on sm_90) per row, reading the row twice.
//   pass 1: forward (m, s) per chunk (the chunk's max, then one exp per element, combined once per
//           chunk), backward Σ g·y (or Σ g); one reduction; pass 2: read again, write y (dx).
// Minimum traffic: forward 2·M·N·sizeof(T) bytes, backward 3·M·N·sizeof(T); the second read is mostly
// an L2 hit: with one row per SM in flight the rows being worked on take 132 x 256 KB = 33 MB at
// 131072 bf16 (< the 50 MB L2), and y is stored with the evict-first hint (st.global.cs) so that it
// does not push the rows out.
// Why it exists: rows no register plan holds, where the bulk kernels cannot run: any row on
// sm_75/sm_80 longer than 512 x 8 vectors, forward long rows with fewer rows than SMs (decode-sized
// grids of vocabulary rows), rows over 4096 elements with a scalar head (odd n), one-element rows too
// long for softmax_regs. A persistent grid of one CTA (cluster) per SM loops over the rows; each
// thread keeps kStreamUnroll vectors in flight. 4096x131072 bf16 forward: 2077 GB/s at 2 CTAs per
// row, against the bulk kernel's 2682.
// cluster > 1 (sm_90): the row's vectors are split into `cluster` contiguous slices, one per CTA of
// the cluster, and the reduction is finished over the cluster (distributed shared memory): each SM
// then keeps 1/cluster of a row in L2 between the passes.
#pragma once

#include "softmax/kernels/common.cuh"

namespace kernelforge {
namespace softmax_detail {

constexpr int kStreamUnroll = 4;

// y (dx) with the evict-first hint: the stores do not push the rows of pass 2 out of L2.
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
      // p.scalar_head: the row's first hd elements (up to the next 16-byte boundary; every pointer of
      // the call has the same misalignment) are a scalar head, taken by rank 0's first hd threads; the
      // vectors start after it.
      int hd = 0;
      if (kVec > 1 && p.scalar_head) {
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

}  // namespace softmax_detail
}  // namespace kernelforge
