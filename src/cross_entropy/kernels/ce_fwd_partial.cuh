// Cross-entropy forward, step 1 of 3: per (row, segment) partials. For the segment's logits z
// (softcapped: z = c * tanh(x / c)) one float4 (m, s, sz, 0): m = max u, s = sum 2^(u - m),
// sz = sum z, u = z * log2(e).
// Minimum traffic: the logits once, M * V * sizeof(T) bytes (4096 x 128256 bf16 = 1.05 GB -> ~330 us
// at 3.2 TB/s read); the partials add 16 bytes per segment.
// Why: splitting rows into segments of ce_segment_elems() logits keeps ~8 CTAs of work per row at
// V = 128256, so the grid has tens of thousands of 256-thread CTAs and no tail. Each thread keeps
// kCeIters vectors in flight, then sweeps its registers twice (max, then the sum of exponentials);
// the CTA reduces by warp shuffles. kScalarHead (rows not 16-byte aligned, e.g. an odd vocabulary):
// the row's first hd < kVec logits, up to the next 16-byte boundary, are taken by segment 0's first
// hd threads, and the segments and their 16-byte vectors start after them.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "common/launch.cuh"
#include "common/vec.cuh"
#include "cross_entropy/cross_entropy_plan.h"
#include "cross_entropy/cross_entropy_problem.h"
#include "cross_entropy/kernels/common.cuh"

namespace kernelforge {

template <typename T, int kVec, bool kSoftcap, bool kScalarHead>
__global__ void __launch_bounds__(kCeThreads, 4) ce_fwd_partial(const CeParams p, const int segs, float4* part) {
  if constexpr (!arch_supports<T>()) {
    __trap();
  } else {
    pdl_wait();
    constexpr int kSegLen = ce_segment_elems(int(sizeof(T)));
    const int64_t row = blockIdx.x / segs;
    const int seg = blockIdx.x - int(row * segs);
    const T* x = static_cast<const T*>(p.logits) + row * p.ld;
    int n = int(p.vocab);
    const float inv_cap = kSoftcap ? 1.f / p.softcap : 0.f;
    float m = -INFINITY, s = 0.f, sz = 0.f;
    if constexpr (kScalarHead) {
      const int hd = head_elems(x, n);
      if (seg == 0 && int(threadIdx.x) < hd) {  // (m, s) = (u, 1); a NaN logit makes m NaN
        const float z = ce_cap<kSoftcap>(to_float(x[threadIdx.x]), p.softcap, inv_cap);
        sz = z;
        if (z != -INFINITY) m = z * kLog2e, s = 1.f;
      }
      x += hd, n -= hd;
    }
    const int seg0 = seg * kSegLen;
    const int seg1 = min(n, seg0 + kSegLen);
    // The segment in chunks of kCeThreads * kCeIters * kVec elements (two on the vector path).
    for (int c0 = seg0; c0 < seg1; c0 += kCeThreads * kCeIters * kVec) {
      Vec<T, kVec> v[kCeIters];
#pragma unroll
      for (int it = 0; it < kCeIters; ++it) {  // all loads first: kCeIters x 16 B in flight
        const int j = c0 + (it * kCeThreads + int(threadIdx.x)) * kVec;
        if (j + kVec <= seg1) {
          v[it] = load_vec<T, kVec>(x + j);
        } else {
          v[it] = Vec<T, kVec>::zero();
#pragma unroll
          for (int e = 0; e < kVec; ++e)
            if (j + e < seg1) v[it].set(e, to_float(x[j + e]));
        }
      }
      // Two sweeps over the registers (max, then the sum of exponentials); elements past the
      // segment end count as -inf (and 0 in the sum of logits). A chunk wholly inside the segment
      // (every chunk of the vector path but a row's last) skips the bounds checks.
      const bool full = c0 + kCeThreads * kCeIters * kVec <= seg1;
      float cm = -INFINITY;
#pragma unroll
      for (int it = 0; it < kCeIters; ++it) {
        const int j = c0 + (it * kCeThreads + int(threadIdx.x)) * kVec;
#pragma unroll
        for (int e = 0; e < kVec; ++e) {
          const bool in = full || j + e < seg1;
          const float z = in ? ce_cap<kSoftcap>(v[it].get(e), p.softcap, inv_cap) : -INFINITY;
          sz += in ? z : 0.f;
          cm = fmaxf(cm, z);
        }
      }
      cm *= kLog2e;
      float cs = 0.f;
      if (cm != -INFINITY) {
#pragma unroll
        for (int it = 0; it < kCeIters; ++it) {
          const int j = c0 + (it * kCeThreads + int(threadIdx.x)) * kVec;
#pragma unroll
          for (int e = 0; e < kVec; ++e) {
            const bool in = full || j + e < seg1;
            const float z = in ? ce_cap<kSoftcap>(v[it].get(e), p.softcap, inv_cap) : -INFINITY;
            cs += ex2(fmaf(z, kLog2e, -cm));
          }
        }
      }
      ms_combine(m, s, cm, cs);
    }
    // Block reduction of (m, s, sz): warps by shuffles, then warp 0 over the warps' results.
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
      const float m2 = __shfl_xor_sync(0xffffffffu, m, o), s2 = __shfl_xor_sync(0xffffffffu, s, o);
      sz += __shfl_xor_sync(0xffffffffu, sz, o);
      ms_combine(m, s, m2, s2);
    }
    __shared__ float3 warp_part[kCeThreads / 32];
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    if (lane == 0) warp_part[warp] = make_float3(m, s, sz);
    __syncthreads();
    if (warp == 0) {
      float3 w = lane < kCeThreads / 32 ? warp_part[lane] : make_float3(-INFINITY, 0.f, 0.f);
#pragma unroll
      for (int o = kCeThreads / 64; o > 0; o >>= 1) {
        const float m2 = __shfl_xor_sync(0xffffffffu, w.x, o), s2 = __shfl_xor_sync(0xffffffffu, w.y, o);
        w.z += __shfl_xor_sync(0xffffffffu, w.z, o);
        ms_combine(w.x, w.y, m2, s2);
      }
      if (lane == 0) part[blockIdx.x] = make_float4(w.x, w.y, w.z, 0.f);
    }
  }
}

}  // namespace kernelforge
