// Decode attention, head-group kernel: the Lq newest tokens of each sequence against its KV cache,
// split-KV, with one CTA reading every kv head of a group of kHeads for its keys. Formula and layouts:
// include/kernelforge/decode.h.
//
// Why: at page size 1 each token's keys of all kv heads are one row of Hkv * D elements (2 KB for
// 8 heads of d128), and the pages of a sequence lie anywhere in the pool. The per-head kernel
// (decode_attention.cuh) reads 256 bytes of such a row per CTA, each from another DRAM page; this
// kernel reads the kHeads heads of a token as one contiguous run of kHeads * D * 2 bytes (the copies
// of consecutive threads are consecutive 16-byte chunks of the row), so a row's DRAM page is opened
// once for all of them.
//
// One CTA per (split, kv head group, sequence): grid (splits, ceil(Hkv / kHeads), B). Warp w owns kv
// head group * kHeads + w (a warp past Hkv takes part in the barriers only) and its query rows
// (group * Lq <= 16, one m16 tile, the padding rows masked), and runs the per-head kernel's warp_tile
// on all 16 keys of each stage: S = Q K^T, online softmax, O += P V on mma.sync m16n8k16, Q in
// registers at D <= 128. The warps share the cp.async ring and the block-table reads, not their rows:
// no cross-warp merge. Stage s holds K and V of 16 keys x kHeads heads, [head][key][D + pad].
//
// Bytes: every visible key and value row once per kv head, as the per-head kernel: 2 * keys * Hkv * D
// * sizeof(T) per sequence. Per CTA and stage 2 * 16 * kHeads * D * 2 bytes (64 KB for 8 heads of
// d128), kStages - 1 stages in flight while one is consumed.
//
// splits == 1: each warp writes out and lse of its rows. splits > 1: it writes its normalized partial
// output and log2-sum-exp (the workspace of the per-head kernel: the same layout and counters) and
// takes a ticket from its (sequence, kv head)'s counter; the warp that takes the last one (splits
// tickets per counter) combines the splits with decode_merge.cuh's merge_split_row and resets the
// counter.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "attention/kernels/mma_common.cuh"
#include "common/launch.cuh"
#include "decode/decode_config.h"
#include "decode/decode_problem.h"
#include "decode/kernels/decode_common.cuh"

