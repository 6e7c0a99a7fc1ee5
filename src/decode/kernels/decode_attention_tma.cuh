// Decode attention on sm_90a with the K/V tiles copied by TMA from a producer warp. Contract:
// include/kernelforge/decode.h. Same CTA, math and split merge as decode_attention.cuh (the cp.async
// kernel, any sm_80+ GPU; both built on decode_common.cuh); notes/decode.md says when each runs.
//
// Why: the cp.async ring spends one 16-byte copy, one block-table read and a 64-bit address per
// thread per row chunk (2 * 64 * 16 = 2048 copies for a 64-key d128 stage); here one producer
// thread issues 2 * ceil(64 / page_size) * D / 64 tensor copies per stage (16 at page size 16, d128:
// boxes of 16 rows x 128 bytes) and the consumer warps spend no issue slots or registers on
// addresses. Bytes are the cp.async kernel's: every visible key and value row once per (kv head, row
// tile), 2 * keys * D * sizeof(T) over the copy bandwidth; FLOPs 4 * kRows * keys * D per CTA.
//
// CTA: kWarps consumer warps (16 keys of each kBlockN = 16 * kWarps stage each, their own running
// max / sum / output, merged at the end) + 1 producer warp. A kStages ring of (K, V) stages with
// mbarriers full[s] (the producer's expect_tx arrival + the copies' bytes) and empty[s] (one arrival
// per consumer warp): up to kStages stages in flight while the consumers work on a filled one.
//
// Tensor maps (decode_launch.cuh, attention_tma_map.h's encoder): the cache [P, page_size, Hkv, D]
// with its strides as a 4-D map (column, row, head, page), boxes of 64 columns x box_rows rows x 1
// head x 1 page in the 128-byte swizzle; box_rows = min(page_size, kBlockN) when paged,
// kBlockN for the contiguous cache (page b, row = key). The tiles start at multiples of kBlockN
// (key_range<kBlockN, true>), so a tile holds kBlockN / box_rows whole pages (or lies inside one):
// piece i of the tile is one box per 64 columns at page block_table[b, (start + i box_rows) >>
// page_shift], row (start + i box_rows) & (page_size - 1). Page sizes below 16 keep the cp.async
// kernel (plan_decode).
//
// Out of range: a block-table entry outside [0, P) is passed as the page coordinate as it is: the
// box lies outside the tensor and TMA fills it with zeros (the contract: such a page reads zeros).
// Pieces that start at or past the range's end are not copied. Keys past the end, before the first
// visible key and past the capacity are masked in S (-inf); their value rows may hold anything (a
// partly written page, stale stages, the zero fill), and P = 0 times a NaN is NaN in P V, so each
// consumer warp zeros its own value rows outside [lo, end) before P V (only the first and last tile
// of a range have such rows).
//
// Shared layout: Q (rows x (D + 8) elements, as the cp.async kernel), then the ring, each stage
// K then V, each [D / 64][kBlockN rows][128 bytes] with the 128-byte swizzle: the 16-byte chunk c of
// a 128-byte row r lies at chunk c ^ (r % 8), every [kBlockN][128] block 1024-byte aligned. An 8 x 8
// ldmatrix matrix reads one chunk of 8 consecutive rows: swizzled, 8 distinct chunk positions (all
// 32 banks once); an unswizzled D * 2-byte row would put the 8 rows on the same 4 banks (8-way
// conflict). The drained ring holds the warps' merge at the end; the mbarriers follow the ring.
#pragma once

#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "common/launch.cuh"
#include "common/sm90a.h"
#include "common/tma.cuh"
#include "decode/decode_config.h"
#include "decode/decode_problem.h"
#include "decode/kernels/decode_common.cuh"

