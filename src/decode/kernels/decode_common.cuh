// Decode attention: the device pieces shared by the cp.async kernel (decode_attention.cuh) and the
// TMA kernel (decode_attention_tma.cuh), which differ only in how K/V tiles reach shared memory.
//   key_range      the keys a CTA reads: the visible range of its rows, then its split's part
//   KvCopies, ring_prologue, ring_step   the cp.async kernels' K/V copies and their ring
//   load_q_tile    the Q tile, rows x D elements with (D + kDecodePad)-element shared rows
//   init_rows      each thread's rows: visible key bounds, running max / sum / output
//   warp_tile      one warp's 16 keys of a stage: S = Q K^T, mask, online softmax, O += P V; K and V
//                  fragments come through the kernel's ldmatrix address functions (its smem layout)
//   finish_cta     the warps' merge, the output or the split partials, and the last CTA's split merge
// Formula and layouts: include/kernelforge/decode.h; the kernel files open with the byte counts.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "attention/kernels/mma_common.cuh"
#include "common/launch.cuh"
#include "decode/decode_config.h"
#include "decode/decode_problem.h"
#include "decode/kernels/decode_merge.cuh"

namespace kernelforge {
namespace decode {

using attn_mma::cp_async16;
using attn_mma::cp_async_commit;
using attn_mma::cp_async_wait;
using attn_mma::kLn2;
using attn_mma::kLog2e;
using attn_mma::ldmatrix_x4;
using attn_mma::ldmatrix_x4_trans;
using attn_mma::mma_16816;
using attn_mma::smem_addr;

// The key range [lo, hi) that rows [r_first, r_last] of sequence b may see (the union of their
// visible ranges), then this split's part of it: [start, end), a multiple of kBlockN keys long.
// kAligned: the tiles start at multiples of kBlockN (start rounded down from lo), so a paged tile
// holds whole pages or lies in one page (TMA boxes); keys in [start, lo) are masked (lo).
struct KeyRange {
  int32_t start, end;
  int32_t lo;  // the first key any row of the CTA sees
  int32_t n;   // the clamped seq_len
};

template <int kBlockN, bool kAligned = false>
__device__ __forceinline__ KeyRange key_range(const DecodeParams& p, int b, int r_first, int r_last, int split,
                                              int splits) {
  int32_t n = p.seq_lens[b];
  n = n < 0 ? 0 : (n > p.capacity ? p.capacity : n);
  const int32_t t_min = r_first / p.group, t_max = r_last / p.group;
  int32_t hi = n - p.q_len + t_max + 1;
  hi = hi < 0 ? 0 : (hi > n ? n : hi);
  int32_t lo = 0;
  if (p.window_left >= 0) {
    lo = n - p.q_len + t_min - p.window_left;
    lo = lo < 0 ? 0 : (lo > hi ? hi : lo);
  }
  if (p.key_starts != nullptr) {  // left padding: keys before the sequence's first are invisible
    const int32_t s0 = p.key_starts[b];
    lo = s0 > lo ? (s0 > hi ? hi : s0) : lo;
  }
  const int32_t base = kAligned ? lo - lo % kBlockN : lo;
  const int32_t tiles = (hi - base + kBlockN - 1) / kBlockN;
  const int32_t per_split = (tiles + splits - 1) / splits;
  int32_t start = base + split * per_split * kBlockN;
  int32_t end = start + per_split * kBlockN;
  start = start > hi ? hi : start;
  end = end > hi ? hi : end;
  return {start, end, lo, n};
}

// A thread's share of the cp.async K/V copies of a stage: rows r0, r0 + kRowStep, ... (kLoadRows of
// them) of the stage's keys, one 16-byte chunk of each (kbase / vbase: the thread's kv head and
// chunk). fetch() reads the rows' pages from the block table (-1: no row, a key at or past `end`, an
// inactive thread, or a page outside [0, P): zeros); load() copies them into sk / sv (the thread's
// chunk of stage row r at r * kStride). The kernels read a stage's pages one stage ahead of its copy,
// so the table read's latency overlaps a stage of compute.
template <int kLoadRows, int kRowStep>
struct KvCopies {
  const uint16_t* kbase;
  const uint16_t* vbase;
  const int32_t* bt;  // the sequence's block-table row; nullptr: contiguous (page b)
  int32_t page_mask;  // page_size - 1
  int b, r0;
  bool active;

