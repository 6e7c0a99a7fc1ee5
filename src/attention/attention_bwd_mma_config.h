// The compiled tiles and the shared-memory footprint of the mma attention backward kernel
// (kernels/attention_bwd_mma.cuh), shared by its launcher and the planner (host code) so that the
// instantiations and the plans agree.
//
// Shared memory (elements of T, 2 bytes, every row padded by kAttnMmaPad elements as in the forward:
// ldmatrix phases free of bank conflicts): the block's K [block_n][Dqk] and V [block_n][Dv] tiles,
// then `stages` buffers of one query tile (Q [block_m][Dqk], dO [block_m][Dv], and float32 rows
// lse * log2(e) and D [block_m]), then P^T and dS^T [block_n][block_m] (T, the A operands of
// dV += P^T dO, dK += dS^T Q and, transposed by ldmatrix, of dQ = dS K).
#pragma once

#include <cstdint>

#include "attention/attention_fwd_mma_config.h"

namespace kernelforge {

constexpr int64_t attention_bwd_mma_smem_bytes(int head_dim_qk, int head_dim_v, int block_m, int block_n, int stages) {
  const int64_t kv = int64_t(block_n) * ((head_dim_qk + kAttnMmaPad) + (head_dim_v + kAttnMmaPad)) * 2;
  const int64_t stage =
      int64_t(block_m) * ((head_dim_qk + kAttnMmaPad) + (head_dim_v + kAttnMmaPad)) * 2 + 2 * int64_t(block_m) * 4;
  const int64_t p_ds = 2 * int64_t(block_n) * (block_m + kAttnMmaPad) * 2;
  return kv + int64_t(stages) * stage + p_ds;
}

// One instantiation per (dtype, row). Every warp owns 16 key rows of S^T = K Q^T (block_n / 16 warp
// rows; the warps left over split the query columns) and a share of the block's dK, dV accumulators
// (float32, block_n * (Dqk + Dv) / threads registers per thread, kept across the whole key block).
// Registers per thread, roughly: that share + 2 * block_n * block_m / threads (S^T and dP^T).
struct AttnBwdTile {
  int head_dim_qk;
  int head_dim_v;
  int block_m;  // query rows per inner step
  int block_n;  // key rows per block
  int warps;
  int stages;  // query-tile (Q, dO) pipeline stages
};
constexpr AttnBwdTile kAttnBwdTiles[] = {
    // d64: 64 x 128 keys, 8 warps (109 KB): Q and dO are re-read once per 128 keys; 64 x 64, 4 warps
    // (73 KB) for 99 KB devices and calls with few key tiles. 64 + 64 accumulators per thread.
    {64, 64, 64, 128, 8, 2},
    {64, 64, 64, 64, 4, 2},
    // d96: 64 x 64, 4 warps (97 KB, fits every sm_8x / sm_9x device).
    {96, 96, 64, 64, 4, 2},
    // d128: 64 x 128 keys, 8 warps (173 KB, sm_90); 64 x 64, 4 warps (121 KB, A100): 128
    // accumulators + 64 (S^T, dP^T); 32 x 64, 8 warps (79 KB, 99 KB devices; two warps per key row
    // tile split the head dims: 64 accumulators + 16).
    {128, 128, 64, 128, 8, 2},
    {128, 128, 64, 64, 4, 2},
    {128, 128, 32, 64, 8, 2},
    // d192/128 (MLA): 32 x 64, 8 warps (95 KB): 80 accumulators per thread (two warps per key row
    // tile split the head dims).
    {192, 128, 32, 64, 8, 2},
    // d256: 32 x 64, 8 warps (143 KB), and 32 x 32, 4 warps with one query stage (71 KB, 99 KB
    // devices); 128 accumulators per thread in both.
    {256, 256, 32, 64, 8, 2},
    {256, 256, 32, 32, 4, 1},
};
constexpr int kAttnBwdTileCount = int(sizeof(kAttnBwdTiles) / sizeof(kAttnBwdTiles[0]));

}  // namespace kernelforge
