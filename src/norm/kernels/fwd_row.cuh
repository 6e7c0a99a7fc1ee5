// Forward, one row group per block (plan kind kFwdRow): y[r, :] = norm(x[r, :]) (formulas in
// include/kernelforge/norm.h), statistics in float32 from one reduction of shifted sums.
// Minimum traffic: read x (and residual), write y (and sum): 2·M·N·sizeof(T) bytes (add_rms_norm
// 4·M·N); at ~3.0 TB/s, M=16384 N=4096 bf16 -> 268 MB -> ~90 us floor.
// Why it exists: the default forward of every row of up to 8 16-byte vectors per thread at 256
// threads (16384 bf16 elements), aligned or with a scalar head. A block of rows_per_block teams
// handles rows blockIdx.x·rpb + team and exits (the grid loops only past 2^31-1 blocks); the hardware
// overlaps resident blocks. Bandwidth follows Little's law: bytes in flight per SM = resident threads
// × x bytes per thread, so registers are spent on x alone. Before the reductions only x (and
// residual) are loaded; weight, bias and AdaLN scale/shift are read after them, from L1/L2 (every
// block of an SM reads the same weight row; an L2 prefetch is issued early for a per-row scale/shift
// row). Rows are addressed by one 64-bit base per tensor and 32-bit column offsets (N < 2^31).
#pragma once

#include <algorithm>

#include "norm/kernels/common.cuh"

