// Cross-entropy forward, step 2 of 3: per-row loss. One thread per row combines the row's segment
// partials into lse = ln 2 * (m + log2 s), reads the target logit (one scalar load) and writes
//   row_loss = lse - (1 - eps) z_t - eps / N * sum z + z_loss * lse^2  (0 for an ignored row; N = V and
//   z_t always read unless the logits are a vocabulary shard)
// and lse; each block writes (sum of its row losses, its valid rows) to the workspace.
// Minimum traffic: 16 bytes per segment read, 8 bytes per row written; one logit per row.
// Why: the per-row step of every forward plan; a target out of range makes the row NaN (no host sync).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "common/launch.cuh"
#include "common/vec.cuh"
#include "cross_entropy/cross_entropy_plan.h"
#include "cross_entropy/cross_entropy_problem.h"
#include "cross_entropy/kernels/common.cuh"

namespace kernelforge {

// A NaN logit makes the row's max/sum NaN and so its loss, as in PyTorch.
template <typename T, bool kSoftcap>
__global__ void __launch_bounds__(kCeFinalizeBlock)
    ce_fwd_finalize(const CeParams p, const int segs, const float4* part, float2* block_part) {
  if constexpr (!arch_supports<T>()) {
    __trap();
  } else {
    pdl_wait();
    const int64_t i = int64_t(blockIdx.x) * kCeFinalizeBlock + threadIdx.x;
    float loss = 0.f, valid = 0.f;
    if (i < p.rows) {
      float m = -INFINITY, s = 0.f, sz = 0.f;
      for (int k = 0; k < segs; ++k) {  // a NaN logit makes s (and so lse and the loss) NaN
        const float4 q = part[i * segs + k];
        sz += q.z;
        ms_combine(m, s, q.x, q.y);
      }
      float lse = (m + __log2f(s)) * kLn2;  // log sum exp(z) = ln2 * (m + log2 s)
      const int64_t t = ce_target(p, i);
      if (t != p.ignore_index) {
        valid = 1.f;
        const int64_t tl = t - p.class_start;  // the target's column in this (shard of the) vocabulary
        if (t < 0 || t >= p.classes) {         // no defined loss: a NaN row (documented device-side check)
          loss = lse = NAN;
        } else {
          const T* x = static_cast<const T*>(p.logits) + i * p.ld;
          const float zt = (tl >= 0 && tl < p.vocab)
                               ? ce_cap<kSoftcap>(to_float(x[tl]), p.softcap, kSoftcap ? 1.f / p.softcap : 0.f)
                               : 0.f;
          loss = lse - (1.f - p.smoothing) * zt;
          if (p.smoothing > 0.f) loss -= p.smoothing / float(p.classes) * sz;
          if (p.z_loss > 0.f) loss += p.z_loss * lse * lse;
        }
      }
      p.row_loss[i] = loss;
      p.lse_out[i] = lse;
    }
    // Block sums of (loss, valid) in a fixed order: deterministic.
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
      loss += __shfl_xor_sync(0xffffffffu, loss, o);
      valid += __shfl_xor_sync(0xffffffffu, valid, o);
    }
    __shared__ float2 warp_part[kCeFinalizeBlock / 32];
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    if (lane == 0) warp_part[warp] = make_float2(loss, valid);
    __syncthreads();
    if (threadIdx.x == 0) {
      float2 b = make_float2(0.f, 0.f);
      for (int w = 0; w < kCeFinalizeBlock / 32; ++w) b.x += warp_part[w].x, b.y += warp_part[w].y;
      block_part[blockIdx.x] = b;
    }
  }
}

}  // namespace kernelforge
