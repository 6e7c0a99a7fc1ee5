// Decode attention: the Lq newest tokens of each sequence against its KV cache (paged or
// contiguous), split-KV. Formula and layouts: include/kernelforge/decode.h.
//
// One CTA per (split, row tile, kv head, sequence). The query rows of one kv head (group * Lq of
// them: every query head of the group, every new token) form the M side of the tensor-core tile, so
// a key is read once for the whole group: S = Q K^T on mma.sync m16n8k16 with the rows padded to 16
// (kRows = 16 or 32). The warps share each key tile (kBlockN = 16 keys per warp): each warp keeps its
// own running max, sum and output for its keys, and the warps merge once at the end through shared
// memory, so the key loop has no cross-warp dependency but the pipeline barrier.
// K/V tiles stream through a kStages-deep cp.async ring; every row's address goes through the block
// table (one int32 per key row and thread, read from L1/L2), so any page size costs the same loads.
//
// Bytes: every visible key and value row once per (kv head, row tile): the bound is
// 2 * keys * D * sizeof(T) / copy bandwidth. FLOPs are 4 * kRows * keys * D per CTA: at Lq * group
// <= 16 one m16 tile, far below the tensor-core rate, so the kernel is bound by the bytes in flight:
// kStages * 2 * kBlockN * D * 2 bytes per CTA (48 KB at d128), two CTAs per SM.
//
// splits == 1: the CTA writes out and lse. splits > 1: it writes its normalized partial output and
// log2-sum-exp (float32, the workspace) and takes a ticket from its (sequence, kv head)'s counter; the
// CTA that takes the last one combines the splits (decode_merge.cuh's merge_split_row) and resets the
// counter. No second launch: at batch 1 the merge kernel's launch and its read of the partials sat on
// the critical path after the slowest split. The merge reads splits * (D + 1) * 4 bytes per row from
// L2 (the partials were just written) in one CTA per (sequence, kv head): at 32 splits and 4 rows of
// d128, 66 KB.
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
struct KeyRange {
  int32_t start, end;
  int32_t n;  // the clamped seq_len
};

template <int kBlockN>
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
  const int32_t tiles = (hi - lo + kBlockN - 1) / kBlockN;
  const int32_t per_split = (tiles + splits - 1) / splits;
  int32_t start = lo + split * per_split * kBlockN;
  int32_t end = start + per_split * kBlockN;
  start = start > hi ? hi : start;
  end = end > hi ? hi : end;
  return {start, end, n};
}

