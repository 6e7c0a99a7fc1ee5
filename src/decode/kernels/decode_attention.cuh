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
// counter (decode_common.cuh's finish_cta, shared with the TMA kernel). No second launch: at batch 1 the merge kernel's
// launch and its read of the partials sat on the critical path after the slowest split. The merge reads splits * (D +
// 1) * 4 bytes per row from L2 (the partials were just written) in one CTA per (sequence, kv head): at 32 splits and 4
// rows of d128, 66 KB.
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
    const int r_first = row_tile * kRows;
    const int rows_here = min(kRows, p.rows - r_first);

    pdl_wait();
    const KeyRange kr = key_range<kBlockN>(p, b, r_first, r_first + rows_here - 1, split, splits);
    load_q_tile<kD, kRows, kThreads>(p, sq, b, hkv, r_first, rows_here, tid);

    // ---- K/V loads: thread copies column chunk cc of rows r0, r0 + kRowStep, ... of each tile ----
    const int r0 = tid / kChunks, cc = tid % kChunks;
    const KvCopies<kLoadRows, kRowStep> copies(p, hkv, cc, b, r0, true);
    auto fetch = [&](int32_t tile_start, int32_t(&pg)[kLoadRows]) { copies.fetch(p, tile_start, kr.end, pg); };
    auto load = [&](int32_t tile_start, int stage, const int32_t(&pg)[kLoadRows]) {
      uint16_t* sk = skv + stage * 2 * kBlockN * kStride + cc * 8;
      copies.template load<kStride>(p, tile_start, sk, sk + kBlockN * kStride, pg);
    };
    const int n_tiles = (kr.end - kr.start + kBlockN - 1) / kBlockN;
    int32_t pages[kLoadRows];  // the pages of the next tile to copy
    ring_prologue<kStages, kBlockN>(kr.start, n_tiles, fetch, load, pages);

    WarpRows<kD, kMBlocks> w;
    init_rows(w, p, kr, r_first, rows_here, lane);
    QFrags<kD, kMBlocks, kQInRegs> qf;
    const LogitScale ls = logit_scale(p);

    for (int it = 0; it < n_tiles; ++it) {
      ring_step<kStages, kBlockN>(it, kr.start, n_tiles, fetch, load, pages);
      if (kQInRegs && it == 0) load_q_frags<kD, kMBlocks, kQInRegs>(qf, sq, lane);
      const uint16_t* sk = skv + (it % kStages) * 2 * kBlockN * kStride;
      const uint16_t* sv = sk + kBlockN * kStride;
      const int kw = warp * 16;  // this warp's 16 keys of the tile
      warp_tile<T, kD, kMBlocks, kQInRegs>(
          w, qf, sq,
          [&](int kk) {
            return smem_addr(sk + (kw + lane % 8 + 8 * (lane / 16)) * kStride + kk * 16 + 8 * ((lane / 8) % 2));
          },
          [&](int nd) { return smem_addr(sv + (kw + lane % 16) * kStride + nd * 16 + 8 * (lane / 16)); },
          kr.start + it * kBlockN + kw, kr.end, ls, lane);
      __syncthreads();  // the stage is refilled by the next iteration's load
    }
    cp_async_wait<0>();
    pdl_trigger();
    finish_cta<T, kD, kMBlocks, kWarps>(w, p, splits, ws_o, ws_lse, counters, reinterpret_cast<float*>(skv), b, hkv,
                                        split, row_tiles, r_first, rows_here, tid);
#endif
  }
}

}  // namespace decode
}  // namespace kernelforge
