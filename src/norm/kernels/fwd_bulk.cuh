// Forward, Hopper bulk-copy pipeline (plan kind kFwdBulk, sm_90): y[r, :] = norm(x[r, :]).
// Minimum traffic: read x (and residual), write y (and sum): 2·M·N·sizeof(T) bytes (add_rms_norm
// 4·M·N); 4096x65536 bf16 is 1.07 GB, ~360 us at 3.0 TB/s.
// Why it exists: rows of 32 KB and more over at least two waves of rows. Each CTA owns one slice of a
// row (the whole row, or 1/C of it inside a cluster of C CTAs); thread 0 streams the slices of the
// next S-1 rows into shared memory with cp.async.bulk (the copy engine, completion on an mbarrier),
// so DRAM reads stay in flight while the current row is reduced from shared memory and written out.
// Registers hold nothing row-sized: many threads per SM, and no row length limit but shared memory.
#pragma once

#include "norm/kernels/common.cuh"

namespace kernelforge {
namespace norm_detail {

// Vectors per thread whose parameters are loaded together in the output pass (registers: 4 per
// parameter vector; AdaLN may have four parameter tensors).
template <NormOp kOp>
constexpr int kBulkOutChunk = OpTraits<kOp>::kAda ? 2 : 4;

// kParamVecs > 0 (RMSNorm, LayerNorm; plan flag params_in_regs): thread t's weight/bias vectors (v = t + c·tpr, c <
// kParamVecs; svec <= kParamVecs·tpr) are loaded once and held in registers for every row (no per-row L2 reads of the
// parameters). kOutChunk: the output pass's parameter vectors per chunk (1, plan flag params_per_vector: loaded per
// vector, fewest registers).
template <typename T, NormOp kOp, int kVec, int kParamVecs = 0, int kOutChunk = kBulkOutChunk<kOp>>
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
    constexpr int kR = kParamVecs > 0 ? kParamVecs : 1;
    V wr[kR], br[kR];
    if constexpr (kParamVecs > 0) {
      static_assert(!Tr::kAda, "norm_fwd_bulk: AdaLN's scale/shift change per row group");
#pragma unroll
      for (int c = 0; c < kParamVecs; ++c) {
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
      // Output in chunks of kOutChunk vectors per thread: the chunk's parameter vectors (weight, bias,
      // AdaLN scale/shift: L2 hits, ~0.5 us each under load) are all loaded before its first store,
      // one round trip per chunk instead of one per vector (the compiler does not move loads across
      // the stores to y). With 8 vectors per thread the per-vector loads cost layer_norm 2048x131072
      // 1963 GB/s against 2755 without weight and bias .
      if constexpr (kParamVecs > 0) {
#pragma unroll
        for (int c = 0; c < kParamVecs; ++c) {  // packed words only: no float copies live across rows
          launder(wr[c]);
          launder(br[c]);
        }
#pragma unroll
        for (int c = 0; c < kParamVecs; ++c) {
          const int64_t v = t + int64_t(c) * tpr;
          if (v >= svec) break;
          const V a = *reinterpret_cast<const V*>(xs + v * kVec);
          store_vec<T, kVec>(static_cast<T*>(p.y) + row * p.y_stride + col0 + v * kVec,
                             fwd_out<T, kOp, kVec>(a, mean, rstd, p, wr[c], br[c], wr[c], br[c]));
        }
      }
      for (int64_t v0 = t; kParamVecs == 0 && v0 < svec; v0 += int64_t(kOutChunk) * tpr) {
        V wv[kOutChunk], bv[kOutChunk], scv[kOutChunk], shv[kOutChunk];
#pragma unroll
        for (int c = 0; c < kOutChunk; ++c) {
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
        for (int c = 0; c < kOutChunk; ++c) {
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

}  // namespace norm_detail
}  // namespace kernelforge