template <typename T, int kD, int kMBlocks, int kWarps, int kStages, int kMinCtas = 1>
__global__ void __launch_bounds__(kWarps * 32, kMinCtas)
    decode_attention_kernel(DecodeParams p, int splits, float* ws_o, float* ws_lse, int32_t* counters) {
  if constexpr (!arch_supports<T>()) {
    __trap();
  } else {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    constexpr int kRows = 16 * kMBlocks;
    constexpr int kBlockN = 16 * kWarps;
    constexpr int kThreads = 32 * kWarps;
    constexpr int kStride = kD + kDecodePad;  // shared row, elements
    constexpr int kChunks = kD / 8;           // 16-byte chunks per row
    constexpr int kRowStep = kThreads / kChunks;
    constexpr int kLoadRows = kBlockN / kRowStep;  // rows each thread copies per tile
    static_assert(kThreads % kChunks == 0 && kBlockN % kRowStep == 0, "tile split over threads");
    constexpr bool kQInRegs = kD * kMBlocks <= 128;  // larger tiles read Q fragments from shared memory

    extern __shared__ __align__(16) uint16_t smem[];
    uint16_t* sq = smem;
    uint16_t* skv = sq + kRows * kStride;  // stage s: K at skv + s * 2 * kBlockN * kStride, V after it

    const int split = blockIdx.x;
    const int row_tiles = (p.rows + kRows - 1) / kRows;
    const int hkv = blockIdx.y / row_tiles;
    const int row_tile = blockIdx.y % row_tiles;
    const int b = blockIdx.z;
    const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
    const int g = lane / 4, tq = lane % 4;
    const int r_first = row_tile * kRows;
    const int rows_here = min(kRows, p.rows - r_first);

    pdl_wait();
    const KeyRange kr = key_range<kBlockN>(p, b, r_first, r_first + rows_here - 1, split, splits);

    // ---- Q tile (element loads: q may have any alignment; kRows x D elements, read once) ----
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

    // ---- K/V loads: thread copies column chunk cc of rows r0, r0 + kRowStep, ... of each tile ----
    const int r0 = tid / kChunks, cc = tid % kChunks;
    const uint16_t* kbase = static_cast<const uint16_t*>(p.k_cache) + hkv * p.k_sh + cc * 8;
    const uint16_t* vbase = static_cast<const uint16_t*>(p.v_cache) + hkv * p.v_sh + cc * 8;
    const int32_t* bt = p.block_table != nullptr ? p.block_table + b * p.bt_sb : nullptr;
    const int32_t page_mask = p.page_size - 1;
    // The page of each of this thread's rows of a tile, read from the block table one tile ahead of
    // its copy (the read's latency then overlaps a tile of compute); -1: no row or out of range.
    auto fetch_pages = [&](int tile_start, int32_t(&pg)[kLoadRows]) {
#pragma unroll
      for (int i = 0; i < kLoadRows; ++i) {
        const int32_t j = tile_start + r0 + i * kRowStep;
        int32_t page = -1;
        if (j < kr.end) {
          page = bt != nullptr ? __ldg(bt + (j >> p.page_shift)) : b;
          page = page >= 0 && page < p.pages ? page : -1;
        }
        pg[i] = page;
      }
    };
    auto load_tile = [&](int tile_start, int stage, const int32_t(&pg)[kLoadRows]) {
      uint16_t* sk = skv + stage * 2 * kBlockN * kStride;
      uint16_t* sv = sk + kBlockN * kStride;
#pragma unroll
      for (int i = 0; i < kLoadRows; ++i) {
        const int r = r0 + i * kRowStep;
        const int32_t j = tile_start + r;
        const bool ok = pg[i] >= 0;
        const int32_t row = bt != nullptr ? (j & page_mask) : j;
        const int64_t koff = ok ? pg[i] * p.k_sp + row * p.k_st : 0;
        const int64_t voff = ok ? pg[i] * p.v_sp + row * p.v_st : 0;
        cp_async16(smem_addr(sk + r * kStride + cc * 8), kbase + koff, ok);
        cp_async16(smem_addr(sv + r * kStride + cc * 8), vbase + voff, ok);
      }
    };

    const int n_tiles = (kr.end - kr.start + kBlockN - 1) / kBlockN;
    int32_t pages[kLoadRows];  // the pages of the next tile to copy
    {
      int32_t first[kStages - 1][kLoadRows];  // every table read of the prologue in flight at once
#pragma unroll
      for (int s = 0; s < kStages - 1; ++s) fetch_pages(kr.start + s * kBlockN, first[s]);
#pragma unroll
      for (int s = 0; s < kStages - 1; ++s) {
        if (s < n_tiles) load_tile(kr.start + s * kBlockN, s, first[s]);
        cp_async_commit();
      }
      fetch_pages(kr.start + (kStages - 1) * kBlockN, pages);
    }

    // ---- per-thread rows: mb * 16 + g + 8 * half; their last visible key and first one ----
    int32_t row_hi[kMBlocks][2], row_lo[kMBlocks][2];
#pragma unroll
    for (int mb = 0; mb < kMBlocks; ++mb)
#pragma unroll
      for (int hf = 0; hf < 2; ++hf) {
        const int r = mb * 16 + g + 8 * hf;
        if (r < rows_here) {
          const int32_t pos = kr.n - p.q_len + (r_first + r) / p.group;  // the token's position
          row_hi[mb][hf] = pos;
          row_lo[mb][hf] = p.window_left >= 0 ? pos - p.window_left : 0;
        } else {  // padding row: sees nothing
          row_hi[mb][hf] = -1;
          row_lo[mb][hf] = 0;
        }
      }

    float o[kMBlocks][kD / 8][4];
    float m[kMBlocks][2], l[kMBlocks][2];
#pragma unroll
    for (int mb = 0; mb < kMBlocks; ++mb) {
#pragma unroll
      for (int nd = 0; nd < kD / 8; ++nd)
#pragma unroll
        for (int e = 0; e < 4; ++e) o[mb][nd][e] = 0.0f;
      m[mb][0] = m[mb][1] = -INFINITY;
      l[mb][0] = l[mb][1] = 0.0f;
    }
    uint32_t qf[kQInRegs ? kMBlocks : 1][kQInRegs ? kD / 16 : 1][4];
    const float scale_log2 = p.scale * kLog2e;
    const float cap = p.softcap;
    const float cap_inv = cap > 0.0f ? p.scale / cap : 0.0f;
    const float cap_log2 = cap * kLog2e;

    for (int it = 0; it < n_tiles; ++it) {
      {
        const int nt = it + kStages - 1;
        if (nt < n_tiles) {
          load_tile(kr.start + nt * kBlockN, nt % kStages, pages);
          fetch_pages(kr.start + (nt + 1) * kBlockN, pages);
        }
        cp_async_commit();
      }
      cp_async_wait<kStages - 1>();
      __syncthreads();
      if (kQInRegs && it == 0) {
#pragma unroll
        for (int mb = 0; mb < (kQInRegs ? kMBlocks : 1); ++mb)
#pragma unroll
          for (int kk = 0; kk < (kQInRegs ? kD / 16 : 1); ++kk)
            ldmatrix_x4(smem_addr(sq + (mb * 16 + lane % 16) * kStride + kk * 16 + 8 * (lane / 16)), qf[mb][kk]);
      }
      const uint16_t* sk = skv + (it % kStages) * 2 * kBlockN * kStride;
      const uint16_t* sv = sk + kBlockN * kStride;
      const int kw = warp * 16;  // this warp's 16 keys of the tile

      // S = Q K^T for this warp's keys: s[mb][n8][e]
      float s[kMBlocks][2][4];
#pragma unroll
      for (int mb = 0; mb < kMBlocks; ++mb)
#pragma unroll
        for (int e = 0; e < 8; ++e) s[mb][e / 4][e % 4] = 0.0f;
#pragma unroll
      for (int kk = 0; kk < kD / 16; ++kk) {
        uint32_t kb[4];
        ldmatrix_x4(smem_addr(sk + (kw + lane % 8 + 8 * (lane / 16)) * kStride + kk * 16 + 8 * ((lane / 8) % 2)), kb);
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
      const int32_t j0 = kr.start + it * kBlockN + kw + 2 * tq;
      uint32_t pa[kMBlocks][4];
#pragma unroll
      for (int mb = 0; mb < kMBlocks; ++mb) {
#pragma unroll
        for (int hf = 0; hf < 2; ++hf) {
          float x[4];
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const int32_t j = j0 + (e / 2) * 8 + (e % 2);
            float v = s[mb][e / 2][2 * hf + e % 2];
            v = cap > 0.0f ? cap_log2 * tanh_approx(v * cap_inv) : v * scale_log2;
            const bool vis = j < kr.end && j <= row_hi[mb][hf] && j >= row_lo[mb][hf];
            x[e] = vis ? v : -INFINITY;
          }
          float mx = fmaxf(fmaxf(x[0], x[1]), fmaxf(x[2], x[3]));
          mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
          mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
          const float m_new = fmaxf(m[mb][hf], mx);
          const float m_use = m_new == -INFINITY ? 0.0f : m_new;  // no visible key yet: p = 0
          const float alpha = ex2_approx(m[mb][hf] - m_use);
          m[mb][hf] = m_new;
          float sum = 0.0f;
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            x[e] = ex2_approx(x[e] - m_use);
            sum += x[e];
          }
          l[mb][hf] = l[mb][hf] * alpha + sum;
#pragma unroll
          for (int nd = 0; nd < kD / 8; ++nd) {
            o[mb][nd][2 * hf] *= alpha;
            o[mb][nd][2 * hf + 1] *= alpha;
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
        ldmatrix_x4_trans(smem_addr(sv + (kw + lane % 16) * kStride + nd * 16 + 8 * (lane / 16)), vb);
#pragma unroll
        for (int mb = 0; mb < kMBlocks; ++mb) {
          mma_16816<T>(o[mb][2 * nd], pa[mb], vb[0], vb[1]);
          mma_16816<T>(o[mb][2 * nd + 1], pa[mb], vb[2], vb[3]);
        }
      }
      __syncthreads();  // the stage is refilled by the next iteration's load
    }
    cp_async_wait<0>();
    pdl_trigger();

    // ---- merge the warps: each writes (m, l, o) of its rows, then each thread finishes a row slice ----
#pragma unroll
    for (int mb = 0; mb < kMBlocks; ++mb)
#pragma unroll
      for (int hf = 0; hf < 2; ++hf) {
        l[mb][hf] += __shfl_xor_sync(0xffffffffu, l[mb][hf], 1);
        l[mb][hf] += __shfl_xor_sync(0xffffffffu, l[mb][hf], 2);
      }
    __syncthreads();                            // every warp is done with the K/V stages: the merge area reuses them
    float* mo = reinterpret_cast<float*>(skv);  // [kWarps][kRows][kD]
    float* mm = mo + kWarps * kRows * kD;       // [kWarps][kRows]
    float* ml = mm + kWarps * kRows;            // [kWarps][kRows]
#pragma unroll
    for (int mb = 0; mb < kMBlocks; ++mb)
#pragma unroll
      for (int hf = 0; hf < 2; ++hf) {
        const int r = mb * 16 + g + 8 * hf;
        float* dst = mo + (warp * kRows + r) * kD + 2 * tq;
#pragma unroll
        for (int nd = 0; nd < kD / 8; ++nd)
          *reinterpret_cast<float2*>(dst + nd * 8) = make_float2(o[mb][nd][2 * hf], o[mb][nd][2 * hf + 1]);
        if (tq == 0) {
          mm[warp * kRows + r] = m[mb][hf];
          ml[warp * kRows + r] = l[mb][hf];
        }
      }
    __syncthreads();

    constexpr int kThreadsPerRow = kThreads / kRows;
    constexpr int kCols = kD / kThreadsPerRow;  // columns per thread
    static_assert(kThreads % kRows == 0 && kD % kThreadsPerRow == 0 && kCols % 2 == 0, "merge split");
    const int r = tid / kThreadsPerRow, c0 = (tid % kThreadsPerRow) * kCols;
    if (r < rows_here) {
      float mx = -INFINITY;
#pragma unroll
      for (int w = 0; w < kWarps; ++w) mx = fmaxf(mx, mm[w * kRows + r]);
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
      for (int w = 0; w < kWarps; ++w) {
        wgt[w] = ex2_approx(mm[w * kRows + r] - m_use);
        den += wgt[w] * ml[w * kRows + r];
      }
      const float inv = den > 0.0f ? 1.0f / den : 0.0f;
      const float lse2 = den > 0.0f ? m_use + __log2f(den) : -INFINITY;
      // columns c, c + 1 of row r: the warps' outputs weighted and normalized
      auto merged = [&](int c) {
        float a0 = 0.0f, a1 = 0.0f;
#pragma unroll
        for (int w = 0; w < kWarps; ++w) {
          const float2 v = *reinterpret_cast<const float2*>(mo + (w * kRows + r) * kD + c0 + c);
          a0 += wgt[w] * v.x;
          a1 += wgt[w] * v.y;
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
    if (!last_cta) return;
    for (int rg = warp; rg < p.rows; rg += kWarps) {
      const int t = rg / p.group, h = hkv * p.group + rg % p.group;
      merge_split_row<T, kD>(p, splits, ws_o, ws_lse, (int64_t(b) * p.q_len + t) * p.heads_q + h, lane);
    }
#endif
  }
}

}  // namespace decode
}  // namespace kernelforge
