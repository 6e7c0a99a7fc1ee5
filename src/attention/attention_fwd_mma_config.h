// The compiled tiles and the shared-memory footprint of the mma attention kernel
// (kernels/attention_fwd_mma.cuh), shared by the kernel's launcher and the planner (host code) so
// that the instantiations and the plans agree.
//
// Layout (elements of T, 2 bytes): the Q tile, then 2 pipeline stages of (K tile, V tile). Every
// shared row is padded by kAttnMmaPad elements: a row of D + 8 elements is D / 2 + 4 words, so the
// 8 rows that one ldmatrix phase reads (same 16-byte column) start at 8 distinct 4-bank groups
// (4 * r mod 32 for r = 0..7) and the reads are free of bank conflicts for every head dim,
// including 96 and 192 whose rows are not a multiple of 8 chunks (an XOR swizzle needs that).
#pragma once

#include <cstdint>

namespace kernelforge {

constexpr int kAttnMmaPad = 8;        // elements of padding per shared row (16 bytes)
constexpr int kAttnMmaStages = 2;     // K/V pipeline stages
constexpr int kAttnMmaWarpRows = 16;  // query rows per warp (one m16 tile)

constexpr int64_t attention_mma_smem_bytes(int head_dim_qk, int head_dim_v, int block_m, int block_n) {
  return 2 * (int64_t(block_m) * (head_dim_qk + kAttnMmaPad) +
              int64_t(kAttnMmaStages) * block_n * ((head_dim_qk + kAttnMmaPad) + (head_dim_v + kAttnMmaPad)));
}

// One instantiation per (dtype, row): block_m = 16 * warps (one m16 tile of rows per warp).
// Shared memory below: attention_mma_smem_bytes.
struct AttnMmaTile {
  int head_dim_qk;
  int head_dim_v;
  int block_n;
  int warps;
};
constexpr AttnMmaTile kAttnMmaTiles[] = {
    // d64, d96, d128: 128 x 64 with 8 warps halves the K/V re-reads of 64-row tiles (54 / 78 /
    // 102 KB); 64 x 64 with 4 warps (46 / 65 / 85 KB) fits 99 KB devices at d128 and gives twice the
    // blocks when a call has too few query tiles to fill the SMs.
    {64, 64, 64, 8},
    {64, 64, 64, 4},
    {96, 96, 64, 8},
    {96, 96, 64, 4},
    {128, 128, 64, 8},
    {128, 128, 64, 4},
    // d192/128 (MLA prefill): 128 x 32 (92 KB, fits every sm_8x/sm_9x device) and 64 x 64 (109 KB).
    {192, 128, 32, 8},
    {192, 128, 64, 4},
    // d256: 64 x 32 (99 KB, the sm_86/89 limit) with Q fragments read from shared memory (the 128-float
    // output accumulator leaves no registers for them); 128 x 32 with 8 warps (132 KB).
    {256, 256, 32, 4},
    {256, 256, 32, 8},
};
constexpr int kAttnMmaTileCount = int(sizeof(kAttnMmaTiles) / sizeof(kAttnMmaTiles[0]));

}  // namespace kernelforge
