// MLA decode (DeepSeek-V2 / V3, absorbed form): every query row of a sequence (H heads x Lq new
// tokens) against one latent cache whose 576-column rows are the keys and whose first 512 columns are
// the values. Formula and layouts: include/kernelforge/mla.h.
//
// Napkin math: the cache is read once per (sequence, split): n * 576 * 2 bytes, against 2 * H * Lq *
// n * (576 + 512) FLOPs, about 240 FLOP per byte at H = 128, Lq = 1. At 2.5 TB/s that is ~600 TF/s:
// more than mma.sync reaches on an H100, so the kernel is built around tensor-core reuse, not bytes in
// flight. All query rows of a sequence share each cache tile (they are the M side of the products, as
// the GQA group is in decode_attention.cuh); 64 rows per CTA, so H = 128 runs two row-tile CTAs that
// are adjacent in the grid (blockIdx.x) and share the tile reads through L2: DRAM sees the cache once.
//
// One CTA per (row tile, split, sequence), 8 warps, 32 cache rows per pipeline stage, a kStages-deep
// cp.async ring (each row's address through the block table, read one tile ahead of its copy). Q (64 x
// 576) stays in shared memory for the whole key loop; its fragments are read with ldmatrix (in
// registers they would take 144 per thread next to the 128 output accumulators). Per stage:
//   S = Q K^T     warp w computes rows 16 (w % 4) .. +16 against keys 16 (w / 4) .. +16 over all 576
//                 columns: 36 k-steps of one ldmatrix of Q, one of K, two mma.
//   softmax       the two warps of a row block exchange their row maxima through shared memory (one
//                 barrier), then each writes its 16 x 16 block of P = 2^(s - m) (T) to shared memory and
//                 the rescale 2^(m_old - m_new) of its rows; each keeps its own partial row sums.
//   O += P V      warp w owns output columns 64 w .. +64 for all 64 rows (4 x 8 m16n8 tiles, 128 float
//                 accumulators per thread); V is the K tile's first 512 columns (ldmatrix.trans), so the
//                 cache row is read from global memory once for both products.
// Three barriers per stage: the ring (tile landed / stage free), the row maxima, P ready. Row blocks
// past the H * Lq rows (H = 16, odd H) skip their mma: a small H costs as much as H = 64 per tile
// only where mma is not the bound anyway (30 FLOP per byte at H = 16).
//
// splits == 1: the CTA writes out and lse. splits > 1: it writes its normalized partial output and
// log2-sum-exp (float32, the workspace) and decode_merge.cuh (D = 512) combines the splits.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "common/launch.cuh"
#include "decode/decode_problem.h"
#include "decode/kernels/decode_attention.cuh"  // key_range and the mma / cp.async helpers
#include "decode/mla_config.h"

