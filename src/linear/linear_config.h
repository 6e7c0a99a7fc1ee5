// The compiled tile of the skinny linear kernel (kernels/linear_skinny.cuh), shared by the launcher
// and the planner. Shared memory per stage: the x tile (16 rows, padded) and the w tile (block_n
// rows); rows padded by 8 elements (16 bytes) for conflict-free ldmatrix.
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

constexpr int64_t linear_smem_bytes(const LinearTile& c) {
  return int64_t(c.stages) * (16 + c.block_n) * (c.block_k + kLinearPad) * 2;
}

}  // namespace kernelforge
