// The compiled tiles of the skinny linear kernels (kernels/linear_skinny.cuh, kernels/linear_skinny_tma.cuh),
// shared by the launchers and the planner. Shared memory per stage: the x tile (16 rows) and the w
// tile (block_n rows).
#pragma once

#include <cstdint>

namespace kernelforge {

constexpr int kLinearPad = 8;

struct LinearTile {
  int block_n;  // 32 output columns per warp
  int block_k;
  int warps;
  int stages;
};
// 128 x 64 with 4 stages: 16 KB of weight per stage, 83 KB per CTA, two CTAs per SM keep ~100 KB of
// weight loads in flight per SM.
constexpr LinearTile kLinearTile = {128, 64, 4, 4};

// cp.async: rows padded by 8 elements (16 bytes) for conflict-free ldmatrix.
constexpr int64_t linear_smem_bytes(const LinearTile& c) {
  return int64_t(c.stages) * (16 + c.block_n) * (c.block_k + kLinearPad) * 2;
}

// TMA: 128 x 64 with 6 stages and one producer warp. A stage is the w tile (128 rows of 128 bytes,
// 16 KB) and the x tile (16 rows, 2 KB), both in the 128-byte swizzle, 1024-byte aligned: 108 KB of
// ring, 2 CTAs per SM (2 x 109 KB of the 228 KB) keep up to 192 KB of weight copies in flight per
// SM. The K splits of a column block run as one cluster (at most 8 CTAs, the portable size) and
// reduce through distributed shared memory.
constexpr LinearTile kLinearTmaTile = {128, 64, 4, 6};
constexpr int kLinearTmaMaxSplits = 8;
constexpr int kLinearTmaStageBytes = (128 + 16) * 64 * 2;
constexpr int kLinearTmaBarBytes = 128;     // full[stages] and empty[stages] mbarriers
constexpr int kLinearTmaAlignSlack = 1024;  // the dynamic shared memory base rounded up to 1024 bytes
constexpr int64_t linear_tma_smem_bytes() {
  return int64_t(kLinearTmaTile.stages) * kLinearTmaStageBytes + kLinearTmaBarBytes + kLinearTmaAlignSlack;
}
static_assert(kLinearTmaStageBytes == (kLinearTmaTile.block_n + 16) * kLinearTmaTile.block_k * 2, "stage bytes");
static_assert(kLinearTmaStageBytes % 1024 == 0, "the 128-byte swizzle repeats every 1024 bytes");
static_assert(2 * kLinearTmaTile.stages * 8 <= kLinearTmaBarBytes, "barriers");

// GEMV (kernels/linear_gemv.cuh): 4 output columns per CTA of 4 warps, 2 chunks of 16 bytes per row per
// thread per round: 8 independent 16-byte weight loads a thread, 2048 columns of K a round.
struct LinearGemvTile {
  int rows;    // output columns (W rows) per CTA
  int warps;   // K is spread over all 32 * warps threads
  int unroll;  // 16-byte chunks of each row a thread loads per round
};
constexpr LinearGemvTile kLinearGemvTile = {4, 4, 2};
constexpr int linear_gemv_k_round(const LinearGemvTile& c) { return 8 * 32 * c.warps * c.unroll; }

}  // namespace kernelforge
