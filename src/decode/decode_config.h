// The compiled tiles of the decode attention kernel (kernels/decode_attention.cuh) and their shared
// memory, shared by the launcher and the planner so that the instantiations and the plans agree.
//
// Shared memory (elements of T unless said): the Q tile (rows x (D + pad)), then either the K/V ring
// (stages x 2 x block_n x (D + pad)) during the key loop, or the warps' float32 partial outputs and
// their (max, sum) at the end. Rows are padded by 8 elements (16 bytes): conflict-free ldmatrix, as in
// the mma attention kernels.
#pragma once

#include <cstdint>

namespace kernelforge {

constexpr int kDecodePad = 8;

// What a tile is for; the planner (decode_plan.cpp) picks the use from the shape, then the row.
enum class DecodeTileUse {
  kDefault,    // every head dim and shape
  kSmallGrid,  // few (sequence, kv head) pairs for the SMs: fewer, longer CTAs, twice the keys per stage
  kPage1,      // page size 1: a smaller ring, three CTAs per SM, more rows in flight per SM
};

struct DecodeTile {
  int head_dim;
  int rows;    // query rows per CTA: 16 (group * Lq <= 16) or 32
  int warps;   // 16 keys per warp per stage: block_n = 16 * warps
  int stages;  // cp.async ring depth
  // CTAs per SM that the registers allow: the kernel's __launch_bounds__ minimum (65536 / (32 * warps
  // * ctas_per_sm) registers per thread, at most 255), and the planner's count of resident CTAs with
  // the shared-memory limit
  int ctas_per_sm;
  DecodeTileUse use;
};
constexpr DecodeTile kDecodeTiles[] = {
    // 64 keys per stage; the ring holds 2 stages in flight while one is consumed. The stage count
    // keeps about 32-48 KB of K/V loads in flight per CTA at two CTAs per SM.
    {64, 16, 4, 4, 2, DecodeTileUse::kDefault},
    {64, 32, 4, 4, 2, DecodeTileUse::kDefault},
    {128, 16, 4, 3, 2, DecodeTileUse::kDefault},
    {128, 32, 4, 3, 2, DecodeTileUse::kDefault},
    // d128, 16 rows: 128 keys per stage, 2 stages (140 KB, one CTA per SM, 64 KB of loads in flight)
    {128, 16, 8, 2, 1, DecodeTileUse::kSmallGrid},
    // d128, 16 rows: 64 keys per stage, 2 stages (72 KB, three CTAs per SM at <= 168 registers)
    {128, 16, 4, 2, 3, DecodeTileUse::kPage1},
    // d256: one m16 tile only (the 128-float output accumulator per thread), Q read from shared memory
    {256, 16, 4, 2, 2, DecodeTileUse::kDefault},
};
constexpr int kDecodeTileCount = int(sizeof(kDecodeTiles) / sizeof(kDecodeTiles[0]));

constexpr int64_t decode_smem_bytes(int head_dim, int rows, int warps, int stages) {
  const int64_t q = int64_t(rows) * (head_dim + kDecodePad) * 2;
  const int64_t ring = int64_t(stages) * 2 * (16 * warps) * (head_dim + kDecodePad) * 2;
  const int64_t merge = int64_t(warps) * rows * (head_dim + 2) * 4;
  return q + (ring > merge ? ring : merge);
}

}  // namespace kernelforge