namespace kernelforge {
namespace decode {

// Grid (splits, row tiles x Hkv, B), 32 (kWarps + 1) threads, decode_tma_smem_bytes(...) of dynamic
// shared memory (decode_config.h).
template <typename T, int kD, int kMBlocks, int kWarps, int kStages, int kMinCtas>
__global__ void __launch_bounds__(32 * (kWarps + 1), kMinCtas)
    decode_attention_tma_kernel(const __grid_constant__ CUtensorMap tm_k, const __grid_constant__ CUtensorMap tm_v,
                                const DecodeParams p, int splits, float* ws_o, float* ws_lse, int32_t* counters) {
#if KF_SM90A
  constexpr int kRows = 16 * kMBlocks;
  constexpr int kBlockN = 16 * kWarps;
  constexpr int kThreads = 32 * kWarps;  // consumer threads
  constexpr int kStride = kD + kDecodePad;
  constexpr int kCols64 = kD / 64;         // 64-column (128-byte) boxes per row
  constexpr int kBlock = kBlockN * 128;    // one [kBlockN][128 bytes] block, bytes
  constexpr int kHalf = kCols64 * kBlock;  // K (or V) of a stage, bytes
  constexpr int kStageBytes = 2 * kHalf;
  constexpr int kQBytes = decode_tma_q_bytes(kD, kRows);
  // Q fragments in registers for the 16-row tiles up to d128 (32 registers); at 32 rows they would not
  // fit the 168 registers a thread has at 2 x 5 warps per SM (10 warps over 4 register files: 3 per file)
  constexpr bool kQInRegs = kMBlocks == 1 && kD <= 128;
  static_assert(kD % 64 == 0 && kBlock % 1024 == 0 && kQBytes % 1024 == 0, "1024-byte aligned swizzle blocks");
  static_assert(kRows * kStride * 2 <= kQBytes, "Q tile");
  extern __shared__ uint8_t smem_raw[];
  uint8_t* smem = smem_raw + ((1024 - (smem_u32(smem_raw) & 1023)) & 1023);
  uint16_t* sq = reinterpret_cast<uint16_t*>(smem);
  uint8_t* ring = smem + kQBytes;
  constexpr int kMergeBytes = kWarps * kRows * (kD + 2) * 4;
  constexpr int kRegion = kStages * kStageBytes > kMergeBytes ? kStages * kStageBytes : kMergeBytes;
  uint64_t* full = reinterpret_cast<uint64_t*>(ring + kRegion);
  uint64_t* empty = full + kStages;
  static_assert(decode_tma_smem_bytes(kD, kRows, kWarps, kStages) ==
                    kQBytes + kRegion + kDecodeTmaBarBytes + kDecodeTmaAlignSlack,
                "decode_config.h's shared memory bytes");
  static_assert(2 * kStages * 8 <= kDecodeTmaBarBytes, "mbarriers");

  const int split = blockIdx.x;
  const int row_tiles = (p.rows + kRows - 1) / kRows;
  const int hkv = blockIdx.y / row_tiles;
  const int row_tile = blockIdx.y % row_tiles;
  const int b = blockIdx.z;
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int r_first = row_tile * kRows;
  const int rows_here = min(kRows, p.rows - r_first);

  if (tid == kThreads) {
    for (int s = 0; s < kStages; ++s) {
      mbar_init_count(&full[s], 1);
      mbar_init_count(&empty[s], kWarps);
    }
    mbar_init_fence();
    tma_prefetch_desc(&tm_k);
    tma_prefetch_desc(&tm_v);
  }
  __syncthreads();
  pdl_wait();  // q, seq_lens, the block table and the cache may be the previous kernel's output
  const KeyRange kr = key_range<kBlockN, true>(p, b, r_first, r_first + rows_here - 1, split, splits);
  const int n_tiles = (kr.end - kr.start + kBlockN - 1) / kBlockN;

  WarpRows<kD, kMBlocks> w;
  if (warp == kWarps) {
    // ---- producer: tile it goes to stage s = it % kStages; its use u = it / kStages waits for the
    // consumers' release of use u - 1 (parity (u - 1) & 1; a fresh barrier passes parity 1 at once).
    // The block-table entries of the range's pages are read 32 at a time, one per lane (coalesced),
    // a batch ahead of its use, and handed to lane 0 by shuffles. ----
    const int32_t* bt = p.block_table != nullptr ? p.block_table + b * p.bt_sb : nullptr;
    const int box_rows = bt != nullptr ? min(p.page_size, kBlockN) : kBlockN;
    const int pieces = kBlockN / box_rows;
    const int32_t page_mask = p.page_size - 1;
    const int32_t e0 = bt != nullptr ? (kr.start >> p.page_shift) : 0;  // the range's first table entry
    // Entry e0 + base + lane, or -1 where that page starts at or past the range's end.
    auto entries = [&](int32_t base) {
      const int32_t e = e0 + base + lane;
      return bt != nullptr && (int64_t(e) << p.page_shift) < kr.end ? __ldg(bt + e) : -1;
    };
    int32_t cur = entries(0), next = entries(32), cur_base = 0;
    for (int it = 0; it < n_tiles; ++it) {
      const int s = it % kStages;
      const int32_t ts = kr.start + it * kBlockN;
      if (bt != nullptr && (ts >> p.page_shift) - e0 >= cur_base + 32) {  // one batch per 32 entries
        cur = next;
        cur_base += 32;
        next = entries(cur_base + 32);
      }
      if (lane == 0) {
        mbar_wait(&empty[s], (uint32_t(it / kStages) & 1u) ^ 1u);
        const int32_t left = kr.end - ts;  // keys of the range from the tile's start
        const int live = bt != nullptr ? min(pieces, (left + box_rows - 1) / box_rows) : 1;
        mbar_expect(&full[s], uint32_t(live * box_rows * 128 * kCols64 * 2));
      }
      uint8_t* sk = ring + s * kStageBytes;
      uint8_t* sv = sk + kHalf;
      for (int i = 0; i < pieces; ++i) {
        const int32_t ks = ts + i * box_rows;  // the piece's first key
        int32_t page = b, row = ks;
        if (bt != nullptr) {
          const int32_t idx = (ks >> p.page_shift) - e0 - cur_base;  // 0 .. 39: in cur or next
          const int32_t from_cur = __shfl_sync(0xffffffffu, cur, idx & 31);
          const int32_t from_next = __shfl_sync(0xffffffffu, next, idx & 31);
          page = idx < 32 ? from_cur : from_next;
          row = ks & page_mask;
        }
        if (lane == 0 && ks < kr.end) {
#pragma unroll
          for (int c = 0; c < kCols64; ++c) {
            const int off = c * kBlock + i * box_rows * 128;
            tma_load_4d(sk + off, &tm_k, &full[s], c * 64, row, hkv, page);
            tma_load_4d(sv + off, &tm_v, &full[s], c * 64, row, hkv, page);
          }
        }
      }
      __syncwarp();
    }
  } else {
    // ---- consumers ----
    load_q_tile<kD, kRows, kThreads>(p, sq, b, hkv, r_first, rows_here, tid);
    init_rows(w, p, kr, r_first, rows_here, lane);
    named_sync(1, kThreads);  // the Q tile is stored
    QFrags<kD, kMBlocks, kQInRegs> qf;
    if constexpr (kQInRegs) load_q_frags<kD, kMBlocks, kQInRegs>(qf, sq, lane);
    const LogitScale ls = logit_scale(p);
    const int kw = warp * 16;  // this warp's 16 keys of each stage
    // ldmatrix lanes (decode_common.cuh's warp_tile): K row kw + lane % 8 + 8 (lane / 16), chunk
    // 2 kk + (lane / 8) % 2; V row kw + lane % 16, chunk 2 nd + lane / 16; every row's r % 8 is lane % 8.
    // The stage, its 1024-byte blocks and the 128-byte rows leave address bits 4-6 to the chunk, so the
    // swizzle is one XOR of the unswizzled address with (r % 8) << 4 (no per-chunk offsets to keep).
    const uint32_t swz = uint32_t(lane % 8) << 4;
    const uint32_t k_row = uint32_t(kw + lane % 8 + 8 * (lane / 16)) * 128 + uint32_t((lane / 8) % 2) * 16;
    const uint32_t v_row = uint32_t(kw + lane % 16) * 128 + uint32_t(lane / 16) * 16;
    for (int it = 0; it < n_tiles; ++it) {
      const int s = it % kStages;
      mbar_wait(&full[s], uint32_t(it / kStages) & 1u);
      const uint32_t sk = smem_u32(ring) + uint32_t(s * kStageBytes), sv = sk + kHalf;
      const int32_t jw = kr.start + it * kBlockN + kw;  // this warp's first key
      if (jw < kr.lo || jw + 16 > kr.end) {
        // zero the value rows of keys outside [lo, end): lane % 16 is the row, lane / 16 the half of
        // its 16-byte chunks
        const int r = lane % 16;
        if (jw + r < kr.lo || jw + r >= kr.end) {
          uint8_t* row = ring + s * kStageBytes + kHalf + (kw + r) * 128;
#pragma unroll
          for (int c = 0; c < kCols64 * 4; ++c) {
            const int chunk = 2 * c + lane / 16;  // 0 .. 8 kCols64 - 1
            *reinterpret_cast<uint4*>(row + (chunk / 8) * kBlock + (chunk % 8) * 16) = make_uint4(0u, 0u, 0u, 0u);
          }
        }
        fence_proxy_async();  // the async proxy's next copy into the stage follows these stores
        __syncwarp();
      }
      warp_tile<T, kD, kMBlocks, kQInRegs>(
          w, qf, sq, [&](int kk) { return (sk + k_row + uint32_t((kk / 4) * kBlock + (kk % 4) * 32)) ^ swz; },
          [&](int nd) { return (sv + v_row + uint32_t((nd / 4) * kBlock + (nd % 4) * 32)) ^ swz; }, jw, kr.end, ls,
          lane);
      __syncwarp();
      if (lane == 0) mbar_arrive(&empty[s]);
    }
  }
  pdl_trigger();
  // Every copy the producer issued has landed and been read (the consumers waited on each stage):
  // the ring is drained and holds the merge.
  finish_cta<T, kD, kMBlocks, kWarps>(w, p, splits, ws_o, ws_lse, counters, reinterpret_cast<float*>(ring), b, hkv,
                                      split, row_tiles, r_first, rows_here, tid);
#else
  // Not sm_90a (an sm_80 image, or sm_90 without the "a"): the launcher never runs this; a build whose
  // only sm_90 code lacks the "a" would report binary version 90, so fail loudly rather than skip out.
  (void)tm_k, (void)tm_v, (void)p, (void)splits, (void)ws_o, (void)ws_lse, (void)counters;
#if defined(__CUDA_ARCH__)
  __trap();
#endif
#endif
}

}  // namespace decode
}  // namespace kernelforge
