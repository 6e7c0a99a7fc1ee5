// Backward, chunks of rows staged in shared memory (plan kind kBwdChunk, sm_90): the formulas of
// norm_bwd_regs (kernels/common.cuh). Minimum traffic: read x, dy (and dsum), write dx: 3·M·N·sizeof(T)
// bytes; DRAM traffic stays that minimum.
// Why it exists: rows of up to 1024 16-byte vectors over many rows (at least two waves), no per-row
// AdaLN scale. norm_bwd_regs spends two block barriers per row; this kernel spends one per chunk.
#pragma once

#include "norm/kernels/common.cuh"

namespace kernelforge {
namespace norm_detail {

// norm_bwd_regs spends two block barriers per row (stage release, statistics); with 4 warps per block
// and 128 registers per thread it is latency-bound . This kernel works on a
// chunk of up to kChunkRows consecutive rows of one group at a time:
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

template <typename T, NormOp kOp, int kVec, int kIters, int kChunkRows>
__global__ void __launch_bounds__(512) norm_bwd_chunk(const NormParams p, const BwdWork wk, const int stages) {
  using Tr = OpTraits<kOp>;
  if constexpr (!arch_supports<T>() || !kHasBulk) {
    __trap();
  } else {
    pdl_wait();
    using V = Vec<T, kVec>;
    constexpr int E = kIters * kVec;
    constexpr int kS = Tr::kLayer ? 4 : 2;  // {S2, G2[, S1, G1]} per row, as in norm_bwd_regs
    constexpr int K = kChunkRows * kS;      // statistics per chunk (wk.chunk <= kChunkRows rows): at most 32
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
      float v[K], shift[kChunkRows];
#pragma unroll
      for (int q = 0; q < K; ++q) v[q] = 0.f;
#pragma unroll
      for (int r = 0; r < kChunkRows; ++r) {
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
      for (int r = 0; r < kChunkRows; ++r) {
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

}  // namespace norm_detail
}  // namespace kernelforge
