// Backward, row in registers (plan kinds kBwdRegs, kBwdRegsBulk, and pass 2 of kBwdSplit):
//   dx = rstd·(dn - mean(dn) - xh·mean(dn·xh)), column sums A = Σ u·xh, D = Σ u (kernels/common.cuh).
// Minimum traffic: read x, dy (and dsum), write dx: 3·M·N·sizeof(T) bytes (4·M·N with dsum), plus
// one float32 partial row per block.
// Why it exists: the default backward of every row that 512 threads x 2 vectors (x, dy and four
// accumulators per element in registers) can hold: one block owns fixed columns of many rows, so its
// column sums stay in registers and the statistics cost one block reduction per row.
//   kBulkStaged (sm_90, 16-byte rows whose two stages fit 96 KB, two waves of rows): x, dy (dsum) of
//     the next rows stream into shared memory through cp.async.bulk while the current row is processed.
//   kColumnTile (the split backward's pass 2, rows too long for one block): block (b, c) takes the
//     columns of tile c of the rows of work unit b, with the row statistics read from wk.row_stats.
//   kScalarHead (odd N or rows off a 16-byte boundary sharing their misalignment): a scalar head per row.
#pragma once

#include "norm/kernels/common.cuh"

namespace kernelforge {
namespace norm_detail {

// kBulkStaged (sm_90, 16-byte aligned rows that fit a stage): x, dy (and dsum) of the next rows stream
// into shared memory through cp.async.bulk while the current row is processed; else plain loads.
// kColumnTile (the split backward's pass 2, long rows): block (b, c) takes the columns of tile c (tpr·kIters
// vectors) of the rows of work unit b, with the row statistics read from wk.row_stats (no reduction).
// kScalarHead (odd N, or rows off a 16-byte boundary, with x, dy, dx, dsum sharing their misalignment; plain
// loads): every row of a block starts the same hd = head_elems(x row) elements before a 16-byte
// boundary (the launcher makes blocks per group a multiple of the rows' alignment period), so thread t
// owns the columns hd + (i·tpr + t)·kVec + j of every row, plus head column t < hd: its column sums
// stay in registers as for aligned rows. The head is one element per thread t < hd; the body's last
// vector may be partial (padded with the LayerNorm shift K for x and 0 for dy: both add 0 to every
// sum); weight, bias and scale are read at any element offset (load_vec_any).
template <typename T, NormOp kOp, int kVec, int kIters, bool kBulkStaged, bool kColumnTile = false,
          bool kScalarHead = false>
__global__ void __launch_bounds__(kBwdMaxTeam) norm_bwd_regs(const NormParams p, const BwdWork wk, const int stages) {
  if constexpr (!arch_supports<T>() || (kBulkStaged && !kHasBulk) || (kBulkStaged && kColumnTile) ||
                (kScalarHead && (kBulkStaged || kColumnTile))) {
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
    const int64_t tile0 = kColumnTile ? int64_t(blockIdx.y) * tpr * kIters * kVec : 0;
    auto col_of = [&](int i) { return tile0 + (int64_t(i) * tpr + t) * kVec; };

    // kScalarHead: the block's head length hd (that of its first row; every row of the block shares it) and
    // its body of nb = n - hd columns; the vectors' columns (col_of) count from hd.
    int hd = 0;
    if constexpr (kScalarHead) {
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
      if constexpr (kScalarHead) {
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
    // kScalarHead head column t < hd: its weight/bias and column sums
    const bool head = kScalarHead && t < hd;
    float hw = 1.f, hb = 0.f, hacc_a = 0.f, hacc_d = 0.f;
    if constexpr (kScalarHead) {
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

    // Bulk pipeline state (kBulkStaged only).
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
    if constexpr (kBulkStaged) {
      bulk_pipeline_start(
          bars, stages, [&](int64_t s) { return seq.row_of(s); }, issue);
      __syncthreads();
    }

    for (int64_t k = 0;; ++k) {
      const int64_t row = seq.row_of(k);
      if (row < 0) break;
      float4 rst = {};
      if constexpr (kColumnTile) rst = wk.row_stats[row];  // issued first: independent of the x loads
      // x, dy (and dsum) are loaded into registers once per row, from global memory (plain) or
      // from the stage (bulk), which is then released at once. kReread (staged AdaLN): they stay in
      // the stage and are re-read per pass instead (fewer registers; the stage is released only at the
      // end of the row).
      constexpr bool kReread = kBulkStaged && Tr::kAda;
      constexpr int kR = kReread ? 1 : kIters;
      V xv[kR], dyv[kR], dsv[kR], scv[kIters];
      // scale row: the group (a block's rows share one when bpg > 1), or the row itself (rpg = 1)
      const int64_t ga = Tr::kAda ? (wk.grouped ? seq.group_of(k) : row) : 0;
      const T* xs = nullptr;
      if constexpr (kBulkStaged) {
        const int s = int(k % stages);
        mbar_wait(&bars[s], uint32_t((k / stages) & 1));
        xs = stage_base + int64_t(s) * nbuf * n;
      }
      // LayerNorm's shift K = x[row, 0] (see the statistics below), read before the stage is refilled.
      float shift_k = 0.f;
      if constexpr (Tr::kLayer && !kColumnTile) {
        if constexpr (kBulkStaged)
          shift_k = to_float(xs[0]);
        else
          shift_k = to_float(static_cast<const T*>(p.x)[row * p.x_stride]);
      }
      // kScalarHead: this row's tensors from column hd on, and the head element of thread t < hd
      const T* __restrict__ xr = static_cast<const T*>(p.x) + row * p.x_stride + hd;
      const T* __restrict__ dyr = static_cast<const T*>(p.dy) + row * p.dy_stride + hd;
      const T* __restrict__ dsr = static_cast<const T*>(p.dsum) + row * p.dsum_stride + hd;
      const T* __restrict__ scr = static_cast<const T*>(p.scale) + ga * p.scale_stride + hd;
      float hx = 0.f, hdy = 0.f, hds = 0.f, hsc = 0.f;
      if constexpr (kScalarHead) {
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
        if constexpr (kScalarHead) {
          xv[i] = dyv[i] = dsv[i] = zero;
          if (col < nb) {
            xv[i] = load_row_vec<T, kVec>(xr, int(col), int(nb), shift_k);
            dyv[i] = load_row_vec<T, kVec>(dyr, int(col), int(nb), 0.f);
            if (p.dsum) dsv[i] = load_row_vec<T, kVec>(dsr, int(col), int(nb), 0.f);
            if constexpr (Tr::kAda) scv[i] = load_vec_any<T, kVec>(scr, int(col), int(nb));
          }
        } else if constexpr (kBulkStaged && !kReread) {
          xv[i] = dyv[i] = dsv[i] = zero;
          if (col < n) {
            xv[i] = *reinterpret_cast<const V*>(xs + col);
            dyv[i] = *reinterpret_cast<const V*>(xs + n + col);
            if (p.dsum) dsv[i] = *reinterpret_cast<const V*>(xs + 2 * n + col);
          }
        } else if constexpr (!kBulkStaged) {
          xv[i] = dyv[i] = dsv[i] = zero;
          if (col < n) {
            xv[i] = load_vec<T, kVec>(static_cast<const T*>(p.x) + row * p.x_stride + col);
            dyv[i] = load_vec<T, kVec>(static_cast<const T*>(p.dy) + row * p.dy_stride + col);
            if (p.dsum) dsv[i] = load_vec<T, kVec>(static_cast<const T*>(p.dsum) + row * p.dsum_stride + col);
          }
        }
        if constexpr (Tr::kAda && !kScalarHead) {
          if (col < n) scv[i] = load_vec<T, kVec>(static_cast<const T*>(p.scale) + ga * p.scale_stride + col);
        }
      }
      if constexpr (kBulkStaged && !kReread) {
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
      if constexpr (!kColumnTile) {
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
        if constexpr (kScalarHead) {  // the head element (0 for threads without one)
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
      if constexpr (kScalarHead) {
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
        if constexpr (kScalarHead) {
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
        if constexpr (kScalarHead) {
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
      if constexpr (kScalarHead) {
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

}  // namespace norm_detail
}  // namespace kernelforge
