// RoPE, token kernel: for every token (b, s) and head h (q's heads, then k's) rotate the pairs of the
// first R columns by the token's cos/sin row and copy columns R..D-1 (formulas in
// include/kernelforge/rope.h), forward or backward.
// Minimum traffic: read q, k and write q_out, k_out: 2 * B*S*(Hq + Hk)*D * sizeof(T) bytes (cos/sin
// add B*S*R or S*R values, read once per token per unit from L1/L2). B=4 S=4096 Hq=32 Hk=8 D=128
// bf16: 335.5 MB -> 112 us at the H100's 3.0 TB/s copy rate. Arithmetic: 2 FMA + 2 MUL per pair.
// Why: prefill and training calls (more than 1024 tokens, rope_plan.cpp) run it. Block (tx, ty, tz):
// tx threads over a head's units, ty head slots, tz tokens; a thread loads its unit's cos/sin once
// per token and walks its heads kRopeHeadsInFlight at a time (the loads of all of them first: 4 x
// 2 x 16 B in flight per thread). B=4 S=4096 Hq=32 Hk=8 D=128 bf16 rotate-half: 8 units, 5 head
// slots of 8 heads, 6 tokens per 240-thread block, 2731 blocks. Tokens loop past the grid.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "common/launch.cuh"
#include "common/vec.cuh"
#include "rope/kernels/common.cuh"
#include "rope/rope_plan.h"
#include "rope/rope_problem.h"

namespace kernelforge {

// Heads a thread loads before it computes. With 8 heads per thread in rounds of 4 the forward reaches
// 2762 GB/s on the H100 (bf16, 40 heads of 128, 16384 tokens) against 2610 at one head per thread.
constexpr int kRopeHeadsInFlight = 4;

// For each pair (a, b) with cos c and "effective sin" e (forward: e_a = -sin_a, e_b = sin_b;
// backward: e_a = sin_b, e_b = -sin_a):  out_a = x_a c_a + x_b e_a,  out_b = x_b c_b + x_a e_b.
template <typename T, typename CS, bool kInterleaved, int kVec>
__global__ void __launch_bounds__(kRopeThreads) rope_token(const RopeParams p, const int units_rot, const int units) {
  if constexpr (!arch_supports<T>()) {
    __trap();
  } else {
    pdl_wait();  // before the first global access (common/launch.cuh)
    if (p.trigger) pdl_trigger();
    constexpr bool kPacked = kInterleaved && kVec > 1;  // the pairs lie inside one vector
    using V = Vec<T, kVec>;
    const int heads = p.t[0].heads + p.t[1].heads;
    const int R = p.rot_dim, D = p.head_dim;
    const int64_t tokens = p.batch * p.seq;
    const int ty = int(blockDim.y);
    for (int64_t tok = int64_t(blockIdx.x) * blockDim.z + threadIdx.z; tok < tokens;
         tok += int64_t(gridDim.x) * blockDim.z) {
      // 32-bit division where it fits (the 64-bit one is a ~100-instruction subroutine per token)
      const int64_t b = tokens <= UINT32_MAX ? int64_t(uint32_t(tok) / uint32_t(p.seq)) : tok / p.seq;
      const int64_t s = tok - b * p.seq;
      bool bad;
      const CS *cosr, *sinr;
      rope_detail::token_cs<CS>(p, b, s, &cosr, &sinr, &bad);
      for (int u = threadIdx.x; u < units; u += blockDim.x) {
        if (u < units_rot) {
          int ca, cb;
          rope_detail::unit_cols<kInterleaved, kVec>(u, R, &ca, &cb);
          rope_detail::UnitCS<CS, kInterleaved, kVec> c;
          // rotate-half: cos/sin are loaded after the first round's x loads, so both are in flight
          // together (loaded before the head loop: 0.5 % slower at 16384 tokens, 5 % at 512 with L2-hot
          // inputs, notes/rope.md). Interleaved keeps the early load: the late one takes 80 registers
          // instead of 64 there (3 blocks per SM instead of 4; not measured).
          bool need_cs = !kInterleaved;
          if constexpr (kInterleaved) c.load(cosr, sinr, ca, cb, p.backward, bad);
          for (int h0 = threadIdx.y; h0 < heads; h0 += kRopeHeadsInFlight * ty) {
            V xa[kRopeHeadsInFlight], xb[kRopeHeadsInFlight];
            rope_detail::HeadPtrs<T> hp[kRopeHeadsInFlight];
#pragma unroll
            for (int i = 0; i < kRopeHeadsInFlight; ++i) {  // loads of every head first
              const int h = h0 + i * ty;
              xa[i] = V::zero();
              xb[i] = V::zero();
              if (h < heads) {
                hp[i] = rope_detail::head_ptrs<T>(p, h, b, s);
                xa[i] = load_vec<T, kVec>(hp[i].in + ca);
                if constexpr (!kPacked) xb[i] = load_vec<T, kVec>(hp[i].in + cb);
              }
            }
            if (need_cs) c.load(cosr, sinr, ca, cb, p.backward, bad), need_cs = false;
#pragma unroll
            for (int i = 0; i < kRopeHeadsInFlight; ++i) {
              if (h0 + i * ty >= heads) break;
              rope_detail::rotate_store<T, CS, kInterleaved, kVec>(xa[i], xb[i], c, hp[i].out, ca, cb);
            }
          }
        } else {  // passthrough columns R..D-1
          const int c = R + (u - units_rot) * kVec;
          for (int h = threadIdx.y; h < heads; h += ty)
            rope_detail::pass_unit<T, kVec>(rope_detail::head_ptrs<T>(p, h, b, s), c, D);
        }
      }
    }
  }
}

}  // namespace kernelforge
