// Dropout with element accesses, for pointers that do not allow 16-byte vectors (a view whose data
// starts one element past alignment): same formula and mask as kernels/dropout_vec.cuh, one item =
// one Philox group of 8 elements (one call). Minimum traffic as dropout_vec (2 or 3 * numel *
// sizeof(T) bytes); each warp reads 8 consecutive elements per thread in 8 strided accesses that
// fall in the same cache lines (L1 merges them), so the fallback stays near the vector path for
// 4-byte types and within ~2x for 16-bit types.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "common/launch.cuh"
#include "common/vec.cuh"
#include "dropout/dropout_plan.h"
#include "dropout/kernels/dropout_common.cuh"

namespace kernelforge {

template <typename T, bool kAdd, int kUnroll>
__global__ void __launch_bounds__(kDropThreads) dropout_scalar(const DropParams p) {
  if constexpr (!arch_supports<T>()) {
    __trap();
  } else {
    pdl_wait();  // before the first global access (common/launch.cuh)
    if (p.trigger) pdl_trigger();
    const drop_detail::Stream st = drop_detail::resolve_stream(p);
    const T* in = static_cast<const T*>(p.in);
    const T* add = static_cast<const T*>(p.add);
    T* out = static_cast<T*>(p.out);
    constexpr int kG = philox::kGroupElems;
    const int64_t full = p.numel / kG;  // whole groups
    const int64_t items = (p.numel + kG - 1) / kG;
    const int64_t step = int64_t(gridDim.x) * kDropThreads * kUnroll;
    for (int64_t base = int64_t(blockIdx.x) * kDropThreads * kUnroll + threadIdx.x; base < items; base += step) {
      float x[kUnroll][kG], r[kUnroll][kG];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {  // all loads first
        const int64_t it = base + int64_t(u) * kDropThreads;
#pragma unroll
        for (int l = 0; l < kG; ++l) {
          x[u][l] = 0.f;
          r[u][l] = 0.f;
          if (it < full) {
            x[u][l] = to_float(in[it * kG + l]);
            if constexpr (kAdd) r[u][l] = to_float(add[it * kG + l]);
          }
        }
      }
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const int64_t it = base + int64_t(u) * kDropThreads;
        if (it < full) {
          const philox::Block b = st.group(uint64_t(it));
#pragma unroll
          for (int l = 0; l < kG; ++l) {
            const bool k = drop_detail::keep(b, l, p.keep);
            const float f = k ? p.keep.scale : 0.f;
            out[it * kG + l] = from_float<T>(kAdd ? fmaf(x[u][l], f, r[u][l]) : x[u][l] * f);
            if (p.mask != nullptr) p.mask[it * kG + l] = k ? 1 : 0;
          }
        } else if (it < items) {  // the last, partial group
          drop_detail::apply_elements<T, kAdd>(p, st, it * kG, p.numel);
        }
      }
    }
  }
}

}  // namespace kernelforge
