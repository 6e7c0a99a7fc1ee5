// Cross-entropy forward, step 3 of 3: loss = sum (or mean over valid rows) of the row losses, by one
// block over the finalize blocks' partials in a fixed order: deterministic, no atomics.
// Minimum traffic: 8 bytes per finalize block. Why: the reduction of every forward plan (it runs for
// zero rows too: loss = 0 / 0 = NaN for the mean, as PyTorch).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "common/launch.cuh"
#include "common/vec.cuh"
#include "cross_entropy/cross_entropy_plan.h"
#include "cross_entropy/cross_entropy_problem.h"
#include "cross_entropy/kernels/common.cuh"

namespace kernelforge {

constexpr int kCeReduceThreads = 512;
template <typename T>  // T: one instantiation per dtype file (the kernel itself does not read logits)
__global__ void __launch_bounds__(kCeReduceThreads)
    ce_reduce(const CeParams p, const float2* block_part, const int nblocks) {
  pdl_wait();
  float loss = 0.f, valid = 0.f;
  for (int b = threadIdx.x; b < nblocks; b += kCeReduceThreads) loss += block_part[b].x, valid += block_part[b].y;
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    loss += __shfl_xor_sync(0xffffffffu, loss, o);
    valid += __shfl_xor_sync(0xffffffffu, valid, o);
  }
  __shared__ float2 warp_part[kCeReduceThreads / 32];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane == 0) warp_part[warp] = make_float2(loss, valid);
  __syncthreads();
  if (threadIdx.x == 0) {
    float2 t = make_float2(0.f, 0.f);
    for (int w = 0; w < kCeReduceThreads / 32; ++w) t.x += warp_part[w].x, t.y += warp_part[w].y;
    *p.valid_out = t.y;
    if (p.reduction == Reduction::kMean)
      *p.loss = t.x / t.y;  // 0 / 0 = NaN when every row is ignored, as PyTorch
    else if (p.reduction == Reduction::kSum)
      *p.loss = t.x;
  }
}

}  // namespace kernelforge
