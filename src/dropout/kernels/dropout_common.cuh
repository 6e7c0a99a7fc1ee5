// Device helpers of the dropout kernels: the random stream of a launch (resolved from values or,
// under CUDA-graph capture and in the backward, from device memory), the keep factor of one random
// value, and the element-by-element path over a short range (unaligned data, the last partial vector).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "common/vec.cuh"
#include "dropout/dropout_problem.h"
#include "dropout/kernels/philox.h"

namespace kernelforge {
namespace drop_detail {

// The Philox key and the counter's low half of this launch (include/kernelforge/dropout.h).
struct Stream {
  uint32_t k0, k1;  // key: the seed
  uint32_t c0, c1;  // counter low half: offset / 4
  __device__ __forceinline__ philox::Block group(uint64_t g) const {
    return philox::philox4x32_10(c0, c1, uint32_t(g), uint32_t(g >> 32), k0, k1);
  }
};

// Resolves p.rng (a broadcast load of two int64 when captured) and, in the forward, block 0's
// thread 0 writes the resolved (seed, offset) to rng_out for the backward.
__device__ __forceinline__ Stream resolve_stream(const DropParams& p) {
  uint64_t seed = p.rng.seed, offset = p.rng.offset;
  if (p.rng.captured) {
    seed = uint64_t(*p.rng.seed_ptr);
    offset = uint64_t(*p.rng.offset_ptr) + p.rng.offset_intragraph;
  }
  if (p.rng_out != nullptr && blockIdx.x == 0 && threadIdx.x == 0) {
    p.rng_out[0] = int64_t(seed);
    p.rng_out[1] = int64_t(offset);
  }
  const uint64_t c = offset / 4;
  return Stream{uint32_t(seed), uint32_t(seed >> 32), uint32_t(c), uint32_t(c >> 32)};
}

// Keep test of element j (0 .. 7) of a group's block: its 16 bits < threshold (dropout_problem.h).
__device__ __forceinline__ bool keep(const philox::Block& b, int j, const KeepRule& k) {
  return philox::bits16(b, j) < k.threshold;
}

// out_i = in_i * f_i (+ add_i) for the elements [e0, e1) of one Philox group (8 elements) or less,
// element by element.
template <typename T, bool kAdd>
__device__ __forceinline__ void apply_elements(const DropParams& p, const Stream& st, int64_t e0, int64_t e1) {
  const T* in = static_cast<const T*>(p.in);
  const T* add = static_cast<const T*>(p.add);
  T* out = static_cast<T*>(p.out);
  constexpr int kG = philox::kGroupElems;
  philox::Block b = st.group(uint64_t(e0) / kG);
  for (int64_t e = e0; e < e1; ++e) {
    if (e != e0 && e % kG == 0) b = st.group(uint64_t(e) / kG);
    const bool k = keep(b, int(e % kG), p.keep);
    const float f = k ? p.keep.scale : 0.f;
    const float x = to_float(in[e]);
    out[e] = from_float<T>(kAdd ? fmaf(x, f, to_float(add[e])) : x * f);
    if (p.mask != nullptr) p.mask[e] = k ? 1 : 0;
  }
}

}  // namespace drop_detail
}  // namespace kernelforge
