// softmax_fwd_row: softmax / log_softmax forward, one row per CTA of kTpr threads, team size and
// vectors per thread compiled in.
//   m = max_j x_j (a max reduction), e_j = exp(x_j − m) kept in float registers, s = Σ e_j (a sum
//   reduction), y_j = e_j · (1/s)  (log_softmax: y_j = (x_j − m) − log s).
// Minimum traffic 2·M·N·sizeof(T) bytes (read x, write y); 16384x8192 bf16: 537 MB, 180 µs at 2.99 TB/s.
// Why it exists: the common forward (16-byte vectors, n a multiple of kVec, 128..512 threads x 1..2
// vectors per thread, and 512 x 4 for 16-32 KB rows; with kScalarHead the odd rows of 129..2048
// vectors). It is softmax_regs' two-reduction algorithm compiled for this case alone: no cluster, no
// partial vectors (except kScalarHead's last), the team size and warp count known to the compiler
// (unrolled butterflies), the max taken over packed pairs (each value unpacked once for its exp,
// again for log_softmax's output). Nsight Compute at 16384x8192 bf16 counted ~530 issued instructions
// per warp and row for softmax_regs against ~325 for Liger's Triton kernel (65.8 vs 46.0 % SM
// throughput, 2.61 vs 2.95 TB/s): the generic kernel's per-row overhead, not the exps, kept it below
// the memory rate; this kernel runs at the copy rate (2943 GB/s at 16384x8192).
// exp(x − M) = ex2((x − M)·log2 e): x − M first. (A single FFMA, ex2(fma(x, log2 e, −M·log2 e)), has an
// exponent error of ~|M|·2^-24 absolute: at |M| = 1e30 or 6e4 the special-value tests failed.)
#pragma once

#include <algorithm>

#include "softmax/kernels/common.cuh"

namespace kernelforge {
namespace softmax_detail {

// Resident CTAs asked of ptxas: every resident thread (sm_90: 2048, 32 registers) at 1-2 vectors per
// thread, half of them at 4 (64 registers: e = exp(x - M) of 32 elements stays in registers).
template <int kTpr, int kIters>
constexpr int kRowMinBlocks = std::max(1, kSmThreads / kTpr / (kIters > 2 ? 2 : 1));

// kScalarHead: rows whose pointers share a misalignment (odd n): the row's first hd elements (up to
// the next 16-byte boundary) are a scalar head held by threads t < hd, the vectors start after it and
// the last one may be partial.
template <typename T, bool kLog, int kVec, int kIters, int kTpr, bool kScalarHead = false>
__global__ void __launch_bounds__(kTpr, kRowMinBlocks<kTpr, kIters>) softmax_fwd_row(const SoftmaxParams p) {
  if constexpr (!arch_supports<T>()) {
    __trap();
  } else {
    pdl_wait();
    if (p.trigger) pdl_trigger();
    using V = Vec<T, kVec>;
    constexpr int kW = kTpr / 32;
    constexpr int kN = kIters * kVec;
    __shared__ float red[2][kW];  // max, then sum: one barrier per reduction
    const int t = int(threadIdx.x);
    for (int64_t row = blockIdx.x; row < p.rows; row += gridDim.x) {
      const T* in = static_cast<const T*>(p.in) + row * p.in_stride;
      T* out = static_cast<T*>(p.out) + row * p.out_stride;
      int n = int(p.n), hd = 0;
      float hx = -INFINITY;  // kScalarHead: this thread's head element
      if constexpr (kScalarHead) {
        hd = head_elems(in, n);
        if (t < hd) hx = to_float(in[t]);
        in += hd, out += hd, n -= hd;
      }
      V a[kIters];
#pragma unroll
      for (int i = 0; i < kIters; ++i) {
        const int c = (t + i * kTpr) * kVec;
        if (c < n) {
          a[i] = kScalarHead ? load_row_vec<T, kVec>(in, c, n, -INFINITY) : load_vec<T, kVec>(in + c);
        } else {
#pragma unroll
          for (int j = 0; j < kVec; ++j) a[i].set(j, -INFINITY);
        }
      }
      float tm = packed_max<T, kVec, kIters>(a);
      if constexpr (kScalarHead) tm = fmaxf(tm, hx);
      const float m = block_reduce<kW, MaxOp>(tm, red[0]);
      float e[kN];  // softmax: kept for y; log_softmax: only summed (x stays packed in a)
#pragma unroll
      for (int i = 0; i < kIters; ++i)
#pragma unroll
        for (int j = 0; j < kVec; ++j) {
          const float xj = a[i].get(j);
          e[i * kVec + j] = ex2((xj - m) * kLog2e);
        }
      float part[kIters];  // per vector a pairwise tree, then over the vectors (fewer live registers)
#pragma unroll
      for (int i = 0; i < kIters; ++i) {
        float v[kVec];
#pragma unroll
        for (int j = 0; j < kVec; ++j) v[j] = e[i * kVec + j];
        part[i] = tree_reduce(v, [](float u, float w) { return u + w; });
      }
      float ts = tree_reduce(part, [](float u, float w) { return u + w; });
      const float he = kScalarHead && t < hd ? ex2((hx - m) * kLog2e) : 0.f;
      if constexpr (kScalarHead) ts += he;
      const float s = block_reduce<kW, SumOp>(ts, red[1]);
      const float k = kLog ? logf(s) : 1.f / s;
      if constexpr (kScalarHead) {
        if (t < hd) out[t - hd] = from_float<T>(kLog ? (hx - m) - k : he * k);
      }
#pragma unroll
      for (int i = 0; i < kIters; ++i) {
        const int c = (t + i * kTpr) * kVec;
        if (c >= n) continue;
        float f[kVec];
#pragma unroll
        for (int j = 0; j < kVec; ++j) f[j] = kLog ? (a[i].get(j) - m) - k : e[i * kVec + j] * k;
        if constexpr (kScalarHead) {
          store_row_vec<T, kVec>(out, c, n, f);
        } else {
          store_vec<T, kVec>(out + c, V::from(f));
        }
      }
    }
  }
}

}  // namespace softmax_detail
}  // namespace kernelforge
