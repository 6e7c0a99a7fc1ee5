// Dropout on 16-byte vectors: out_i = T(in_i * f_i) (dropout, backward) or T(add_i + in_i * f_i)
// (dropout_add), f_i = m_i ? 1 / (1 - p) : 0, m_i = the 16 Philox bits of element i < threshold.
// Minimum traffic: read in (+ add), write out: 2 (3) * numel * sizeof(T) bytes (+ numel mask bytes);
// 16384 x 4096 bf16 dropout: 268 MB -> 67 us at the H200's ~4.0 TB/s copy rate.
// Compute: one Philox4x32-10 call (~80 integer instructions) per 8 elements (16 bits each), ~10
// instructions per element, plus ~6 for the keep test, the scale and the conversions; at copy speed
// bf16 dropout moves 1.0e12 elements/s: ~1.6e13 instructions/s, about 40 % of the H200's issue rate
// (32 random bits per element took ~60 % at 3 TB/s). A 16-bit vector is exactly one Philox call; a
// float32 vector is half of one (two neighbouring threads compute the same block: one call per 4
// elements, which float32's 8 bytes per element leave well under the memory time).
// Layout: a grid-stride loop over items of kVec = 16 / sizeof(T) elements (vector it = elements
// [it * kVec, (it + 1) * kVec): Philox group it * kVec / 8). Each thread loads kUnroll vectors
// (thread t of block b: items b * 256 * kUnroll + u * 256 + t, coalesced for each u), then draws their
// random bits, computes and stores. The last, partial vector is done element by element. One writer
// per element; the mask depends only on (seed, offset, element index), never on the plan.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "common/launch.cuh"
#include "common/vec.cuh"
#include "dropout/dropout_plan.h"
#include "dropout/kernels/dropout_common.cuh"

namespace kernelforge {

template <typename T, bool kAdd, int kUnroll>
__global__ void __launch_bounds__(kDropThreads) dropout_vec(const DropParams p) {
  if constexpr (!arch_supports<T>()) {
    __trap();
  } else {
    constexpr int kVec = 16 / int(sizeof(T));  // 4 or 8: one Philox group of 8 elements or half of one
    constexpr int kG = philox::kGroupElems;
    constexpr int kWords = kVec / 4;  // keep bytes of the mask, 4 per word
    using V = Vec<T, kVec>;
    pdl_wait();  // before the first global access (common/launch.cuh)
    if (p.trigger) pdl_trigger();
    const drop_detail::Stream st = drop_detail::resolve_stream(p);
    const T* in = static_cast<const T*>(p.in);
    const T* add = static_cast<const T*>(p.add);
    T* out = static_cast<T*>(p.out);
    const int64_t full = p.numel / kVec;                // whole vectors
    const int64_t items = (p.numel + kVec - 1) / kVec;  // + the partial one
    const int64_t step = int64_t(gridDim.x) * kDropThreads * kUnroll;
    for (int64_t base = int64_t(blockIdx.x) * kDropThreads * kUnroll + threadIdx.x; base < items; base += step) {
      V vx[kUnroll], vr[kUnroll];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {  // all loads first: kUnroll (x2 with a residual) in flight
        const int64_t it = base + int64_t(u) * kDropThreads;
        vx[u] = V::zero();
        vr[u] = V::zero();
        if (it < full) {
          vx[u] = load_vec<T, kVec>(in + it * kVec);
          if constexpr (kAdd) vr[u] = load_vec<T, kVec>(add + it * kVec);
        }
      }
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const int64_t it = base + int64_t(u) * kDropThreads;
        if (it < full) {
          float o[kVec];
          uint32_t bits[kWords] = {};
          philox::Block b = st.group(uint64_t(it * kVec) / kG);
          if constexpr (kVec == 4) {  // float32: the vector is the low or the high half of its group
            if (it % 2 != 0) b = philox::Block{{b.v[2], b.v[3], 0u, 0u}};  // selects, no indexed registers
          }
#pragma unroll
          for (int j = 0; j < kVec; ++j) {
            const bool k = drop_detail::keep(b, j, p.keep);
            const float f = k ? p.keep.scale : 0.f;
            o[j] = kAdd ? fmaf(vx[u].get(j), f, vr[u].get(j)) : vx[u].get(j) * f;
            bits[j / 4] |= uint32_t(k) << (8 * (j % 4));
          }
          store_vec<T, kVec>(out + it * kVec, V::from(o));
          if (p.mask != nullptr) {
            if constexpr (kWords == 2)
              *reinterpret_cast<uint2*>(p.mask + it * kVec) = make_uint2(bits[0], bits[1]);
            else
              *reinterpret_cast<uint32_t*>(p.mask + it * kVec) = bits[0];
          }
        } else if (it < items) {  // the last, partial vector (numel not a multiple of kVec)
          drop_detail::apply_elements<T, kAdd>(p, st, it * kVec, p.numel);  // within one Philox group
        }
      }
    }
  }
}

}  // namespace kernelforge
