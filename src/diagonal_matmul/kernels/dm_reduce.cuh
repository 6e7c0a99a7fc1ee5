// diagonal_matmul backward, broadcast a: da[m] = T(Σ_batch s[batch · M + m]) over the float32 row
// sums s [B, M] that dm_bwd wrote.
// Minimum traffic: read s (4 · B · M bytes), write da (M · sizeof(T)): small beside dm_bwd's 3·B·M·N
// elements (N >= 4 makes it under a tenth of them).
// Layout: one warp per row m of a (grid-stride over the rows): lane l adds batches l, l + 32, ... in
// order, then a butterfly over the lanes; the summation order is fixed, so da is bit-identical run
// to run. B == 0 writes zeros.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "common/launch.cuh"
#include "common/vec.cuh"
#include "diagonal_matmul/diagonal_matmul_plan.h"
#include "diagonal_matmul/diagonal_matmul_problem.h"

namespace kernelforge {

template <typename T>
__global__ void __launch_bounds__(kDmThreads) dm_reduce(const DmParams p) {
  if constexpr (!arch_supports<T>()) {
    __trap();
  } else {
    pdl_wait();  // dm_bwd's row sums are complete and visible after this
    if (p.trigger) pdl_trigger();
    const int lane = int(threadIdx.x) & 31;
    const int64_t warps = int64_t(gridDim.x) * (blockDim.x >> 5);
    for (int64_t m = int64_t(blockIdx.x) * (blockDim.x >> 5) + (threadIdx.x >> 5); m < p.a_rows; m += warps) {
      float s = 0.f;
      for (int64_t k = lane; k < p.batches; k += 32) s += p.da_rows[k * p.a_rows + m];
      for (int off = 16; off > 0; off >>= 1) s += __shfl_xor_sync(0xffffffffu, s, off);
      if (lane == 0) static_cast<T*>(p.da)[m * p.da_stride] = from_float<T>(s);
    }
  }
}

}  // namespace kernelforge