namespace kernelforge {
namespace decode {

template <typename T, int kStages>
__global__ void __launch_bounds__(kMlaWarps * 32, 1)
    mla_decode_kernel(DecodeParams p, int splits, float* ws_o, float* ws_lse) {
  if constexpr (!arch_supports<T>()) {
    __trap();
  } else {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    constexpr int kDk = kMlaHeadDimK, kDv = kMlaHeadDimV;
    constexpr int kRows = kMlaRows, kBlockN = kMlaBlockN, kThreads = kMlaWarps * 32;
    constexpr int kStride = kMlaStride, kPStride = kMlaPStride;
    constexpr int kMTiles = kRows / 16;                 // m16 row blocks per CTA
    constexpr int kThreadsPerRow = kThreads / kBlockN;  // threads copying one cache row
    constexpr int kCopies = kDk / 8 / kThreadsPerRow;   // 16-byte chunks per thread and row
    constexpr int kColsPerWarp = kDv / kMlaWarps;       // P V: output columns per warp
    constexpr int kNd = kColsPerWarp / 8;               // ... in n8 tiles
    static_assert(kStages >= 2, "the ring needs a stage in flight");
    static_assert(kMlaWarps == 2 * kMTiles && kBlockN == 32, "S: two 16-key halves per row block");
    static_assert(kThreads % kBlockN == 0 && (kDk / 8) % kThreadsPerRow == 0 && kRows % kBlockN == 0,
                  "row copies split over threads");
    static_assert(kColsPerWarp % 16 == 0, "P V: 16-column ldmatrix.trans blocks per warp");

    extern __shared__ __align__(16) uint16_t smem[];
    uint16_t* sq = smem;                                             // [kRows][kStride]
    uint16_t* skv = sq + kRows * kStride;                            // [kStages][kBlockN][kStride]
    uint16_t* sp = skv + kStages * kBlockN * kStride;                // [kRows][kPStride]
    float* s_max = reinterpret_cast<float*>(sp + kRows * kPStride);  // [2][kRows]: each key half's tile max
    float* s_alpha = s_max + 2 * kRows;                              // [kRows]: this tile's rescale
    float* s_sum = s_alpha + kRows;                                  // [2][kRows]: final partial sums
    float* s_m = s_sum + 2 * kRows;                                  // [kRows]: final running max

    const int row_tile = blockIdx.x, split = blockIdx.y, b = blockIdx.z;
    const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
    const int g = lane / 4, tq = lane % 4;
    const int r_first = row_tile * kRows;
    const int rows_here = min(kRows, p.rows - r_first);

    pdl_wait();
    const KeyRange kr = key_range<kBlockN>(p, b, r_first, r_first + rows_here - 1, split, splits);

    // ---- copies: thread copies chunks lc, lc + 8, ... of row lr (of Q: rows lr and lr + 32) ----
    const int lr = tid / kThreadsPerRow, lc = tid % kThreadsPerRow;
#pragma unroll
    for (int k = 0; k < kRows / kBlockN; ++k) {
      const int r = lr + k * kBlockN;
      const bool ok = r < rows_here;  // padding rows are zero-filled
      const int rg = r_first + (ok ? r : 0), t = rg / p.group, h = rg % p.group;
      const uint16_t* src = static_cast<const uint16_t*>(p.q) + b * p.q_sb + t * p.q_st + h * p.q_sh + lc * 8;
#pragma unroll
      for (int i = 0; i < kCopies; ++i)
        cp_async16(smem_addr(sq + r * kStride + (lc + i * kThreadsPerRow) * 8), src + i * kThreadsPerRow * 8, ok);
    }
    const uint16_t* kvbase = static_cast<const uint16_t*>(p.k_cache) + lc * 8;
    const int32_t* bt = p.block_table != nullptr ? p.block_table + b * p.bt_sb : nullptr;
    const int32_t page_mask = p.page_size - 1;
    // The page of this thread's row of the tile at tile_start, read one tile ahead of its copy; -1: no
    // key (zero-filled) or a block-table entry outside the cache (reads zeros).
    auto fetch_page = [&](int tile_start) -> int32_t {
      const int32_t j = tile_start + lr;
      if (j >= kr.end) return -1;
      const int32_t page = bt != nullptr ? __ldg(bt + (j >> p.page_shift)) : b;
      return page >= 0 && page < p.pages ? page : -1;
    };
    auto load_tile = [&](int tile_start, int stage, int32_t page) {
      const int32_t j = tile_start + lr;
      const bool ok = page >= 0;
      const int32_t row = bt != nullptr ? (j & page_mask) : j;
      const uint16_t* src = kvbase + (ok ? page * p.k_sp + int64_t(row) * p.k_st : 0);
      uint16_t* dst = skv + (stage * kBlockN + lr) * kStride + lc * 8;
#pragma unroll
      for (int i = 0; i < kCopies; ++i)
        cp_async16(smem_addr(dst + i * kThreadsPerRow * 8), src + i * kThreadsPerRow * 8, ok);
    };

    const int n_tiles = (kr.end - kr.start + kBlockN - 1) / kBlockN;
    int32_t next_page;  // the page of this thread's row of the next tile to copy
    {
      int32_t first[kStages - 1];  // every table read of the prologue in flight at once
#pragma unroll
      for (int s = 0; s < kStages - 1; ++s) first[s] = fetch_page(kr.start + s * kBlockN);
#pragma unroll
      for (int s = 0; s < kStages - 1; ++s) {  // the Q copies join the first group
        if (s < n_tiles) load_tile(kr.start + s * kBlockN, s, first[s]);
        cp_async_commit();
      }
      next_page = fetch_page(kr.start + (kStages - 1) * kBlockN);
    }

    // ---- S roles: row block mt, key half kh; this thread's rows mt * 16 + g + 8 hf ----
    const int mt = warp % kMTiles, kh = warp / kMTiles;
    const bool s_active = mt * 16 < rows_here;
    int32_t row_hi[2];  // the last key each row sees (-1: a padding row sees nothing)
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) {
      const int r = mt * 16 + g + 8 * hf;
      row_hi[hf] = r < rows_here ? kr.n - p.q_len + (r_first + r) / p.group : -1;
    }
    float m_run[2] = {-INFINITY, -INFINITY};  // running max (log2 domain), the same in both key halves
    float l_run[2] = {0.0f, 0.0f};            // this thread's part of the running sum (4 of its warp's 16 keys)

    // ---- P V role: output columns c0 .. c0 + 64 of every row ----
    const int c0 = warp * kColsPerWarp;
    float o[kMTiles][kNd][4];
#pragma unroll
    for (int mb = 0; mb < kMTiles; ++mb)
#pragma unroll
      for (int nd = 0; nd < kNd; ++nd)
#pragma unroll
        for (int e = 0; e < 4; ++e) o[mb][nd][e] = 0.0f;
    const float scale_log2 = p.scale * kLog2e;

    for (int it = 0; it < n_tiles; ++it) {
      cp_async_wait<kStages - 2>();
      __syncthreads();  // tile it (and Q) landed; every warp is done with tile it - 1's stage and P
      {
        const int nt = it + kStages - 1;
        if (nt < n_tiles) {
          load_tile(kr.start + nt * kBlockN, nt % kStages, next_page);
          next_page = fetch_page(kr.start + (nt + 1) * kBlockN);
        }
        cp_async_commit();
      }
      const uint16_t* sk = skv + (it % kStages) * kBlockN * kStride;

      // S = Q K^T: 16 rows x 16 keys per warp, s[n8][e]
      float s[2][4];
#pragma unroll
      for (int e = 0; e < 8; ++e) s[e / 4][e % 4] = 0.0f;
      if (s_active) {
#pragma unroll
        for (int kk = 0; kk < kDk / 16; ++kk) {
          uint32_t a[4], kb[4];
          ldmatrix_x4(smem_addr(sq + (mt * 16 + lane % 16) * kStride + kk * 16 + 8 * (lane / 16)), a);
          ldmatrix_x4(smem_addr(sk + (kh * 16 + lane % 8 + 8 * (lane / 16)) * kStride + kk * 16 + 8 * ((lane / 8) % 2)),
                      kb);
          mma_16816<T>(s[0], a, kb[0], kb[1]);
          mma_16816<T>(s[1], a, kb[2], kb[3]);
        }
      }

      // mask and scale into the log2 domain; this warp's row maxima to shared memory
      const int32_t j0 = kr.start + it * kBlockN + kh * 16 + 2 * tq;
      float x[2][4];
#pragma unroll
      for (int hf = 0; hf < 2; ++hf) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int32_t j = j0 + (e / 2) * 8 + (e % 2);
          const bool vis = j < kr.end && j <= row_hi[hf];
          x[hf][e] = vis ? s[e / 2][2 * hf + e % 2] * scale_log2 : -INFINITY;
        }
        float mx = fmaxf(fmaxf(x[hf][0], x[hf][1]), fmaxf(x[hf][2], x[hf][3]));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
        if (tq == 0) s_max[kh * kRows + mt * 16 + g + 8 * hf] = mx;
      }
      __syncthreads();  // both key halves' maxima

