// Skinny linear on sm_90a: y = x W^T (+ bias) for M <= 16 rows, W and x through TMA tile copies.
// Contract: include/kernelforge/linear.h. Same tile and math as linear_skinny.cuh (the cp.async kernel,
// any sm_80+ GPU); notes/linear.md says when each runs.
//
// Bytes: the weight N * K * 2 read once (all of the traffic at M <= 16), x's M * K * 2 re-read from L2
// by every column block, y's M * N * 2 written once. The cp.async ring spends one 16-byte copy per
// thread per chunk (1152 copies for a 128 x 64 W tile and its x tile); here one producer thread
// issues two 2-D tensor copies per stage (W 128 x 64 = 16 KB, x 16 x 64 = 2 KB), whole 128-byte lines,
// no registers or issue slots spent on addresses by the consumer warps.
//
// CTA: kWarps consumer warps (32 output columns each) + 1 producer warp. A kStages ring of (W, x)
// tiles, full[s] (the producer's expect_tx arrival + the copies' bytes) and empty[s] (one arrival per
// consumer warp) mbarriers. Rows of W past N, x rows past M and columns past K arrive as zeros (TMA's
// out-of-bounds fill), so no tile needs a bound check.
//
// Shared layout: the 128-byte swizzle (CU_TENSOR_MAP_SWIZZLE_128B): a tile row is 64 elements = 128
// bytes, its 16-byte chunk c stored at chunk c ^ (row % 8), tiles 1024-byte aligned. One 8 x 8 ldmatrix
// matrix reads the same chunk of 8 consecutive rows: swizzled, those are 8 distinct chunk positions,
// i.e. all 32 banks once (conflict-free); unswizzled they would share 4 banks (8-way conflict).
//
// Products: mma.sync m16n8k16 with x as A (16 rows, M of them real) and the warp's 32 W rows as B,
// float32 accumulators (a weight element costs 2 * 16 FLOPs at M = 16: tensor cores, not FMAs).
//
// K split: grid.x = column blocks x splits, and the splits of a column block form one cluster (rank =
// split, splits <= 8). Each CTA leaves its float32 16 x kBlockN partial sum in its own drained ring;
// after a cluster barrier every rank adds a 1/splits share of the M x kBlockN outputs over all ranks'
// partials through distributed shared memory (rank order fixed: the same bits every run), adds the
// bias and writes y. A second cluster barrier keeps each CTA's partial alive until the others have
// read it. No workspace, no second kernel, nothing to reset: CUDA-graph replays need nothing extra.
#pragma once

#include <cooperative_groups.h>
#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "attention/kernels/mma_common.cuh"
#include "common/launch.cuh"
#include "common/tma.cuh"
#include "linear/kernels/linear_split.cuh"
#include "linear/linear_problem.h"

