// Cross-entropy backward, one pass over the logits:
//   dlogits_j = G (p_j (1 + 2 z_loss lse) - (1 - eps) [j == t] - eps / N) * (softcap ? 1 - (z_j / c)^2 : 1)
//   (N = V and j the class index, or in a vocabulary shard N the global class count and j + class_start)
// with p_j = 2^(u_j - lse * log2 e), G the row's loss gradient (dloss[i], or dloss / valid for the
// mean). Minimum traffic: read and write the logits once, 2 * M * V * sizeof(T) bytes (dlogits may be
// the logits themselves: each element is read and then written by the same thread). An ignored row
// writes zeros without reading the logits.
// Why: the one backward kernel; grid = rows x tiles of 256 threads x kCeBwdIters vectors.
// kScalarHead: as in ce_fwd_partial, tile 0's first hd threads take the row's scalar head (logits and
// dlogits share their misalignment), the tiles start after it.
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
__global__ void __launch_bounds__(kCeThreads) ce_bwd(const CeParams p, const int tiles) {
  if constexpr (!arch_supports<T>()) {
    __trap();
  } else {
    pdl_wait();
    const int64_t row = blockIdx.x / tiles;
    const int tile = blockIdx.x - int(row * tiles);
    int n = int(p.vocab);
    constexpr int kTile = kCeThreads * kCeBwdIters * kVec;
    const int j0 = tile * kTile;
    T* dx = static_cast<T*>(p.dlogits) + row * p.dld;
    const T* x = static_cast<const T*>(p.logits) + row * p.ld;
    const int hd = kScalarHead ? head_elems(dx, n) : 0;
    const bool head = kScalarHead && tile == 0 && int(threadIdx.x) < hd;  // this thread's head logit: j = threadIdx.x
    const int64_t t = ce_target(p, row);
    if (t == p.ignore_index) {  // zero gradient; the logits are not read
      if (head) dx[threadIdx.x] = from_float<T>(0.f);
      dx += hd, n -= hd;
#pragma unroll
      for (int it = 0; it < kCeBwdIters; ++it) {
        const int j = j0 + (it * kCeThreads + int(threadIdx.x)) * kVec;
        if (j + kVec <= n) {
          store_vec<T, kVec>(dx + j, Vec<T, kVec>::zero());
        } else {
          for (int e = 0; e < kVec && j + e < n; ++e) dx[j + e] = from_float<T>(0.f);
        }
      }
      return;
    }
    const float g = p.reduction == Reduction::kNone   ? p.dloss[row * p.dloss_stride]
                    : p.reduction == Reduction::kMean ? p.dloss[0] / p.valid[0]
                                                      : p.dloss[0];
    const float lse = p.lse[row];
    const float lse2 = lse * kLog2e;
    const float gp = p.z_loss > 0.f ? g * (1.f + 2.f * p.z_loss * lse) : g;  // coefficient of p_j
    const float gs = g * p.smoothing / float(p.classes);                     // subtracted everywhere
    const float gt = g * (1.f - p.smoothing);                                // subtracted at the target
    const int64_t tl = t - p.class_start;  // the target's column; -1 (no column) when in another shard
    const int tt = (tl >= 0 && tl < p.vocab) ? int(tl) : -1;
    const float bad = (t < 0 || t >= p.classes) ? NAN : 0.f;  // out-of-range target: NaN row (documented)
    const float inv_cap = kSoftcap ? 1.f / p.softcap : 0.f;
    // dlogits_j of one logit x_j (the formula above)
    auto grad = [&](float xj, int j) {
      const float z = ce_cap<kSoftcap>(xj, p.softcap, inv_cap);
      float r = gp * ex2(fmaf(z, kLog2e, -lse2)) - gs - (j == tt ? gt : 0.f) + bad;
      if constexpr (kSoftcap) {
        const float q = z * inv_cap;
        r *= 1.f - q * q;
      }
      return r;
    };
    if (head) dx[threadIdx.x] = from_float<T>(grad(to_float(x[threadIdx.x]), int(threadIdx.x)));
    x += hd, dx += hd, n -= hd;  // body indices j below are row indices j + hd
    Vec<T, kVec> v[kCeBwdIters];
#pragma unroll
    for (int it = 0; it < kCeBwdIters; ++it) {
      const int j = j0 + (it * kCeThreads + int(threadIdx.x)) * kVec;
      if (j + kVec <= n) {
        v[it] = load_vec<T, kVec>(x + j);
      } else {
        v[it] = Vec<T, kVec>::zero();
        for (int e = 0; e < kVec && j + e < n; ++e) v[it].set(e, to_float(x[j + e]));
      }
    }
#pragma unroll
    for (int it = 0; it < kCeBwdIters; ++it) {
      const int j = j0 + (it * kCeThreads + int(threadIdx.x)) * kVec;
      float d[kVec];
#pragma unroll
      for (int e = 0; e < kVec; ++e) d[e] = grad(v[it].get(e), j + e + hd);
      if (j + kVec <= n) {
        store_vec<T, kVec>(dx + j, Vec<T, kVec>::from(d));
      } else {
        for (int e = 0; e < kVec && j + e < n; ++e) dx[j + e] = from_float<T>(d[e]);
      }
    }
  }
}

}  // namespace kernelforge
