// Activation forward: y[r, c] = T(act(a[r, c]) * b[r, c]) (gated: SwiGLU, GeGLU) or T(act(a[r, c]))
// (GELU), over rows of n columns (formulas in include/kernelforge/activation.h).
// Minimum traffic: read a, b, write y: 3 * M * n * sizeof(T) bytes (ungated 2 * M * n);
// M = 16384, n = 4096 bf16: 403 MB -> 134 us at the H100's 3.0 TB/s copy rate.
// Why: the one forward kernel of every activation op; every plan of a forward call runs it (the
// plan picks the vector width kVec, the vectors per thread and the grid, activation_plan.cpp).
// Layout: block (tx, ty) = tx threads along a row, ty rows; grid (column chunks, row groups), rows
// looped past gridDim.y. Each thread first loads kVecsPerThread vectors of kVec elements of every
// input (vector u of thread t at column chunk * tx * kVecsPerThread + u * tx + t: coalesced for each
// u), then computes and stores them. No shared memory, no reductions: every output element has one
// writer, so results are bit-identical run to run. A row whose length is not a multiple of kVec ends
// with one partial vector done element by element. Row offsets are 64-bit. Math in float32, one
// rounding to T.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "activation/activation_plan.h"
#include "activation/activation_problem.h"
#include "activation/kernels/functions.cuh"
#include "common/launch.cuh"
#include "common/vec.cuh"

namespace kernelforge {

// Forward: y[r, c] = T(act(a[r, c]) · b[r, c]) (or T(act(a[r, c]))).
template <typename T, ActFn kFn, bool kGated, int kVec, int kVecsPerThread>
__global__ void __launch_bounds__(kActThreads) act_fwd(const ActParams p) {
  if constexpr (!arch_supports<T>()) {
    __trap();
  } else {
    pdl_wait();  // before the first global access (common/launch.cuh)
    if (p.trigger) pdl_trigger();
    using V = Vec<T, kVec>;
    const int64_t n = p.n;
    const int64_t col0 = (int64_t(blockIdx.x) * blockDim.x * kVecsPerThread + threadIdx.x) * kVec;
    const int64_t step = int64_t(blockDim.x) * kVec;  // columns between one thread's vectors
    const int64_t row_step = int64_t(gridDim.y) * blockDim.y;
    for (int64_t r = int64_t(blockIdx.y) * blockDim.y + threadIdx.y; r < p.rows; r += row_step) {
      const T* a = static_cast<const T*>(p.a) + r * p.a_stride;
      const T* b = kGated ? static_cast<const T*>(p.b) + r * p.b_stride : nullptr;
      T* y = static_cast<T*>(p.y) + r * p.y_stride;
      V va[kVecsPerThread], vb[kVecsPerThread];
#pragma unroll
      for (int u = 0; u < kVecsPerThread; ++u) {  // all loads first: kVecsPerThread (x2) accesses in flight
        const int64_t c = col0 + u * step;
        va[u] = V::zero();
        vb[u] = V::zero();
        if (c + kVec <= n) {
          va[u] = load_vec<T, kVec>(a + c);
          if constexpr (kGated) vb[u] = load_vec<T, kVec>(b + c);
        }
      }
#pragma unroll
      for (int u = 0; u < kVecsPerThread; ++u) {
        const int64_t c = col0 + u * step;
        if (c + kVec <= n) {
          float out[kVec];
#pragma unroll
          for (int j = 0; j < kVec; ++j) {
            const float f = act_detail::Act<kFn>::fwd(va[u].get(j));
            out[j] = kGated ? f * vb[u].get(j) : f;
          }
          store_vec<T, kVec>(y + c, V::from(out));
        } else if (c < n) {  // the row's last, partial vector (n not a multiple of kVec)
          for (int64_t k = c; k < n; ++k) {
            const float f = act_detail::Act<kFn>::fwd(to_float(a[k]));
            y[k] = from_float<T>(kGated ? f * to_float(b[k]) : f);
          }
        }
      }
    }
  }
}

}  // namespace kernelforge