  // kv head hkv, 16-byte chunk cc of its rows, sequence b, first row r0 of a stage
  __device__ __forceinline__ KvCopies(const DecodeParams& p, int hkv, int cc, int b_, int r0_, bool active_)
      : kbase(static_cast<const uint16_t*>(p.k_cache) + hkv * p.k_sh + cc * 8),
        vbase(static_cast<const uint16_t*>(p.v_cache) + hkv * p.v_sh + cc * 8),
        bt(p.block_table != nullptr ? p.block_table + b_ * p.bt_sb : nullptr),
        page_mask(p.page_size - 1),
        b(b_),
        r0(r0_),
        active(active_) {}

  __device__ __forceinline__ void fetch(const DecodeParams& p, int32_t tile_start, int32_t end,
                                        int32_t (&pg)[kLoadRows]) const {
#pragma unroll
    for (int i = 0; i < kLoadRows; ++i) {
      const int32_t j = tile_start + r0 + i * kRowStep;
      int32_t page = -1;
      if (j < end && active) {
        page = bt != nullptr ? __ldg(bt + (j >> p.page_shift)) : b;
        page = page >= 0 && page < p.pages ? page : -1;
      }
      pg[i] = page;
    }
  }
  template <int kStride>
  __device__ __forceinline__ void load(const DecodeParams& p, int32_t tile_start, uint16_t* sk, uint16_t* sv,
                                       const int32_t (&pg)[kLoadRows]) const {
#pragma unroll
    for (int i = 0; i < kLoadRows; ++i) {
      const int r = r0 + i * kRowStep;
      const int32_t j = tile_start + r;
      const bool ok = pg[i] >= 0;
      const int32_t row = bt != nullptr ? (j & page_mask) : j;
      const int64_t koff = ok ? pg[i] * p.k_sp + row * p.k_st : 0;
      const int64_t voff = ok ? pg[i] * p.v_sp + row * p.v_st : 0;
      cp_async16(smem_addr(sk + r * kStride), kbase + koff, ok);
      cp_async16(smem_addr(sv + r * kStride), vbase + voff, ok);
    }
  }
};

// The cp.async ring over n_tiles stages of kBlockN keys from `start`: the prologue issues the first
// kStages - 1 stages (every table read of them in flight at once) and the table read of the next;
// ring_step(it) issues stage it + kStages - 1 and the table read after it, then waits for stage it
// and syncs the CTA. load(tile_start, stage, pages) copies a stage; fetch(tile_start, pages) reads
// its pages.
template <int kStages, int kBlockN, int kLoadRows, class Fetch, class Load>
__device__ __forceinline__ void ring_prologue(int32_t start, int n_tiles, Fetch fetch, Load load,
                                              int32_t (&pages)[kLoadRows]) {
  int32_t first[kStages - 1][kLoadRows];
#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) fetch(start + s * kBlockN, first[s]);
#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) {
    if (s < n_tiles) load(start + s * kBlockN, s, first[s]);
    cp_async_commit();
  }
  fetch(start + (kStages - 1) * kBlockN, pages);
}
template <int kStages, int kBlockN, int kLoadRows, class Fetch, class Load>
__device__ __forceinline__ void ring_step(int it, int32_t start, int n_tiles, Fetch fetch, Load load,
                                          int32_t (&pages)[kLoadRows]) {
  const int nt = it + kStages - 1;
  if (nt < n_tiles) {
    load(start + nt * kBlockN, nt % kStages, pages);
    fetch(start + (nt + 1) * kBlockN, pages);
  }
  cp_async_commit();
  cp_async_wait<kStages - 1>();
  __syncthreads();
}

// The Q tile (element loads: q may have any alignment; kRows x D elements, read once) by threads
// 0 .. kThreads - 1; rows past rows_here are zeros.
template <int kD, int kRows, int kThreads>
__device__ __forceinline__ void load_q_tile(const DecodeParams& p, uint16_t* sq, int b, int hkv, int r_first,
                                            int rows_here, int tid) {
  constexpr int kStride = kD + kDecodePad;
  static_assert((kRows * kD / 2) % kThreads == 0, "Q tile split over threads");
#pragma unroll
  for (int k = 0; k < kRows * kD / 2 / kThreads; ++k) {  // unrolled: every load in flight at once
    const int i = tid + k * kThreads;
    const int r = i / (kD / 2), c = 2 * (i % (kD / 2));
    uint32_t w = 0u;
    if (r < rows_here) {
      const int rg = r_first + r, t = rg / p.group, h = hkv * p.group + rg % p.group;
      const uint16_t* src = static_cast<const uint16_t*>(p.q) + b * p.q_sb + t * p.q_st + h * p.q_sh + c;
      w = uint32_t(src[0]) | (uint32_t(src[1]) << 16);
    }
    *reinterpret_cast<uint32_t*>(sq + r * kStride + c) = w;
  }
}

// One thread's share of a warp's rows: rows mb * 16 + g + 8 * hf (g = lane / 4) of the tile, their
// visible keys [row_lo, row_hi], and the running max (log2 domain), sum and output of its 16 keys
// per stage.
template <int kD, int kMBlocks>
struct WarpRows {
  int32_t row_hi[kMBlocks][2], row_lo[kMBlocks][2];
  float o[kMBlocks][kD / 8][4];
  float m[kMBlocks][2], l[kMBlocks][2];
};

template <int kD, int kMBlocks>
__device__ __forceinline__ void init_rows(WarpRows<kD, kMBlocks>& w, const DecodeParams& p, const KeyRange& kr,
                                          int r_first, int rows_here, int lane) {
  const int g = lane / 4;
#pragma unroll
  for (int mb = 0; mb < kMBlocks; ++mb)
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) {
      const int r = mb * 16 + g + 8 * hf;
      if (r < rows_here) {
        const int32_t pos = kr.n - p.q_len + (r_first + r) / p.group;  // the token's position
        const int32_t wlo = p.window_left >= 0 ? pos - p.window_left : 0;
        w.row_hi[mb][hf] = pos;
        w.row_lo[mb][hf] = wlo > kr.lo ? wlo : kr.lo;  // kr.lo: the key start, and an aligned range's head
      } else {                                         // padding row: sees nothing
        w.row_hi[mb][hf] = -1;
        w.row_lo[mb][hf] = 0;
      }
    }
#pragma unroll
  for (int mb = 0; mb < kMBlocks; ++mb) {
#pragma unroll
    for (int nd = 0; nd < kD / 8; ++nd)
#pragma unroll
      for (int e = 0; e < 4; ++e) w.o[mb][nd][e] = 0.0f;
    w.m[mb][0] = w.m[mb][1] = -INFINITY;
    w.l[mb][0] = w.l[mb][1] = 0.0f;
  }
}

