// softmax_bulk_bwd (sm_90): softmax / log_softmax backward of 16-byte aligned rows through a
// cp.async.bulk pipeline of g and y slices.
//   r = Σ g·y (softmax) or Σ g (log_softmax), one reduction over the cluster; dx from shared memory.
// Minimum traffic 3·M·N·sizeof(T) bytes.
// Why it exists: the backward's counterpart of softmax_bulk_fwd, a candidate plan for long backward
// rows; no default plan selects it (forward + backward at 4096x131072: 2438 GB/s against the register
// cluster's 2485; at 50304-element rows its backward took 445 µs against 486).
// A persistent grid; each CTA owns a slice of n / C columns of the rows it visits (C CTAs of a cluster
// per row; C = 1: the whole row). Thread 0 streams this CTA's slices of its next S rows into shared
// memory with cp.async.bulk (common/bulk_copy.cuh): while one row is reduced and written, the next
// S − 1 are in flight from DRAM, so the load, reduce and write phases of a CTA overlap without
// occupancy. Shared memory per CTA: S · (1 forward, 2 backward) · slice bytes.
#pragma once

#include "common/bulk_copy.cuh"
#include "softmax/kernels/common.cuh"

namespace kernelforge {
namespace softmax_detail {

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

}  // namespace softmax_detail
}  // namespace kernelforge