namespace kernelforge {
namespace decode {

// The end of a warp that owns every split-local state of its rows (no other warp holds them): out and
// lse (splits == 1, with the sink), or the partials and the ticket of the split merge (splits > 1).
// The warp's rows are r = g + 8 hf (g = lane / 4) of the m16 tile, rows_here of them real.
template <typename T, int kD>
__device__ __forceinline__ void finish_warp(WarpRows<kD, 1>& w, const DecodeParams& p, int splits, float* ws_o,
                                            float* ws_lse, int32_t* counters, int b, int hkv, int split, int rows_here,
                                            int lane) {
  const int g = lane / 4, tq = lane % 4;
#pragma unroll
  for (int hf = 0; hf < 2; ++hf) {
    w.l[0][hf] += __shfl_xor_sync(0xffffffffu, w.l[0][hf], 1);
    w.l[0][hf] += __shfl_xor_sync(0xffffffffu, w.l[0][hf], 2);
  }
#pragma unroll
  for (int hf = 0; hf < 2; ++hf) {
    const int r = g + 8 * hf;
    if (r >= rows_here) continue;
    const int t = r / p.group, h = hkv * p.group + r % p.group;
    const float m = w.m[0][hf], l = w.l[0][hf];
    if (splits == 1) {
      // out = o 2^(m - M) / (l 2^(m - M) + 2^(sink - M)), M = max(m, sink); lse = M + log2(den)
      float sink = -INFINITY;
      if (p.sinks != nullptr)
        sink = (p.sinks_float ? static_cast<const float*>(p.sinks)[h] : to_float(static_cast<const T*>(p.sinks)[h])) *
               kLog2e;
      const float m_all = fmaxf(m, sink);
      const float m_use = m_all == -INFINITY ? 0.0f : m_all;
      const float a = ex2_approx(m - m_use);
      const float den = l * a + (sink == -INFINITY ? 0.0f : ex2_approx(sink - m_use));
      const float inv = den > 0.0f ? a / den : 0.0f;
      uint16_t* out = static_cast<uint16_t*>(p.out) + b * p.o_sb + t * p.o_st + h * p.o_sh + 2 * tq;
#pragma unroll
      for (int nd = 0; nd < kD / 8; ++nd) {
        const uint32_t pk = pack2<T>(w.o[0][nd][2 * hf] * inv, w.o[0][nd][2 * hf + 1] * inv);
        out[nd * 8] = uint16_t(pk & 0xffffu);
        out[nd * 8 + 1] = uint16_t(pk >> 16);
      }
      if (p.lse != nullptr && tq == 0)
        p.lse[b * p.lse_sb + t * p.lse_st + h] = den > 0.0f ? (m_use + __log2f(den)) * kLn2 : -INFINITY;
    } else {
      // the split's output normalized by its own sum, and its log2-sum-exp (-inf: no visible key)
      const float inv = l > 0.0f ? 1.0f / l : 0.0f;
      const int64_t row = (int64_t(b) * p.q_len + t) * p.heads_q + h;
      float* dst = ws_o + (row * splits + split) * kD + 2 * tq;
#pragma unroll
      for (int nd = 0; nd < kD / 8; ++nd)
        *reinterpret_cast<float2*>(dst + nd * 8) = make_float2(w.o[0][nd][2 * hf] * inv, w.o[0][nd][2 * hf + 1] * inv);
      if (tq == 0) ws_lse[row * splits + split] = l > 0.0f ? m + __log2f(l) : -INFINITY;
    }
  }
  if (splits == 1) return;

  // ---- split merge by the last warp of this (sequence, kv head) ----
  // finish_cta's protocol at warp scope: each lane's partial stores, its __threadfence (release), the
  // warp barrier, lane 0's fence and atomicAdd; the last warp's lane 0 fences after it (acquire) and
  // resets the counter; the merge reads the partials through L2 (ld.global.cg).
  __threadfence();
  __syncwarp();
  int last = 0;
  if (lane == 0) {
    int32_t* counter = counters + int64_t(b) * p.heads_kv + hkv;
    __threadfence();
    last = atomicAdd(counter, 1) == splits - 1;
    if (last) {
      __threadfence();
      *counter = 0;  // every other split of (b, hkv) has taken its ticket
    }
  }
  last = __shfl_sync(0xffffffffu, last, 0);
  if (!last) return;
  for (int rg = 0; rg < p.rows; ++rg) {
    const int t = rg / p.group, h = hkv * p.group + rg % p.group;
    merge_split_row<T, kD>(p, splits, ws_o, ws_lse, (int64_t(b) * p.q_len + t) * p.heads_q + h, lane);
  }
}

template <typename T, int kD, int kHeads, int kStages>
__global__ void __launch_bounds__(kHeads * 32, 1)
    decode_attention_heads_kernel(DecodeParams p, int splits, float* ws_o, float* ws_lse, int32_t* counters) {
  if constexpr (!arch_supports<T>()) {
    __trap();
  } else {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    constexpr int kBlockN = 16;  // keys per stage (every head's)
    constexpr int kThreads = 32 * kHeads;
    constexpr int kStride = kD + kDecodePad;  // shared row, elements
    constexpr int kChunks = kD / 8;           // 16-byte chunks per head row
    constexpr int kRowChunks = kHeads * kChunks;
    constexpr int kRowStep = kThreads / kRowChunks;  // keys copied per pass of the CTA
    constexpr int kLoadRows = kBlockN / kRowStep;    // keys each thread copies per stage
    static_assert(kThreads % kRowChunks == 0 && kBlockN % kRowStep == 0, "stage split over threads");
    constexpr int kStageElems = 2 * kHeads * kBlockN * kStride;  // K then V, [head][key][kStride]
    constexpr bool kQInRegs = kD <= 128;

    extern __shared__ __align__(16) uint16_t smem[];
    uint16_t* sq = smem;                         // [kHeads][16][kStride]
    uint16_t* skv = sq + kHeads * 16 * kStride;  // stages

    const int split = blockIdx.x;
    const int hkv0 = blockIdx.y * kHeads;
    const int b = blockIdx.z;
    const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
    const int hkv = hkv0 + warp;  // this warp's kv head
    const bool has_head = hkv < p.heads_kv;
    const int rows_here = p.rows;  // <= 16 (the planner's condition)

    pdl_wait();
    const KeyRange kr = key_range<kBlockN>(p, b, 0, rows_here - 1, split, splits);
#pragma unroll 1
    for (int h = 0; h < kHeads; ++h)
      load_q_tile<kD, 16, kThreads>(p, sq + h * 16 * kStride, b, hkv0 + h < p.heads_kv ? hkv0 + h : hkv0, 0,
                                    hkv0 + h < p.heads_kv ? rows_here : 0, tid);

    // ---- K/V loads: thread copies chunk cc of head hc for keys r0, r0 + kRowStep, ... of a stage ----
    // Consecutive threads copy consecutive 16-byte chunks of a key's row of kHeads heads: one
    // contiguous run of kHeads * D * 2 bytes when the cache's head stride is D (page-size-1 pools).
    const int r0 = tid / kRowChunks, hc = (tid % kRowChunks) / kChunks, cc = tid % kChunks;
    const KvCopies<kLoadRows, kRowStep> copies(p, hkv0 + hc, cc, b, r0, hkv0 + hc < p.heads_kv);
    auto fetch = [&](int32_t tile_start, int32_t(&pg)[kLoadRows]) { copies.fetch(p, tile_start, kr.end, pg); };
    auto load = [&](int32_t tile_start, int stage, const int32_t(&pg)[kLoadRows]) {
      uint16_t* sk = skv + stage * kStageElems + hc * kBlockN * kStride + cc * 8;
      copies.template load<kStride>(p, tile_start, sk, sk + kHeads * kBlockN * kStride, pg);
    };
    const int n_tiles = (kr.end - kr.start + kBlockN - 1) / kBlockN;
    int32_t pages[kLoadRows];  // the pages of the next stage to copy
    ring_prologue<kStages, kBlockN>(kr.start, n_tiles, fetch, load, pages);

    WarpRows<kD, 1> w;
    init_rows(w, p, kr, 0, rows_here, lane);
    QFrags<kD, 1, kQInRegs> qf;
    const LogitScale ls = logit_scale(p);
    const uint16_t* sq_w = sq + warp * 16 * kStride;

    for (int it = 0; it < n_tiles; ++it) {
      ring_step<kStages, kBlockN>(it, kr.start, n_tiles, fetch, load, pages);
      if (kQInRegs && it == 0) load_q_frags<kD, 1, kQInRegs>(qf, sq_w, lane);
      if (has_head) {
        const uint16_t* sk = skv + (it % kStages) * kStageElems + warp * kBlockN * kStride;
        const uint16_t* sv = sk + kHeads * kBlockN * kStride;
        warp_tile<T, kD, 1, kQInRegs>(
            w, qf, sq_w,
            [&](int kk) {
              return smem_addr(sk + (lane % 8 + 8 * (lane / 16)) * kStride + kk * 16 + 8 * ((lane / 8) % 2));
            },
            [&](int nd) { return smem_addr(sv + (lane % 16) * kStride + nd * 16 + 8 * (lane / 16)); },
            kr.start + it * kBlockN, kr.end, ls, lane);
      }
      __syncthreads();  // the stage is refilled by the next iteration's load
    }
    cp_async_wait<0>();
    pdl_trigger();
    if (has_head) finish_warp<T, kD>(w, p, splits, ws_o, ws_lse, counters, b, hkv, split, rows_here, lane);
#endif
  }
}

}  // namespace decode
}  // namespace kernelforge