      // online softmax: P (T) and the rows' rescale to shared memory
#pragma unroll
      for (int hf = 0; hf < 2; ++hf) {
        const int r = mt * 16 + g + 8 * hf;
        const float m_new = fmaxf(m_run[hf], fmaxf(s_max[r], s_max[kRows + r]));
        const float m_use = m_new == -INFINITY ? 0.0f : m_new;  // no visible key yet: p = 0
        const float alpha = ex2_approx(m_run[hf] - m_use);
        m_run[hf] = m_new;
        float sum = 0.0f;
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          x[hf][e] = ex2_approx(x[hf][e] - m_use);
          sum += x[hf][e];
        }
        l_run[hf] = l_run[hf] * alpha + sum;
        if (kh == 0 && tq == 0) s_alpha[r] = alpha;
        *reinterpret_cast<uint32_t*>(sp + r * kPStride + kh * 16 + 2 * tq) = pack2<T>(x[hf][0], x[hf][1]);
        *reinterpret_cast<uint32_t*>(sp + r * kPStride + kh * 16 + 8 + 2 * tq) = pack2<T>(x[hf][2], x[hf][3]);
      }
      __syncthreads();  // P and the rescale of every row

      // O = O * alpha + P V over the tile's 32 keys, this warp's 64 columns (V: the tile's first 512)
#pragma unroll
      for (int mb = 0; mb < kMTiles; ++mb)
#pragma unroll
        for (int hf = 0; hf < 2; ++hf) {
          const float alpha = s_alpha[mb * 16 + g + 8 * hf];
#pragma unroll
          for (int nd = 0; nd < kNd; ++nd) {
            o[mb][nd][2 * hf] *= alpha;
            o[mb][nd][2 * hf + 1] *= alpha;
          }
        }
#pragma unroll
      for (int kk = 0; kk < kBlockN / 16; ++kk) {
        uint32_t vb[kNd / 2][4];
#pragma unroll
        for (int n2 = 0; n2 < kNd / 2; ++n2)
          ldmatrix_x4_trans(smem_addr(sk + (kk * 16 + lane % 16) * kStride + c0 + n2 * 16 + 8 * (lane / 16)), vb[n2]);
#pragma unroll
        for (int mb = 0; mb < kMTiles; ++mb) {
          if (mb * 16 >= rows_here) continue;  // padding row block: nothing to accumulate
          uint32_t a[4];
          ldmatrix_x4(smem_addr(sp + (mb * 16 + lane % 16) * kPStride + kk * 16 + 8 * (lane / 16)), a);
#pragma unroll
          for (int n2 = 0; n2 < kNd / 2; ++n2) {
            mma_16816<T>(o[mb][2 * n2], a, vb[n2][0], vb[n2][1]);
            mma_16816<T>(o[mb][2 * n2 + 1], a, vb[n2][2], vb[n2][3]);
          }
        }
      }
    }
    cp_async_wait<0>();
    pdl_trigger();

    // ---- the rows' sums (two key halves) and maxima to shared memory, then each warp its columns ----
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) {
      float l = l_run[hf];
      l += __shfl_xor_sync(0xffffffffu, l, 1);
      l += __shfl_xor_sync(0xffffffffu, l, 2);
      const int r = mt * 16 + g + 8 * hf;
      if (tq == 0) {
        s_sum[kh * kRows + r] = l;
        if (kh == 0) s_m[r] = m_run[hf];
      }
    }
    __syncthreads();

