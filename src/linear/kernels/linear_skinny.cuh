// Skinny linear: y = x W^T (+ bias) for M <= 16 rows (a decode step's tokens). Contract:
// include/kernelforge/linear.h.
//
// The weight is all of the traffic (N * K elements against M * (N + K)), so the kernel streams W once
// at the copy rate: one CTA per (kBlockN output columns, K split), W tiles of kBlockN x kBlockK through
// a kStages-deep cp.async ring, x's matching 16 x kBlockK tile alongside (rows >= M zero). The
// products run on mma.sync m16n8k16 with x as the A side (16 rows, M of them real) and each warp's 32
// weight rows as B: at M = 16 that is 2 * 16 FLOPs per weight element, which float32 FMAs on the CUDA
// cores could not keep up with at 3 TB/s; on tensor cores it is free.
// splits == 1: the CTA adds the bias and writes y. splits > 1: it writes float32 partial sums
// [split][M][N] to the workspace and linear_reduce.cuh adds them.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "attention/kernels/mma_common.cuh"
#include "common/launch.cuh"
#include "linear/kernels/linear_split.cuh"
#include "linear/linear_config.h"
#include "linear/linear_problem.h"

namespace kernelforge {
namespace skinny {

using attn_mma::cp_async_commit;
using attn_mma::cp_async_wait;
using attn_mma::ldmatrix_x4;
using attn_mma::mma_16816;
using attn_mma::smem_addr;

// 16-byte global -> shared copy of `bytes` (0..16) bytes, the rest zero-filled.
__device__ __forceinline__ void cp_async_bytes(uint32_t dst, const void* src, int bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(bytes));
}

__device__ __forceinline__ void prefetch_l2(const void* p) { asm volatile("prefetch.global.L2 [%0];" ::"l"(p)); }

template <typename T, int kBlockN, int kBlockK, int kWarps, int kStages>
__global__ void __launch_bounds__(kWarps * 32) linear_skinny_kernel(LinearParams p, int splits, float* ws) {
  if constexpr (!arch_supports<T>()) {
    __trap();
  } else {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    constexpr int kThreads = 32 * kWarps;
    constexpr int kStride = kBlockK + kLinearPad;
    constexpr int kChunks = kBlockK / 8;  // 16-byte chunks per tile row
    constexpr int kStage = (16 + kBlockN) * kStride;
    static_assert(kBlockN == 32 * kWarps, "32 output columns per warp");
    static_assert((kBlockN * kChunks) % kThreads == 0, "w tile split over the threads");
    extern __shared__ __align__(16) uint16_t smem[];

    const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
    const int64_t n0 = int64_t(blockIdx.x) * kBlockN;
    const int split = blockIdx.y;
    int64_t kb, ke;
    split_range<kBlockK>(p.K, split, splits, &kb, &ke);
    const int n_tiles = int((ke - kb + kBlockK - 1) / kBlockK);
    const uint16_t* xg = static_cast<const uint16_t*>(p.x);
    const uint16_t* wg = static_cast<const uint16_t*>(p.w);
    // PDL: the W rows of the first kStages - 1 stages are prefetched into L2 before the wait (one
    // prefetch per 128 bytes of a row), so the weight streams from DRAM while the previous kernel
    // drains; the cp.async loads after the wait hit L2. A prefetch cannot leave stale data behind (an
    // earlier kernel's write still in flight lands in L2, the point of coherence, after it).
    if (p.vec16) {
      constexpr int kLines = (kBlockK * 2 + 127) / 128;  // 128-byte spans per tile row
      for (int s = 0; s < kStages - 1 && s < n_tiles; ++s)
        for (int c = tid; c < kBlockN * kLines; c += kThreads) {
          const int64_t n = n0 + c / kLines, kk = kb + int64_t(s) * kBlockK + (c % kLines) * 64;
          if (n < p.N && kk < ke) prefetch_l2(wg + n * p.ldw + kk);
        }
    }
    pdl_wait();

    // Tile at column k of stage s: x rows 0..15 then w rows n0..n0+kBlockN-1, columns k..k+kBlockK-1.
    auto load = [&](int64_t k, int s) {
      uint16_t* sx = smem + s * kStage;
      uint16_t* sw = sx + 16 * kStride;
      if (p.vec16) {
#pragma unroll
        for (int i = 0; i < (16 * kChunks + kThreads - 1) / kThreads; ++i) {
          const int c = tid + i * kThreads;
          if (c >= 16 * kChunks) break;
          const int r = c / kChunks, col = (c % kChunks) * 8;
          const int64_t kk = k + col;
          const int bytes = r < p.M && kk < ke ? int(min(int64_t(8), ke - kk)) * 2 : 0;
          cp_async_bytes(smem_addr(sx + r * kStride + col), bytes ? xg + r * p.ldx + kk : xg, bytes);
        }
#pragma unroll
        for (int i = 0; i < kBlockN * kChunks / kThreads; ++i) {
          const int c = tid + i * kThreads;
          const int r = c / kChunks, col = (c % kChunks) * 8;
          const int64_t kk = k + col, n = n0 + r;
          const int bytes = n < p.N && kk < ke ? int(min(int64_t(8), ke - kk)) * 2 : 0;
          cp_async_bytes(smem_addr(sw + r * kStride + col), bytes ? wg + n * p.ldw + kk : wg, bytes);
        }
      } else {  // any alignment: element loads, 16-byte shared stores
        for (int c = tid; c < (16 + kBlockN) * kChunks; c += kThreads) {
          const int r = c / kChunks, col = (c % kChunks) * 8;
          const bool is_x = r < 16;
          const int64_t row = is_x ? r : n0 + (r - 16);
          const bool row_ok = is_x ? row < p.M : row < p.N;
          const uint16_t* src = is_x ? xg + row * p.ldx : wg + row * p.ldw;
          uint32_t v[4];
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const int64_t k0 = k + col + 2 * e;
            const uint32_t lo = row_ok && k0 < ke ? src[k0] : 0u;
            const uint32_t hi = row_ok && k0 + 1 < ke ? src[k0 + 1] : 0u;
            v[e] = lo | (hi << 16);
          }
          *reinterpret_cast<uint4*>(sx + r * kStride + col) = make_uint4(v[0], v[1], v[2], v[3]);
        }
      }
    };

#pragma unroll
    for (int s = 0; s < kStages - 1; ++s) {
      if (s < n_tiles) load(kb + int64_t(s) * kBlockK, s);
      cp_async_commit();
    }
    float acc[4][4];
#pragma unroll
    for (int j = 0; j < 4; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[j][e] = 0.0f;

    for (int it = 0; it < n_tiles; ++it) {
      const int nt = it + kStages - 1;
      if (nt < n_tiles) load(kb + int64_t(nt) * kBlockK, nt % kStages);
      cp_async_commit();
      cp_async_wait<kStages - 1>();
      __syncthreads();
      const uint16_t* sx = smem + (it % kStages) * kStage;
      const uint16_t* sw = sx + 16 * kStride + warp * 32 * kStride;
#pragma unroll
      for (int kk = 0; kk < kBlockK / 16; ++kk) {
        uint32_t a[4];
        ldmatrix_x4(smem_addr(sx + (lane % 16) * kStride + kk * 16 + 8 * (lane / 16)), a);
#pragma unroll
        for (int pair = 0; pair < 2; ++pair) {  // n8 tiles 2 pair, 2 pair + 1
          uint32_t b[4];
          ldmatrix_x4(
              smem_addr(sw + (pair * 16 + lane % 8 + 8 * (lane / 16)) * kStride + kk * 16 + 8 * ((lane / 8) % 2)), b);
          mma_16816<T>(acc[2 * pair], a, b[0], b[1]);
          mma_16816<T>(acc[2 * pair + 1], a, b[2], b[3]);
        }
      }
      __syncthreads();  // the stage is refilled by the next iteration's load
    }
    cp_async_wait<0>();
    pdl_trigger();

    // acc[j][e]: row m = g + 8 (e / 2), column n = n0 + 32 warp + 8 j + 2 t + e % 2
    const int g = lane / 4, t = lane % 4;
#pragma unroll
    for (int j = 0; j < 4; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int m = g + 8 * (e / 2);
        const int64_t n = n0 + 32 * warp + 8 * j + 2 * t + e % 2;
        if (m >= p.M || n >= p.N) continue;
        if (splits == 1) {
          float v = acc[j][e];
          if (p.bias != nullptr) v += to_float(static_cast<const T*>(p.bias)[n]);
          const uint32_t pk = pack2<T>(v, 0.0f);
          static_cast<uint16_t*>(p.y)[m * p.ldy + n] = uint16_t(pk & 0xffffu);
        } else {
          ws[(int64_t(split) * p.M + m) * p.N + n] = acc[j][e];
        }
      }
#endif
  }
}

}  // namespace skinny
}  // namespace kernelforge
