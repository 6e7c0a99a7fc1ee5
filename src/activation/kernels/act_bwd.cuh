// Activation backward: da = T(g * b * act'(a)), db = T(g * act(a)) (gated) or da = T(g * act'(a))
// (GELU), g = dy, over rows of n columns (formulas in include/kernelforge/activation.h).
// Minimum traffic: read a, b, dy, write da, db: 5 * M * n * sizeof(T) bytes (ungated 3 * M * n).
// Why: the one backward kernel of every activation op; every plan of a backward call runs it. Same
// layout as act_fwd (kernels/act_fwd.cuh): loads of every input first, then compute and store; one
// writer per output element; partial last vector element by element; float32 math.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "activation/activation_plan.h"
#include "activation/activation_problem.h"
#include "activation/kernels/functions.cuh"
#include "common/launch.cuh"
#include "common/vec.cuh"

namespace kernelforge {

// Backward: da = T(g · b · act'(a)), db = T(g · act(a)) (gated); da = T(g · act'(a)) (gelu).
template <typename T, ActFn kFn, bool kGated, int kVec, int kVecsPerThread>
__global__ void __launch_bounds__(kActThreads) act_bwd(const ActParams p) {
  if constexpr (!arch_supports<T>()) {
    __trap();
  } else {
    pdl_wait();  // before the first global access (common/launch.cuh)
    if (p.trigger) pdl_trigger();
    using V = Vec<T, kVec>;
    const int64_t n = p.n;
    const int64_t col0 = (int64_t(blockIdx.x) * blockDim.x * kVecsPerThread + threadIdx.x) * kVec;
    const int64_t step = int64_t(blockDim.x) * kVec;
    const int64_t row_step = int64_t(gridDim.y) * blockDim.y;
    for (int64_t r = int64_t(blockIdx.y) * blockDim.y + threadIdx.y; r < p.rows; r += row_step) {
      const T* a = static_cast<const T*>(p.a) + r * p.a_stride;
      const T* b = kGated ? static_cast<const T*>(p.b) + r * p.b_stride : nullptr;
      const T* dy = static_cast<const T*>(p.dy) + r * p.dy_stride;
      T* da = static_cast<T*>(p.da) + r * p.da_stride;
      T* db = kGated ? static_cast<T*>(p.db) + r * p.db_stride : nullptr;
      V va[kVecsPerThread], vb[kVecsPerThread], vg[kVecsPerThread];
#pragma unroll
      for (int u = 0; u < kVecsPerThread; ++u) {
        const int64_t c = col0 + u * step;
        va[u] = V::zero();
        vb[u] = V::zero();
        vg[u] = V::zero();
        if (c + kVec <= n) {
          va[u] = load_vec<T, kVec>(a + c);
          if constexpr (kGated) vb[u] = load_vec<T, kVec>(b + c);
          vg[u] = load_vec<T, kVec>(dy + c);
        }
      }
#pragma unroll
      for (int u = 0; u < kVecsPerThread; ++u) {
        const int64_t c = col0 + u * step;
        if (c + kVec <= n) {
          float ga[kVec], gb[kVec];
#pragma unroll
          for (int j = 0; j < kVec; ++j) {
            float f, df;
            act_detail::Act<kFn>::both(va[u].get(j), f, df);
            const float g = vg[u].get(j);
            if constexpr (kGated) {
              ga[j] = g * vb[u].get(j) * df;
              gb[j] = g * f;
            } else {
              ga[j] = g * df;
              gb[j] = 0.f;
            }
          }
          store_vec<T, kVec>(da + c, V::from(ga));
          if constexpr (kGated) store_vec<T, kVec>(db + c, V::from(gb));
        } else if (c < n) {  // partial last vector, element by element
          for (int64_t k = c; k < n; ++k) {
            float f, df;
            act_detail::Act<kFn>::both(to_float(a[k]), f, df);
            const float g = to_float(dy[k]);
            if constexpr (kGated) {
              da[k] = from_float<T>(g * to_float(b[k]) * df);
              db[k] = from_float<T>(g * f);
            } else {
              da[k] = from_float<T>(g * df);
            }
          }
        }
      }
    }
  }
}

}  // namespace kernelforge
