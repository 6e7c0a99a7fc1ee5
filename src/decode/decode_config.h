// The compiled tiles of the decode attention kernels (kernels/decode_attention.cuh: cp.async,
// kernels/decode_attention_tma.cuh: TMA, kernels/decode_attention_heads.cuh: head group) and their
// shared memory, shared by the launchers and the planner so that the instantiations and the plans agree.
//
// Shared memory, cp.async (elements of T unless said): the Q tile (rows x (D + pad)), then either the
// K/V ring (stages x 2 x block_n x (D + pad)) during the key loop, or the warps' float32 partial
// outputs and their (max, sum) at the end. Rows are padded by 8 elements (16 bytes): conflict-free
// ldmatrix, as in the mma attention kernels.
// TMA (bytes): the Q tile rounded up to 1024, the ring (stages x 2 x block_n x D x 2, unpadded rows
// in the 128-byte swizzle, 1024-byte aligned) or the merge, the full / empty mbarriers (128), and
// 1024 for rounding the dynamic shared memory base up to 1024.
#pragma once

#include <cstdint>

#include "kernelforge/decode.h"

namespace kernelforge {

constexpr int kDecodePad = 8;

// What a tile is for; the planner (decode_plan.cpp) picks the use from the shape, then the row.
enum class DecodeTileUse {
  kDefault,    // every head dim and shape
  kSmallGrid,  // few (sequence, kv head) pairs for the SMs: fewer, longer CTAs, twice the keys per stage
  kPage1,      // page size 1: a smaller ring, three CTAs per SM, more rows in flight per SM (cp.async);
               // a head group's whole token rows (kHeadGroup, while kDecodeHeadGroupByDefault is set)
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
  DecodeKernel kernel = DecodeKernel::kCpAsync;  // kTma: `warps` consumer warps + 1 producer warp;
                                                 // kHeadGroup: `warps` kv heads per CTA, a warp each
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
    // TMA (sm_90a, page size >= 16 or contiguous): 64-key stages (128 keys for the small grid), as many
    // as 2 CTAs per SM hold, or 1 CTA with a 192 KB ring where the registers do not allow 2: 2 x 5
    // warps per SM leave 168 registers per thread (3 warps on one of the 4 register files), and the
    // d128 32-row tile needs more (128 float32 accumulators per thread). Not yet measured: the stage
    // counts are the shared memory's limit, the warps the cp.async kernel's measured best per shape.
    {64, 16, 4, 6, 2, DecodeTileUse::kDefault, DecodeKernel::kTma},     // 100 KB
    {64, 32, 4, 6, 2, DecodeTileUse::kDefault, DecodeKernel::kTma},     // 102 KB
    {128, 16, 4, 3, 2, DecodeTileUse::kDefault, DecodeKernel::kTma},    // 102 KB
    {128, 32, 4, 6, 1, DecodeTileUse::kDefault, DecodeKernel::kTma},    // 202 KB
    {128, 16, 8, 3, 1, DecodeTileUse::kSmallGrid, DecodeKernel::kTma},  // 198 KB
    {256, 16, 4, 3, 1, DecodeTileUse::kDefault, DecodeKernel::kTma},    // 202 KB
    // Head group (kernels/decode_attention_heads.cuh): `warps` kv heads per CTA, one warp each, 16 keys
    // of every head per stage; rows 16 (group * Lq <= 16). Shared memory: Q 16 rows per head, then the
    // ring. One CTA per SM (the 8-head tiles' 256 threads; 4 heads at 3 stages also leave room for one).
    // Chosen only while kDecodeHeadGroupByDefault is set: slower than the cp.async page-1 tile.
    {128, 16, 8, 2, 1, DecodeTileUse::kPage1, DecodeKernel::kHeadGroup},  // 170 KB: 64 KB per stage
    {128, 16, 4, 3, 1, DecodeTileUse::kPage1, DecodeKernel::kHeadGroup},  // 119 KB: 32 KB per stage
    {64, 16, 8, 3, 1, DecodeTileUse::kPage1, DecodeKernel::kHeadGroup},   // 126 KB: 32 KB per stage
};
constexpr int kDecodeTileCount = int(sizeof(kDecodeTiles) / sizeof(kDecodeTiles[0]));

constexpr int64_t decode_smem_bytes(int head_dim, int rows, int warps, int stages) {
  const int64_t q = int64_t(rows) * (head_dim + kDecodePad) * 2;
  const int64_t ring = int64_t(stages) * 2 * (16 * warps) * (head_dim + kDecodePad) * 2;
  const int64_t merge = int64_t(warps) * rows * (head_dim + 2) * 4;
  return q + (ring > merge ? ring : merge);
}

constexpr int kDecodeTmaBarBytes = 128;     // full[stages] and empty[stages] mbarriers, stages <= 8
constexpr int kDecodeTmaAlignSlack = 1024;  // the dynamic shared memory base rounded up to 1024 bytes
constexpr int decode_tma_q_bytes(int head_dim, int rows) {
  return (rows * (head_dim + kDecodePad) * 2 + 1023) / 1024 * 1024;
}
constexpr int64_t decode_tma_smem_bytes(int head_dim, int rows, int warps, int stages) {
  const int64_t ring = int64_t(stages) * 2 * (16 * warps) * head_dim * 2;
  const int64_t merge = int64_t(warps) * rows * (head_dim + 2) * 4;
  return decode_tma_q_bytes(head_dim, rows) + (ring > merge ? ring : merge) + kDecodeTmaBarBytes + kDecodeTmaAlignSlack;
}
// Head group (elements of T): Q (heads x 16 rows x (D + pad)), then the ring (stages x 2 x heads x 16
// keys x (D + pad)); no merge area (each warp finishes its own rows).
constexpr int64_t decode_heads_smem_bytes(int head_dim, int heads, int stages) {
  const int64_t q = int64_t(heads) * 16 * (head_dim + kDecodePad) * 2;
  return q + int64_t(stages) * 2 * heads * 16 * (head_dim + kDecodePad) * 2;
}
constexpr int64_t decode_tile_smem_bytes(const DecodeTile& c) {
  return c.kernel == DecodeKernel::kTma         ? decode_tma_smem_bytes(c.head_dim, c.rows, c.warps, c.stages)
         : c.kernel == DecodeKernel::kHeadGroup ? decode_heads_smem_bytes(c.head_dim, c.warps, c.stages)
                                                : decode_smem_bytes(c.head_dim, c.rows, c.warps, c.stages);
}
// Keys per pipeline stage of a tile: 16 per warp, or 16 for every head of a head-group tile.
constexpr int decode_tile_block_n(const DecodeTile& c) {
  return c.kernel == DecodeKernel::kHeadGroup ? 16 : 16 * c.warps;
}

}  // namespace kernelforge
