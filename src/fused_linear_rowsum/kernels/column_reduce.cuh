// Chunk reduction: out[k] = sum_{c < chunks} partial[c, k] for k < K, tail = sum_c partial[c, K], in
// chunk order 0, 1, ... (fixed: bit-identical run to run).
//   forward:  out = w_sum (the float32 output kept for the backward), tail = b_sum (workspace)
//   backward: out = g (workspace), tail = sum_t dy[t] (workspace)
// Traffic: chunks * (K + 1) * 4 bytes read (at most 128 x 16 KB = 2 MB at K = 4096, mostly from L2),
// K + 1 floats written: a few microseconds, nothing next to the passes around it.
// Layout: block (32 columns, 8 chunk lanes); lane ty adds chunks ty, ty + 8, ... (at most 16 with
// kFlrsMaxChunks), then thread row 0 adds the 8 lanes in order.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "common/launch.cuh"
#include "fused_linear_rowsum/fused_linear_rowsum_plan.h"

namespace kernelforge {

// T is not used by the math: it gives each dtype's file (fused_linear_rowsum_<dtype>.cu) its own instance.
template <typename T>
__global__ void __launch_bounds__(kFlrsReduceTx* kFlrsReduceTy)
    column_reduce(const float* __restrict__ partials, int chunks, int64_t k, float* __restrict__ out,
                  float* __restrict__ tail) {
  // Trigger first: row_dot / broadcast_rows may launch at once and prefetch their inputs (x is
  // complete: see row_dot.cuh); their pdl_wait still waits for this grid, which finishes only after
  // its own pdl_wait (column_partials complete). Its 1-2 blocks per SM all fit beside them.
  pdl_trigger();
  pdl_wait();
  __shared__ float lane[kFlrsReduceTy][kFlrsReduceTx];
  const int64_t col = int64_t(blockIdx.x) * kFlrsReduceTx + threadIdx.x;
  float sum = 0.f;
  if (col <= k)
    for (int c = threadIdx.y; c < chunks; c += kFlrsReduceTy) sum += partials[int64_t(c) * (k + 1) + col];
  lane[threadIdx.y][threadIdx.x] = sum;
  __syncthreads();
  if (threadIdx.y != 0 || col > k) return;
  float total = 0.f;
#pragma unroll
  for (int y = 0; y < kFlrsReduceTy; ++y) total += lane[y][threadIdx.x];
  if (col < k)
    out[col] = total;
  else
    *tail = total;
}

}  // namespace kernelforge
