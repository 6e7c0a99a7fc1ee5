// GEMV linear for 1 to 4 rows: y = x W^T (+ bias) with the products on the CUDA cores. Contract:
// include/kernelforge/linear.h; notes/linear.md says when it runs.
//
// Bytes: the weight N * K * 2 read once, x's M * K * 2 per CTA from L1 / L2, y's M * N * 2 written.
// FLOPs 2 * M * N * K, float32 FMAs on the CUDA cores: at M = 1 a weight element costs one FMA and
// one conversion, far under the SM's rate at the copy bandwidth, so the tensor cores are not needed and
// the weight need not pass through shared memory. At M = 4 (4 FMAs an element, x converted per row)
// the CUDA cores set the pace; the plan gives the kernel M = 1 (notes/linear.md).
//
// Why a second kernel next to the tiled ones (linear_skinny*.cuh): those read W as 128 x 64 tiles,
// 128 bytes from each of 128 rows per stage, and split K over up to 8 CTAs. Here each warp load is
// 512 contiguous bytes of one W row (16 bytes a lane), a CTA covers whole rows, and every thread keeps
// kRows x kUnroll independent 16-byte loads in flight; nothing waits on a barrier or a ring slot.
//
// CTA: kWarps warps own kRows consecutive output columns (W rows) and all of K. Thread t reads the
// 16-byte chunks t, t + kThreads, ... of each of the kRows rows (kUnroll chunks per row per round,
// all loaded before any is used), multiplies them by x's matching chunks (M rows, plain loads that
// hit L1 after the first CTA on an SM) and accumulates kM x kRows float32 sums. The sums are reduced
// over the warp by shuffles and over the warps through shared memory in a fixed order (the same bits
// every run), the bias added and y rounded once.
//
// Needs: K a multiple of 8, x and w 16-byte aligned, w's row stride (and x's when M > 1) a multiple
// of 8 elements (LinearParams::gemv).
// PDL: before the wait each CTA prefetches its first round of W into L2, so the first loads after the
// wait hit L2 (a prefetch cannot leave stale data behind: common/launch.cuh).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "common/launch.cuh"
#include "common/vec.cuh"
#include "linear/linear_problem.h"

namespace kernelforge {
namespace skinny {

// A 16-byte weight load that does not allocate in L1 (each weight byte is read once).
__device__ __forceinline__ uint4 ld_stream16(const void* p) {
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p));
  return v;
}

__device__ __forceinline__ void prefetch_l2_line(const void* p) { asm volatile("prefetch.global.L2 [%0];" ::"l"(p)); }

// kM: the rows of x this instantiation computes (M <= kM, rows past M are skipped).
template <typename T, int kM, int kRows, int kWarps, int kUnroll>
__global__ void __launch_bounds__(kWarps * 32) linear_gemv_kernel(LinearParams p) {
  if constexpr (!arch_supports<T>()) {
    __trap();
  } else {
    constexpr int kThreads = 32 * kWarps;
    using V = Vec<T, 8>;
    __shared__ float red[kWarps][kM * kRows];

    const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
    const int64_t n0 = int64_t(blockIdx.x) * kRows;
    const int64_t chunks = p.K / 8;  // 16-byte chunks per row
    const uint16_t* wg = static_cast<const uint16_t*>(p.w) + n0 * p.ldw;
    const uint16_t* xg = static_cast<const uint16_t*>(p.x);
    const int rows = int(p.N - n0 < kRows ? p.N - n0 : kRows);

    // The first round of this CTA's rows (kUnroll * kThreads chunks of each) into L2, one prefetch per
    // 128-byte line, before waiting for the previous kernel.
    {
      const int64_t lines = (min(chunks, int64_t(kUnroll) * kThreads) + 7) / 8;
      for (int64_t i = tid; i < rows * lines; i += kThreads)
        prefetch_l2_line(wg + (i / lines) * p.ldw + (i % lines) * 64);
    }
    pdl_wait();

    float acc[kM][kRows];
#pragma unroll
    for (int m = 0; m < kM; ++m)
#pragma unroll
      for (int r = 0; r < kRows; ++r) acc[m][r] = 0.0f;

    for (int64_t c0 = tid; c0 < chunks; c0 += int64_t(kUnroll) * kThreads) {
      V w[kRows][kUnroll];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const int64_t c = c0 + int64_t(u) * kThreads;
#pragma unroll
        for (int r = 0; r < kRows; ++r) {
          const uint4 v = c < chunks && r < rows ? ld_stream16(wg + r * p.ldw + c * 8) : make_uint4(0, 0, 0, 0);
          w[r][u].w[0] = v.x, w[r][u].w[1] = v.y, w[r][u].w[2] = v.z, w[r][u].w[3] = v.w;
        }
      }
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const int64_t c = c0 + int64_t(u) * kThreads;
        if (c >= chunks) break;
#pragma unroll
        for (int m = 0; m < kM; ++m) {
          if (m >= p.M) break;
          const uint4 xv = *reinterpret_cast<const uint4*>(xg + m * p.ldx + c * 8);
          V x;
          x.w[0] = xv.x, x.w[1] = xv.y, x.w[2] = xv.z, x.w[3] = xv.w;
          float xf[8];
#pragma unroll
          for (int j = 0; j < 8; ++j) xf[j] = x.get(j);
#pragma unroll
          for (int r = 0; r < kRows; ++r)
#pragma unroll
            for (int j = 0; j < 8; ++j) acc[m][r] = fmaf(xf[j], w[r][u].get(j), acc[m][r]);
        }
      }
    }
    pdl_trigger();

    // Sum over the warp (butterfly), then over the warps in warp order.
#pragma unroll
    for (int m = 0; m < kM; ++m)
#pragma unroll
      for (int r = 0; r < kRows; ++r) {
        float v = acc[m][r];
#pragma unroll
        for (int o = 16; o > 0; o /= 2) v += __shfl_xor_sync(0xffffffffu, v, o);
        if (lane == 0) red[warp][m * kRows + r] = v;
      }
    __syncthreads();
    if (tid < kM * kRows) {
      const int m = tid / kRows, r = tid % kRows;
      if (m < p.M && r < rows) {
        float v = 0.0f;
#pragma unroll
        for (int i = 0; i < kWarps; ++i) v += red[i][tid];
        if (p.bias != nullptr) v += to_float(static_cast<const T*>(p.bias)[n0 + r]);
        static_cast<T*>(p.y)[m * p.ldy + n0 + r] = from_float<T>(v);
      }
    }
  }
}

}  // namespace skinny
}  // namespace kernelforge
