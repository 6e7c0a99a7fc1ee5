// merge_attention_states (decode.h): two attention results of the same queries over disjoint key
// sets combined by their logsumexp, for row n, head h:
//   m = max(lse_a, lse_b),  w_a = e^(lse_a - m) / den,  w_b = e^(lse_b - m) / den,  den = e^(lse_a - m) + e^(lse_b - m)
//   out = w_a o_a + w_b o_b,  out_lse = m + log(den)
// A side with lse = -inf has weight 0 and its o is not used (0 * NaN would poison the row); both -inf
// give out = 0, out_lse = -inf.
//
// Memory-bound: 2 N H D sizeof(T) read + N H D sizeof(T) written + 12 N H bytes of lse (two read, one
// written); at N H = 64 x 32, D = 128, bf16: 1.5 MB + 24 KB. One thread per kVec columns of a (row,
// head), the D / kVec threads of a head adjacent (a warp reads 512 contiguous bytes of each input at
// D = 128 bf16); kVec = 16 / sizeof(T) when every base and stride allows 16-byte accesses, else 1.
// Each thread reads the two lse values of its head itself (the same addresses across its D / kVec
// neighbours: one L1 transaction) and the first thread of the head writes out_lse.
#pragma once

#include <cmath>
#include <cstdint>

#include "common/launch.cuh"
#include "common/vec.cuh"
#include "decode/merge_states.h"

namespace kernelforge {
namespace decode {

constexpr int kMergeStatesThreads = 256;

template <typename T, int kVec>
__global__ void __launch_bounds__(kMergeStatesThreads) merge_states_kernel(MergeStatesParams p) {
  if constexpr (!arch_supports<T>()) {
    __trap();
  } else {
    const int chunks = p.head_dim / kVec;
    const int64_t idx = int64_t(blockIdx.x) * kMergeStatesThreads + threadIdx.x;
    pdl_wait();
    if (idx >= p.rows * p.heads * chunks) return;
    const int c = int(idx % chunks) * kVec;
    const int64_t row = idx / chunks;
    const int64_t h = row % p.heads, n = row / p.heads;
    const float la = static_cast<const float*>(p.lse_a)[n * p.la_sn + h * p.la_sh];
    const float lb = static_cast<const float*>(p.lse_b)[n * p.lb_sn + h * p.lb_sh];
    const float m = fmaxf(la, lb);
    float wa = 0.0f, wb = 0.0f, lse = -INFINITY;
    if (m != -INFINITY) {
      const float ea = expf(la - m), eb = expf(lb - m);  // one of them is 1: den in [1, 2]
      const float den = ea + eb;
      wa = ea / den, wb = eb / den;
      lse = m + logf(den);
    }
    const T* a = static_cast<const T*>(p.o_a) + n * p.oa_sn + h * p.oa_sh + c;
    const T* b = static_cast<const T*>(p.o_b) + n * p.ob_sn + h * p.ob_sh + c;
    T* o = static_cast<T*>(p.out) + n * p.out_sn + h * p.out_sh + c;
    const Vec<T, kVec> va = load_vec<T, kVec>(a), vb = load_vec<T, kVec>(b);
    float r[kVec];
#pragma unroll
    for (int j = 0; j < kVec; ++j) {
      const float xa = wa == 0.0f ? 0.0f : wa * va.get(j);  // a side of weight 0 adds nothing, NaN included
      r[j] = wb == 0.0f ? xa : fmaf(wb, vb.get(j), xa);
    }
    store_vec<T, kVec>(o, Vec<T, kVec>::from(r));
    if (c == 0 && p.out_lse != nullptr) static_cast<float*>(p.out_lse)[n * p.lo_sn + h * p.lo_sh] = lse;
  }
}

}  // namespace decode
}  // namespace kernelforge