#pragma unroll
    for (int mb = 0; mb < kMTiles; ++mb)
#pragma unroll
      for (int hf = 0; hf < 2; ++hf) {
        const int r = mb * 16 + g + 8 * hf;
        if (r >= rows_here) continue;
        const float l = s_sum[r] + s_sum[kRows + r];
        const float m = s_m[r];
        const float inv = l > 0.0f ? 1.0f / l : 0.0f;
        const float lse2 = l > 0.0f ? m + __log2f(l) : -INFINITY;
        const int rg = r_first + r, t = rg / p.group, h = rg % p.group;
        if (splits == 1) {
          uint16_t* out = static_cast<uint16_t*>(p.out) + b * p.o_sb + t * p.o_st + h * p.o_sh + c0 + 2 * tq;
#pragma unroll
          for (int nd = 0; nd < kNd; ++nd) {
            const uint32_t pk = pack2<T>(o[mb][nd][2 * hf] * inv, o[mb][nd][2 * hf + 1] * inv);
            out[nd * 8] = uint16_t(pk & 0xffffu);
            out[nd * 8 + 1] = uint16_t(pk >> 16);
          }
          if (p.lse != nullptr && warp == 0 && tq == 0) p.lse[b * p.lse_sb + t * p.lse_st + h] = lse2 * kLn2;
        } else {
          const int64_t row = (int64_t(b) * p.q_len + t) * p.heads_q + h;
          float* dst = ws_o + (row * splits + split) * kDv + c0 + 2 * tq;
#pragma unroll
          for (int nd = 0; nd < kNd; ++nd)
            *reinterpret_cast<float2*>(dst + nd * 8) =
                make_float2(o[mb][nd][2 * hf] * inv, o[mb][nd][2 * hf + 1] * inv);
          if (warp == 0 && tq == 0) ws_lse[row * splits + split] = lse2;
        }
      }
#endif
  }
}

}  // namespace decode
}  // namespace kernelforge