// The logit transform into the log2 domain: scale, or the softcap c tanh(s scale / c).
struct LogitScale {
  float scale_log2, cap, cap_inv, cap_log2;
};
__device__ __forceinline__ LogitScale logit_scale(const DecodeParams& p) {
  const float cap = p.softcap;
  return {p.scale * kLog2e, cap, cap > 0.0f ? p.scale / cap : 0.0f, cap * kLog2e};
}

// Q fragments of the tile in registers (kQInRegs) for the whole key loop.
template <int kD, int kMBlocks, bool kQInRegs>
using QFrags = uint32_t[kQInRegs ? kMBlocks : 1][kQInRegs ? kD / 16 : 1][4];

template <int kD, int kMBlocks, bool kQInRegs>
__device__ __forceinline__ void load_q_frags(QFrags<kD, kMBlocks, kQInRegs>& qf, const uint16_t* sq, int lane) {
  constexpr int kStride = kD + kDecodePad;
#pragma unroll
  for (int mb = 0; mb < (kQInRegs ? kMBlocks : 1); ++mb)
#pragma unroll
    for (int kk = 0; kk < (kQInRegs ? kD / 16 : 1); ++kk)
      ldmatrix_x4(smem_addr(sq + (mb * 16 + lane % 16) * kStride + kk * 16 + 8 * (lane / 16)), qf[mb][kk]);
}

