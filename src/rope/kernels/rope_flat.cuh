// RoPE, flat kernel: the same rotation as the token kernel (kernels/rope_token.cuh), same arithmetic
// and rounding, same minimum traffic: 2 * B*S*(Hq + Hk)*D * sizeof(T) bytes.
// Why: decode steps (at most 1024 tokens, rope_plan.cpp). The token kernel loads a token's cos/sin
// before its head loop, so its x loads wait for them: two memory round trips. Here block (x, y) =
// (token, group of blockDim.y heads), thread (x, y) = (unit, head in the group), and the x loads are
// issued first with the cos/sin loads right after: one round trip (plus the position id's when
// given). H100, bf16, 32/8 heads of 128, CUDA-graph replay: 1.43 us at 1 token against 1.93 for the
// token kernel.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "common/launch.cuh"
#include "common/vec.cuh"
#include "rope/kernels/common.cuh"
#include "rope/rope_plan.h"
#include "rope/rope_problem.h"

namespace kernelforge {

// Block (x, y) = (token, group of blockDim.y heads), thread (x, y) = (unit, head in the group); no
// integer division but the token's b = tok / seq.
template <typename T, typename CS, bool kInterleaved, int kVec>
__global__ void __launch_bounds__(kRopeThreads) rope_flat(const RopeParams p, const int units_rot, const int units) {
  if constexpr (!arch_supports<T>()) {
    __trap();
  } else {
    pdl_wait();
    if (p.trigger) pdl_trigger();
    constexpr bool kPacked = kInterleaved && kVec > 1;
    using V = Vec<T, kVec>;
    const int h = int(blockIdx.y * blockDim.y + threadIdx.y);
    if (h >= p.t[0].heads + p.t[1].heads) return;
    const uint32_t tok = blockIdx.x;
    const int64_t b = tok / uint32_t(p.seq), s = tok - b * p.seq;
    const rope_detail::HeadPtrs<T> hp = rope_detail::head_ptrs<T>(p, h, b, s);
    for (int u = threadIdx.x; u < units; u += blockDim.x) {
      if (u >= units_rot) {
        rope_detail::pass_unit<T, kVec>(hp, p.rot_dim + (u - units_rot) * kVec, p.head_dim);
        continue;
      }
      int ca, cb;
      rope_detail::unit_cols<kInterleaved, kVec>(u, p.rot_dim, &ca, &cb);
      const V xa = load_vec<T, kVec>(hp.in + ca);
      const V xb = kPacked ? xa : load_vec<T, kVec>(hp.in + cb);
      bool bad;
      const CS *cosr, *sinr;
      rope_detail::token_cs<CS>(p, b, s, &cosr, &sinr, &bad);
      rope_detail::UnitCS<CS, kInterleaved, kVec> c;
      c.load(cosr, sinr, ca, cb, p.backward, bad);
      rope_detail::rotate_store<T, CS, kInterleaved, kVec>(xa, xb, c, hp.out, ca, cb);
    }
  }
}

}  // namespace kernelforge