namespace kernelforge {
namespace skinny {

// Grid (column blocks x splits), cluster (splits) along x when splits > 1, 32 (kWarps + 1) threads,
// kStages * (kBlockN + 16) * kBlockK * 2 + 128 + 1024 bytes of dynamic shared memory (linear_config.h).
// tm_w: 2-D map (K, N) of w with kBlockK x kBlockN boxes; tm_x: (K, M) of x with kBlockK x 16 boxes;
// both in the 128-byte swizzle.
template <typename T, int kBlockN, int kBlockK, int kWarps, int kStages>
__global__ void __launch_bounds__(32 * (kWarps + 1), 2)
    linear_skinny_tma_kernel(const __grid_constant__ CUtensorMap tm_w, const __grid_constant__ CUtensorMap tm_x,
                             const LinearParams p, int splits) {
#if KF_SM90A
  constexpr int kThreads = 32 * (kWarps + 1);
  constexpr int kRowBytes = kBlockK * 2;
  constexpr int kWBytes = kBlockN * kRowBytes;
  constexpr int kStageBytes = kWBytes + 16 * kRowBytes;
  constexpr int kPartStride = kBlockN + 8;  // floats: a float2 store of 4 lanes x 8 rows hits 32 banks per half-warp
  static_assert(kRowBytes == 128, "a tile row is the 128-byte swizzle span");
  static_assert(kBlockN == 32 * kWarps, "32 output columns per consumer warp");
  static_assert(kStageBytes % 1024 == 0 && kWBytes % 1024 == 0, "tiles stay 1024-byte aligned");
  static_assert(16 * kPartStride * 4 <= kStages * kStageBytes, "the partial sums fit in the drained ring");
  using attn_mma::ldmatrix_x4;
  using attn_mma::mma_16816;

  extern __shared__ uint8_t smem_raw[];
  uint8_t* smem = smem_raw + ((1024 - (smem_u32(smem_raw) & 1023)) & 1023);
  uint64_t* full = reinterpret_cast<uint64_t*>(smem + kStages * kStageBytes);
  uint64_t* empty = full + kStages;

  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int split = int(blockIdx.x % unsigned(splits));  // the cluster rank when splits > 1
  const int64_t n0 = int64_t(blockIdx.x / unsigned(splits)) * kBlockN;
  int64_t kb, ke;
  split_range<kBlockK>(p.K, split, splits, &kb, &ke);
  const int n_tiles = int((ke - kb + kBlockK - 1) / kBlockK);

  if (tid == 0) {
    for (int s = 0; s < kStages; ++s) {
      mbar_init_count(&full[s], 1);
      mbar_init_count(&empty[s], kWarps);
    }
    mbar_init_fence();
  }
  __syncthreads();
  // PDL: the W boxes of the first kStages stages are prefetched into L2 before the wait, so the weight
  // streams from DRAM while the previous kernel drains; the ring's loads after the wait hit L2. A
  // prefetch cannot leave stale data behind (an earlier kernel's write still in flight lands in L2,
  // the point of coherence, after it), so this holds even if the weight is an earlier kernel's output.
  if (warp == kWarps && lane == 0) {
    tma_prefetch_desc(&tm_w);
    tma_prefetch_desc(&tm_x);
    for (int it = 0; it < n_tiles && it < kStages; ++it) tma_prefetch_l2_2d(&tm_w, int(kb) + it * kBlockK, int(n0));
  }
  pdl_wait();  // x (and everything after) may be the previous kernel's output

  float acc[4][4];
#pragma unroll
  for (int j = 0; j < 4; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) acc[j][e] = 0.0f;

  if (warp == kWarps) {
    // ---- producer: stage s = it % kStages, its use u = it / kStages waits for the consumers' release
    // of use u - 1 (parity (u - 1) & 1; a fresh barrier passes parity 1 at once) ----
    if (lane == 0) {
      for (int it = 0; it < n_tiles; ++it) {
        const int s = it % kStages;
        const uint32_t phase = uint32_t(it / kStages) & 1u;
        const int k = int(kb) + it * kBlockK;
        uint8_t* stage = smem + s * kStageBytes;
        mbar_wait(&empty[s], phase ^ 1u);
        mbar_expect(&full[s], kStageBytes);
        tma_load_2d(stage, &tm_w, &full[s], k, int(n0));
        tma_load_2d(stage + kWBytes, &tm_x, &full[s], k, 0);
      }
    }
    __syncwarp();
  } else {
    // ---- consumers: ldmatrix lane rows as in linear_skinny.cuh, chunks XOR (row % 8) = lane % 8 ----
    const uint32_t base = smem_u32(smem);
    const uint32_t r8 = uint32_t(lane % 8);
    const uint32_t a_row = uint32_t(lane % 16) * kRowBytes, a_chunk = uint32_t(lane / 16);
    const uint32_t b_row = uint32_t(32 * warp + lane % 8 + 8 * (lane / 16)) * kRowBytes,
                   b_chunk = uint32_t((lane / 8) % 2);
    for (int it = 0; it < n_tiles; ++it) {
      const int s = it % kStages;
      mbar_wait(&full[s], uint32_t(it / kStages) & 1u);
      const uint32_t sw = base + uint32_t(s * kStageBytes), sx = sw + kWBytes;
#pragma unroll
      for (int kk = 0; kk < kBlockK / 16; ++kk) {
        uint32_t a[4];
        ldmatrix_x4(sx + a_row + (((2u * kk + a_chunk) ^ r8) << 4), a);
#pragma unroll
        for (int pair = 0; pair < 2; ++pair) {  // n8 tiles 2 pair, 2 pair + 1
          uint32_t b[4];
          ldmatrix_x4(sw + b_row + uint32_t(pair * 16 * kRowBytes) + (((2u * kk + b_chunk) ^ r8) << 4), b);
          mma_16816<T>(acc[2 * pair], a, b[0], b[1]);
          mma_16816<T>(acc[2 * pair + 1], a, b[2], b[3]);
        }
      }
      __syncwarp();
      if (lane == 0) mbar_arrive(&empty[s]);
    }
  }
  pdl_trigger();

  // acc[j][e]: row m = g + 8 (e / 2), column n0 + 32 warp + 8 j + 2 t + e % 2
  const int g = lane / 4, t = lane % 4;
  const T* bias = static_cast<const T*>(p.bias);
  uint16_t* y = static_cast<uint16_t*>(p.y);
  if (splits == 1) {
    if (warp == kWarps) return;
#pragma unroll
    for (int j = 0; j < 4; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int m = g + 8 * (e / 2);
        const int64_t n = n0 + 32 * warp + 8 * j + 2 * t + e % 2;
        if (m >= p.M || n >= p.N) continue;
        float v = acc[j][e];
        if (bias != nullptr) v += to_float(bias[n]);
        y[m * p.ldy + n] = uint16_t(pack2<T>(v, 0.0f) & 0xffffu);
      }
    return;
  }

  // ---- K split: the cluster adds its partials ----
  __syncthreads();  // every consumer warp has read its last stage (and every copy has landed)
  float* part = reinterpret_cast<float*>(smem);
  if (warp < kWarps) {
#pragma unroll
    for (int j = 0; j < 4; ++j)
#pragma unroll
      for (int h = 0; h < 2; ++h)
        *reinterpret_cast<float2*>(part + (g + 8 * h) * kPartStride + 32 * warp + 8 * j + 2 * t) =
            make_float2(acc[j][2 * h], acc[j][2 * h + 1]);
  }
  cooperative_groups::cluster_group cluster = cooperative_groups::this_cluster();
  cluster.sync();  // release / acquire: every rank's partial is visible to the others
  const int elems = p.M * kBlockN;
  for (int i = split * kThreads + tid; i < elems; i += splits * kThreads) {
    const int m = i / kBlockN, c = i % kBlockN;
    const int64_t n = n0 + c;
    if (n >= p.N) continue;
    float* mine = part + m * kPartStride + c;
    float v = 0.0f;
#pragma unroll 8
    for (int q = 0; q < splits; ++q) v += *cluster.map_shared_rank(mine, q);
    if (bias != nullptr) v += to_float(bias[n]);
    y[m * p.ldy + n] = uint16_t(pack2<T>(v, 0.0f) & 0xffffu);
  }
  cluster.sync();  // no CTA leaves while another may still read its partial
#else
  // Not sm_90a (an sm_80 image, or sm_90 without the "a"): the launcher never runs this; a build whose
  // only sm_90 code lacks the "a" would report binary version 90, so fail loudly rather than skip y.
  (void)tm_w, (void)tm_x, (void)p, (void)splits;
#if defined(__CUDA_ARCH__)
  __trap();
#endif
#endif
}

}  // namespace skinny
}  // namespace kernelforge