// One warp's 16 keys j0 .. j0 + 15 of a stage (keys at and past `end` masked):
//   k_addr(kk): the lane's ldmatrix_x4 address of the keys' columns 16 kk .. 16 kk + 15 (row
//               lane % 8 + 8 (lane / 16), column half (lane / 8) % 2: the B fragments of two n8 tiles);
//   v_addr(nd): the lane's ldmatrix_x4_trans address of the values' rows lane % 16, columns
//               16 nd + 8 (lane / 16).
template <typename T, int kD, int kMBlocks, bool kQInRegs, class KAddr, class VAddr>
__device__ __forceinline__ void warp_tile(WarpRows<kD, kMBlocks>& w, const QFrags<kD, kMBlocks, kQInRegs>& qf,
                                          const uint16_t* sq, KAddr k_addr, VAddr v_addr, int32_t j0, int32_t end,
                                          const LogitScale& ls, int lane) {
  constexpr int kStride = kD + kDecodePad;
  const int tq = lane % 4;
  // S = Q K^T for this warp's keys: s[mb][n8][e]
  float s[kMBlocks][2][4];
#pragma unroll
  for (int mb = 0; mb < kMBlocks; ++mb)
#pragma unroll
    for (int e = 0; e < 8; ++e) s[mb][e / 4][e % 4] = 0.0f;
#pragma unroll
  for (int kk = 0; kk < kD / 16; ++kk) {
    uint32_t kb[4];
    ldmatrix_x4(k_addr(kk), kb);
#pragma unroll
    for (int mb = 0; mb < kMBlocks; ++mb) {
      uint32_t a[4];
      if constexpr (kQInRegs) {
#pragma unroll
        for (int e = 0; e < 4; ++e) a[e] = qf[mb][kk][e];
      } else {
        ldmatrix_x4(smem_addr(sq + (mb * 16 + lane % 16) * kStride + kk * 16 + 8 * (lane / 16)), a);
      }
      mma_16816<T>(s[mb][0], a, kb[0], kb[1]);
      mma_16816<T>(s[mb][1], a, kb[2], kb[3]);
    }
  }

  // mask, scale (and cap) into the log2 domain, online softmax per row
  const int32_t jl = j0 + 2 * tq;
  uint32_t pa[kMBlocks][4];
#pragma unroll
  for (int mb = 0; mb < kMBlocks; ++mb) {
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) {
      float x[4];
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int32_t j = jl + (e / 2) * 8 + (e % 2);
        float v = s[mb][e / 2][2 * hf + e % 2];
        v = ls.cap > 0.0f ? ls.cap_log2 * tanh_approx(v * ls.cap_inv) : v * ls.scale_log2;
        const bool vis = j < end && j <= w.row_hi[mb][hf] && j >= w.row_lo[mb][hf];
        x[e] = vis ? v : -INFINITY;
      }
      float mx = fmaxf(fmaxf(x[0], x[1]), fmaxf(x[2], x[3]));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
      const float m_new = fmaxf(w.m[mb][hf], mx);
      const float m_use = m_new == -INFINITY ? 0.0f : m_new;  // no visible key yet: p = 0
      const float alpha = ex2_approx(w.m[mb][hf] - m_use);
      w.m[mb][hf] = m_new;
      float sum = 0.0f;
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        x[e] = ex2_approx(x[e] - m_use);
        sum += x[e];
      }
      w.l[mb][hf] = w.l[mb][hf] * alpha + sum;
#pragma unroll
      for (int nd = 0; nd < kD / 8; ++nd) {
        w.o[mb][nd][2 * hf] *= alpha;
        w.o[mb][nd][2 * hf + 1] *= alpha;
      }
      // A fragment of P (16 rows x 16 keys): a0/a2 rows g (hf 0), a1/a3 rows g + 8 (hf 1)
      pa[mb][hf] = pack2<T>(x[0], x[1]);
      pa[mb][2 + hf] = pack2<T>(x[2], x[3]);
    }
  }

  // O += P V over this warp's 16 keys