namespace kernelforge {
namespace norm_detail {

// Register budget per thread of norm_fwd_row by op and x bytes per thread (16-byte slots 1, 2, 4,
// 8+): x takes 4 registers per slot and the rest ~24-40; capping the count raises resident threads,
// and so bytes in flight per SM.
// kSmThreads (common/launch.cuh): resident threads per SM of the architecture being compiled.
// Blocks of 512 threads (kFwdRowBigBlock): 3 resident per SM (40 registers), 4 for
// AdaLN without weight and bias (32 registers, no spill; 16384x8192 184.5 vs 187.1 us at 3). At 4,
// RMSNorm and LayerNorm spill 16 / 48 B and slow down (196.8 vs 181.5 us, 239.1 vs 182.3 us).
template <int kBlock, int kRegs, bool kPlainAda>
constexpr int kFwdRowMinBlocks = kBlock > kFwdRowMaxBlock
                                     ? std::max(1, std::min(kSmThreads / kBlock, kPlainAda ? 4 : 3))
                                     : std::min(65536 / (kBlock * kRegs), kSmThreads / kBlock);
// Registers per thread by op (rows) and 16-byte x slots per thread 1 / 2 / 4 (columns); 8+ slots: 128.
// add_rms_norm at 4 slots holds x and residual in flight (32 registers): ptxas spills 16 B at 64; at
// 72 (3 blocks of 256 threads per SM instead of 4) it does not: 16384x8192 362 vs 372 us.
// LayerNorm at 2 slots fits 40 without a spill: 6 blocks of 256 per SM instead of 5 (16384x4096
// 94.2 vs 94.5 us). LayerNorm-kind AdaLN at 2 slots fits 40 without a spill because its scale/shift
// vectors are loaded per output vector (loaded all before the first store they take 47-48 registers
// and spill 16 B with weight/bias): 6 blocks instead of 5, 16384x4096 96.2 vs 97.5 us.
constexpr int kFwdRowRegTable[5][3] = {
    {32, 40, 64},  // rms
    {40, 48, 72},  // add_rms
    {40, 40, 64},  // layer
    {40, 48, 64},  // ada, rms kind
    {40, 40, 64},  // ada, layer kind
};
// x registers per thread in 16-byte slots (4 registers each). A one-element vector of a 2-byte type
// still takes a whole 32-bit register: 16 bf16 elements are 4 slots, not 2. Counting bytes gave the
// scalar path (odd N, unaligned views) too small a budget and it spills: 16384x4095 bf16 forward
// LayerNorm 589 vs 200 us, RMSNorm 415 vs 158, add_rms_norm 572 vs 247, AdaLN 392 vs 301 (spilled vs not).
constexpr int fwd_row_slots(int elem_bytes, int vec, int iters) { return iters * std::max(vec * elem_bytes, 4) / 16; }
template <NormOp kOp, int kSlots>
constexpr int kFwdRowRegs = kSlots <= 0   ? 128
                            : kSlots <= 1 ? kFwdRowRegTable[int(kOp)][0]
                            : kSlots <= 2 ? kFwdRowRegTable[int(kOp)][1]
                            : kSlots <= 4 ? kFwdRowRegTable[int(kOp)][2]
                                          : 128;

// Blocks per SM the row kernel is compiled for (__launch_bounds__). kScalarHead kernels get the register
// budget of twice their x slots, at least 64 (512-thread blocks: two per SM): at the aligned rows'
// budget ptxas spilled 20-140 B (the parameter loads take one of four widths).
template <typename T, NormOp kOp, int kVec, int kIters, bool kEarlyParams, bool kPlainAda, int kBlock, bool kScalarHead>
constexpr int kFwdRowBounds =
    kEarlyParams   ? 1
    : !kScalarHead ? kFwdRowMinBlocks<kBlock, kFwdRowRegs<kOp, fwd_row_slots(int(sizeof(T)), kVec, kIters)>, kPlainAda>
    : kBlock > kFwdRowMaxBlock
        ? 2
        : kFwdRowMinBlocks<kBlock, kFwdRowRegs<kOp, std::max(4, 2 * fwd_row_slots(int(sizeof(T)), kVec, kIters))>,
                           kPlainAda>;

// kEarlyParams (a grid of at most one block per SM, e.g. decode rows): occupancy does not matter, latency
// does, so weight, bias and AdaLN scale/shift are loaded together with x, before the reductions
// (one memory round trip per block instead of two), and there is no register cap.
// kPlainAda (AdaLN without weight and bias, the DiT / LTX-Video case): the output loop is compiled for
// that case alone instead of branching per vector over the four weight/bias variants.
// kBlock: the largest block the instantiation takes: kFwdRowMaxBlock, or kFwdRowBigBlock (512 threads
// x 2 vectors for 8 KB rows of rms / LayerNorm / AdaLN without weight and bias).
// kScalarHead (odd N, or views whose rows start off a 16-byte boundary, with x, y, residual and sum sharing
// their misalignment): each row's first hd = head_elems(x row) < kVec elements are a scalar head held
// by threads t < hd, 16-byte vectors of x / y start after it and the last one may be partial.
// Weight, bias and scale/shift are then read at columns hd + 8k, off their own 16-byte boundaries:
// load_vec_any (8-, 4- or 2-byte accesses, L1 hits). Padding elements of the partial vector hold the
// LayerNorm shift K, so they add exactly 0 to both shifted sums.
template <typename T, NormOp kOp, int kVec, int kIters, bool kEarlyParams, bool kPlainAda = false,
          int kBlock = kFwdRowMaxBlock, bool kScalarHead = false>
__global__ void __launch_bounds__(kBlock,
                                  kFwdRowBounds<T, kOp, kVec, kIters, kEarlyParams, kPlainAda, kBlock, kScalarHead>)
    norm_fwd_row(const NormParams p, const int tpr_shift) {
  static_assert(!(kScalarHead && kEarlyParams), "the scalar-head forward loads its parameters after the reduction");
  if constexpr (!arch_supports<T>()) {
    __trap();
  } else {
    pdl_wait();
    if constexpr (kEarlyParams) {
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
      // kScalarHead: the head (hd elements, thread t < hd holds element t) and the row from hd on
      int n = int(p.n), hd = 0;
      float hx = 0.f, hr = 0.f;
      if constexpr (kScalarHead) {
        hd = head_elems(xr, n);
        if (row_ok && t < hd) {
          hx = to_float(xr[t]);
          if constexpr (Tr::kRes) hr = to_float(rr[t]);
        }
      }
      const T* __restrict__ wg = p.weight ? static_cast<const T*>(p.weight) + hd : nullptr;
      const T* __restrict__ bg = p.bias ? static_cast<const T*>(p.bias) + hd : nullptr;
      // Scale/shift rows before the reductions only where they are used there (kEarlyParams, or one row
      // per x row: an L2 prefetch, no division); else they are computed after (below), so that no
      // division delays the loads of x.
      const int64_t ge = !Tr::kAda ? 0 : kEarlyParams ? ada_group(r, p) : r;
      const T* __restrict__ scr = static_cast<const T*>(p.scale) + ge * p.scale_stride + hd;
      const T* __restrict__ shr = static_cast<const T*>(p.shift) + ge * p.shift_stride + hd;
      V xv[kIters], rv[kR];
      constexpr int kE = kEarlyParams ? kIters : 1;
      V we[kE], be[kE], sce[kE], she[kE];  // kEarlyParams: parameters loaded with x
      const float shift_k = Tr::kLayer && row_ok ? to_float(xr[0]) : 0.f;
      xr += hd, rr += hd, n -= hd;
#pragma unroll
      for (int i = 0; i < kIters; ++i) {
        const int col = (t + i * tpr) * kVec;
        if (row_ok && col < n) {
          if constexpr (kScalarHead) {
            xv[i] = load_row_vec<T, kVec>(xr, col, n, shift_k);
            if constexpr (Tr::kRes) rv[i] = load_row_vec<T, kVec>(rr, col, n, 0.f);
          } else {
            xv[i] = load_vec<T, kVec>(xr + col);
            if constexpr (Tr::kRes) rv[i] = load_vec<T, kVec>(rr + col);
          }
          if constexpr (kEarlyParams) {
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
      if constexpr (Tr::kAda && !kEarlyParams) {
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
        if constexpr (kScalarHead) {
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
            if constexpr (kScalarHead)
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
      if constexpr (kScalarHead) {  // the head element (0 for threads without one)
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
      if constexpr (Tr::kAda && !kEarlyParams) asm volatile("" : "+l"(rl));
      const int64_t gl = Tr::kAda ? ada_group(rl, p) : 0;
      const T* __restrict__ scl = static_cast<const T*>(p.scale) + gl * p.scale_stride + hd;
      const T* __restrict__ shl = static_cast<const T*>(p.shift) + gl * p.shift_stride + hd;
      if constexpr (kScalarHead) {
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
      // Weight, bias and AdaLN scale/shift are loaded per output vector (the same weight for every row:
      // L1 hits; all of a row's scale/shift before its first store would take more registers, fewer
      // blocks per SM).
      // kScalarHead: parameters at any element offset, and the row's last vector may be partial
      auto load_param = [&](const T* src, int col) {
        if constexpr (kScalarHead)
          return load_vec_any<T, kVec>(src, col, n);
        else
          return load_vec<T, kVec>(src + col);
      };
      auto store_y = [&](int col, const V& v) {
        if constexpr (kScalarHead)
          store_row_vec<T, kVec>(yr, col, n, v);
        else
          store_vec<T, kVec>(yr + col, v);
      };
#pragma unroll
      for (int i = 0; i < kIters; ++i) {
        const int col = (t + i * tpr) * kVec;
        if (!(row_ok && col < n)) continue;
        V wv, bv, scv, shv;
        if constexpr (kEarlyParams) {
          wv = we[i];
          bv = be[i];
          scv = sce[i];
          shv = she[i];
        } else {
          if constexpr (!kPlainAda) {
            if (wg) wv = load_param(wg, col);
            if constexpr (!Tr::kHfRms) {
              if (bg) bv = load_param(bg, col);
            }
          }
          if constexpr (Tr::kAda) {
            scv = load_param(scl, col);
            shv = load_param(shl, col);
          }
        }
        launder(xv[i]);  // convert x again here rather than keep its float32 copy live (registers)
        if constexpr (kPlainAda) {
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

}  // namespace norm_detail
}  // namespace kernelforge