#pragma unroll
  for (int nd = 0; nd < kD / 16; ++nd) {
    uint32_t vb[4];
    ldmatrix_x4_trans(v_addr(nd), vb);
#pragma unroll
    for (int mb = 0; mb < kMBlocks; ++mb) {
      mma_16816<T>(w.o[mb][2 * nd], pa[mb], vb[0], vb[1]);
      mma_16816<T>(w.o[mb][2 * nd + 1], pa[mb], vb[2], vb[3]);
    }
  }
}

// The end of a CTA, by all of its threads (every __syncthreads is reached by each of them): warps
// 0 .. kWarps - 1 hold the rows' state; a further (producer) warp only takes part in the barriers.
// `merge_smem`: kWarps * kRows * (D + 2) floats no warp reads or writes any more (the drained ring).
//
// The warps merge: each writes (m, l, o) of its rows, then each thread finishes a row slice.
// splits == 1: the CTA writes out and lse. splits > 1: it writes its normalized partial output and
// log2-sum-exp (float32, the workspace) and takes a ticket from its (sequence, kv head)'s counter; the
// CTA that takes the last one combines the splits (decode_merge.cuh's merge_split_row) and resets the
// counter.
template <typename T, int kD, int kMBlocks, int kWarps>
__device__ __forceinline__ void finish_cta(WarpRows<kD, kMBlocks>& w, const DecodeParams& p, int splits, float* ws_o,
                                           float* ws_lse, int32_t* counters, float* merge_smem, int b, int hkv,
                                           int split, int row_tiles, int r_first, int rows_here, int tid) {
  constexpr int kRows = 16 * kMBlocks;
  constexpr int kThreads = 32 * kWarps;
  const int warp = tid / 32, lane = tid % 32;
  const int g = lane / 4, tq = lane % 4;
  const bool holds_rows = warp < kWarps;
  if (holds_rows) {
#pragma unroll
    for (int mb = 0; mb < kMBlocks; ++mb)
#pragma unroll
      for (int hf = 0; hf < 2; ++hf) {
        w.l[mb][hf] += __shfl_xor_sync(0xffffffffu, w.l[mb][hf], 1);
        w.l[mb][hf] += __shfl_xor_sync(0xffffffffu, w.l[mb][hf], 2);
      }
  }
  __syncthreads();                       // every warp is done with the K/V stages: the merge area reuses them
  float* mo = merge_smem;                // [kWarps][kRows][kD]
  float* mm = mo + kWarps * kRows * kD;  // [kWarps][kRows]
  float* ml = mm + kWarps * kRows;       // [kWarps][kRows]
  if (holds_rows) {
#pragma unroll
    for (int mb = 0; mb < kMBlocks; ++mb)
#pragma unroll
      for (int hf = 0; hf < 2; ++hf) {
        const int r = mb * 16 + g + 8 * hf;
        float* dst = mo + (warp * kRows + r) * kD + 2 * tq;
#pragma unroll
        for (int nd = 0; nd < kD / 8; ++nd)
          *reinterpret_cast<float2*>(dst + nd * 8) = make_float2(w.o[mb][nd][2 * hf], w.o[mb][nd][2 * hf + 1]);
        if (tq == 0) {
          mm[warp * kRows + r] = w.m[mb][hf];
          ml[warp * kRows + r] = w.l[mb][hf];
        }
      }
  }
  __syncthreads();

  constexpr int kThreadsPerRow = kThreads / kRows;
  constexpr int kCols = kD / kThreadsPerRow;  // columns per thread
  static_assert(kThreads % kRows == 0 && kD % kThreadsPerRow == 0 && kCols % 2 == 0, "merge split");
  const int r = tid / kThreadsPerRow, c0 = (tid % kThreadsPerRow) * kCols;  // r >= kRows past kThreads
  if (r < rows_here) {
    float mx = -INFINITY;
#pragma unroll
    for (int v = 0; v < kWarps; ++v) mx = fmaxf(mx, mm[v * kRows + r]);
    const int rg = r_first + r, t = rg / p.group, h = hkv * p.group + rg % p.group;
    float sink = -INFINITY;
    if (splits == 1 && p.sinks != nullptr)
      sink = (p.sinks_float ? static_cast<const float*>(p.sinks)[h] : to_float(static_cast<const T*>(p.sinks)[h])) *
             kLog2e;
    const float m_all = fmaxf(mx, sink);
    const float m_use = m_all == -INFINITY ? 0.0f : m_all;
    float wgt[kWarps];
    float den = sink == -INFINITY ? 0.0f : ex2_approx(sink - m_use);
#pragma unroll
    for (int v = 0; v < kWarps; ++v) {
      wgt[v] = ex2_approx(mm[v * kRows + r] - m_use);
      den += wgt[v] * ml[v * kRows + r];
    }
    const float inv = den > 0.0f ? 1.0f / den : 0.0f;
    const float lse2 = den > 0.0f ? m_use + __log2f(den) : -INFINITY;
    // columns c, c + 1 of row r: the warps' outputs weighted and normalized
    auto merged = [&](int c) {
      float a0 = 0.0f, a1 = 0.0f;
#pragma unroll
      for (int v = 0; v < kWarps; ++v) {
        const float2 x = *reinterpret_cast<const float2*>(mo + (v * kRows + r) * kD + c0 + c);
        a0 += wgt[v] * x.x;
        a1 += wgt[v] * x.y;
      }
      return make_float2(a0 * inv, a1 * inv);
    };
    if (splits == 1) {
      uint16_t* out = static_cast<uint16_t*>(p.out) + b * p.o_sb + t * p.o_st + h * p.o_sh;
#pragma unroll
      for (int c = 0; c < kCols; c += 2) {
        const float2 a = merged(c);
        const uint32_t pk = pack2<T>(a.x, a.y);
        out[c0 + c] = uint16_t(pk & 0xffffu);
        out[c0 + c + 1] = uint16_t(pk >> 16);
      }
      if (p.lse != nullptr && c0 == 0) p.lse[b * p.lse_sb + t * p.lse_st + h] = lse2 * kLn2;
    } else {
      const int64_t row = (int64_t(b) * p.q_len + t) * p.heads_q + h;
      float* dst = ws_o + (row * splits + split) * kD + c0;
#pragma unroll
      for (int c = 0; c < kCols; c += 2) *reinterpret_cast<float2*>(dst + c) = merged(c);
      if (c0 == 0) ws_lse[row * splits + split] = lse2;
    }
  }
  if (splits == 1) return;

  // ---- split merge by the last CTA of this (sequence, kv head) ----
  // The splits x row tiles CTAs of (b, hkv) each take a ticket from counters[b * Hkv + hkv] once
  // their partials are stored; the one that draws the last ticket merges every row of (b, hkv)
  // (decode_merge.cuh's formula, sinks and lse included) and puts the counter back to 0, so the
  // next call (or graph replay) finds it zero. Ordering: each thread's partial stores, then its
  // __threadfence (release, device scope), then the barrier, then thread 0's fence and atomicAdd;
  // the last CTA's thread 0 fences after its atomicAdd (acquire) before the barrier that releases
  // the merging threads, which read the partials through L2 (ld.global.cg). No CTA waits on
  // another: the last one to arrive does the merge, so any schedule of the grid completes.
  __shared__ int last_cta;
  __threadfence();
  __syncthreads();
  int32_t* counter = counters + int64_t(b) * p.heads_kv + hkv;
  if (tid == 0) {
    __threadfence();  // cumulative over the CTA's stores that the barrier ordered before it
    const int ticket = atomicAdd(counter, 1);
    const bool last = ticket == splits * row_tiles - 1;
    if (last) {
      __threadfence();
      *counter = 0;  // every other CTA of (b, hkv) has taken its ticket
    }
    last_cta = last;
  }
  __syncthreads();
  if (!last_cta || !holds_rows) return;
  for (int rg = warp; rg < p.rows; rg += kWarps) {
    const int t = rg / p.group, h = hkv * p.group + rg % p.group;
    merge_split_row<T, kD>(p, splits, ws_o, ws_lse, (int64_t(b) * p.q_len + t) * p.heads_q + h, lane);
  }
}

}  // namespace decode
}  // namespace kernelforge
