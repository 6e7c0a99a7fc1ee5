// MLA decode on Hopper (sm_90a), seesaw schedule: the wgmma kernel's tile, TMA ring and epilogue
// (mla_decode_wgmma.cuh), with the two consumer warpgroups taking alternate key tiles so that each does
// the same tensor work. Formula and layouts: include/kernelforge/mla.h. Not yet run on a GPU.
//
// Napkin math (H = 128, Lq = 1, page 64, bf16, b64 x kv4k: 128 CTAs, 64 tiles each).
//   Tensor work per 64-key tile: S = Q K^T 64 x 64 x 576 = 2.36 M MAC, P V 64 x 512 x 64 = 2.10 M MAC.
//   The wgmma kernel: consumer 0 issues S and its P V half (3.41 M MAC per tile), consumer 1 only its
//   half (1.05 M) and waits for P: the chain per tile is consumer 0's, 3.41 M MAC + softmax + P hand-off.
//   Here, per pair of tiles (2i even, 2i+1 odd), each consumer issues one S (2.36 M) and two P V halves
//   (2 x 1.05 M): 4.46 M MAC each, 8.9 M per pair in the SM's tensor pipe (2,048 MAC / clock:
//   4,350 clocks = 2.5 us at 1.75 GHz; 64 tiles = 32 pairs = 80 us per CTA at full rate). While one
//   consumer runs its softmax (CUDA cores) the other's wgmmas keep the pipe busy.
//   Memory: 72 KB per tile per CTA, shared with the sequence's other row-tile CTA through L2: 302 MB
//   at ~4 TB/s = 75 us. The ring's half-stage barriers let the next pair's loads start while the
//   current pair's P V still runs (below).
//   Shared memory (MlaSeesawSmem): Q 72 KB + 2 x 72 KB ring + P1 8 KB + 1.5 KB statistics + 64 B
//   barriers = 230,976 B (+1 KB alignment slack) of 232,448. The even tile's rescaled P goes into its
//   stage's rope column tile (64 x 64 x 2 B = 8 KB, dead once that tile's S is done), so only the odd
//   tile's P needs a buffer; a third K stage (72 KB) does not fit.
//   Registers per consumer thread (setmaxnreg 240): O 64 x 256 float32 / 128 threads = 128, S / P
//   float32 64 x 64 / 128 = 32 (consumer 0 keeps its float P until the other's rescale is known), P as
//   the 16-bit A operand of the local P V 16, ~40 for addresses, row statistics and indices: ~216.
//   Producer: 24 (one thread issues TMA; 128 x 24 + 256 x 240 = 64,512 <= 65,536).
//
// Schedule. Tile t lives in ring stage t % 2; consumer c (warpgroup c + 1) computes S of the tiles of
// stage c and owns output columns 256 c .. 256 c + 255. One running row max m is handed back and forth
// (FlashMLA's "seesaw" identity, its 2025-04 deep-dive write-up): per pair (2i, 2i+1), M = m after 2i-1,
//   c0: m0 = max(M, rowmax S_2i), a0 = 2^(M - m0), P0 = 2^(S_2i - m0); O_lo = a0 O_lo + P0 V_2i[lo]
//   c1: m1 = max(m0, rowmax S_2i+1), a1 = 2^(m0 - m1), P1 = 2^(S_2i+1 - m1);
//       O_hi = a0 a1 O_hi + P1 V_2i+1[hi]
//   c0: P0' = a1 P0 (to shared memory); O_lo = a1 O_lo + P1 V_2i+1[lo]   (P1 from shared memory)
//   c1: O_hi += P0' V_2i[hi]
// after which both halves of O and both sums are relative to m1 (l0 over the even tiles, l1 over the
// odd ones; the epilogue adds them). The local P V takes P from registers (wgmma RS), the remote one
// from shared memory (SS). Hand-offs, named barriers of 256 threads (one side arrives, the other
// syncs, once per pair each, so arrivals never run a generation ahead):
//   SCALE0 (c0 -> c1: m0, a0)  SCALE1 (c1 -> c0: m1, a1)  P1 (c1 -> c0: P1 stored)
//   P0 (c0 -> c1: P0' stored)  EPI (both: l0, l1)  + ZERO0 / ZERO1 (128 threads, after zeroing rows).
// Per pair, consumer 0: softmax 2i, SCALE0, local P V, wait, SCALE1, P0', P0, remote P V, then S of
// 2i+2 (lo half, wait for the remote P V, hi half). Consumer 1: SCALE0, softmax 2i+1, SCALE1, P1, local
// P V, P0, wait, remote P V, then S of 2i+3 (hi half, wait for the remote P V, lo half). The tensor pipe
// sees c1's S during c0's softmax, c0's local P V during c1's softmax, c1's local P V while c0 rescales
// and stores P0', then both remote P Vs and the halves of both next S whose loads started first.
//
// Ring halves: lo = column tiles 0-3 (value columns 0-255), hi = column tiles 4-8 (values 256-511 and
// the rope columns), each with a full mbarrier (the producer's expect_tx) and an empty one counting the
// consumer warps (lane 0 each) that read it:
//   stage 0 lo: c0 (S, local P V)            4 warps
//   stage 0 hi: c0 (S, P0' written), c1 (remote P V reads V and P0')   8
//   stage 1 lo: c1 (S), c0 (remote P V)      8
//   stage 1 hi: c1 (S, local P V)            4
// The producer loads per pair in release order: 2i lo, 2i+1 hi, 2i hi, 2i+1 lo. Each consumer starts
// the S of its next tile on the half loaded first for it (c0: lo, requested after its local P V; c1:
// hi, requested after its local P V) while the other half still loads. No wait closes a cycle (checked
// on a model of the protocol for 0-11 tiles): c0 waits for 2i+2 lo, the producer's first load of the
// pair, then releases stage 1 lo before it waits for 2i+2 hi; c1 waits for 2i+3 hi, the second load,
// then releases stage 0 hi (needed by 2i+2 hi) before it waits for 2i+3 lo, the last.
//
// Corner cases are the wgmma kernel's: causal mask by index on tiles that cross a row's last key or
// the range end; TMA zeros for keys past the range and block-table entries outside [0, P); value rows
// of the last tile past the range set to zero by each consumer in its own columns before its P V of
// that tile (after that tile's S has completed: the owner knows it, the other consumer syncs P0 / P1
// first); rows past H * Lq computed on zero queries and not stored; splits write normalized partials
// and log2-sum-exp for decode_merge.cuh.
#pragma once

#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "attention/kernels/sm90_wgmma.cuh"
#include "common/launch.cuh"
#include "common/tma.cuh"
#include "decode/decode_problem.h"
#include "decode/kernels/decode_attention.cuh"  // key_range, cp_async16, kLog2e / kLn2
#include "decode/kernels/mla_decode_wgmma.cuh"  // wgmma_pv_n256 (P from shared memory)
#include "decode/mla_config.h"

namespace kernelforge {
namespace decode {

// D[64 x 256] += A[64 x 16] * B[16 x 256]: A from registers (sm90_wgmma.cuh's A fragment), B MN-major
// (transposed) from shared memory.
#define KF_WGMMA_RS_N256_TB(TY)                                                                                        \
  asm volatile(                                                                                                        \
      "{\n.reg .pred p;\nsetp.ne.b32 p, %133, 0;\n"                                                                    \
      "wgmma.mma_async.sync.aligned.m64n256k16.f32." TY "." TY                                                         \
      " {"                                                                                                             \
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, " \
      "%24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, " \
      "%46, %47, "                                                                                                     \
      "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, %64, %65, %66, %67, %68, %69, " \
      "%70, %71, "                                                                                                     \
      "%72, %73, %74, %75, %76, %77, %78, %79, %80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, " \
      "%94, %95, "                                                                                                     \
      "%96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, %112, %113, %114, " \
      "%115, %116, %117, %118, %119, "                                                                                 \
      "%120, %121, %122, %123, %124, %125, %126, %127"                                                                 \
      "},"                                                                                                             \
      " {%128, %129, %130, %131}, %132, p, 1, 1, 1;\n}\n"                                                              \
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]),    \
        "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]),         \
        "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]),        \
        "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]),        \
        "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]),        \
        "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]),        \
        "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]),        \
        "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]), "+f"(d[64]),        \
        "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]), "+f"(d[72]),        \
        "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]), "+f"(d[80]),        \
        "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]), "+f"(d[88]),        \
        "+f"(d[89]), "+f"(d[90]), "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95]), "+f"(d[96]),        \
        "+f"(d[97]), "+f"(d[98]), "+f"(d[99]), "+f"(d[100]), "+f"(d[101]), "+f"(d[102]), "+f"(d[103]), "+f"(d[104]),   \
        "+f"(d[105]), "+f"(d[106]), "+f"(d[107]), "+f"(d[108]), "+f"(d[109]), "+f"(d[110]), "+f"(d[111]),              \
        "+f"(d[112]), "+f"(d[113]), "+f"(d[114]), "+f"(d[115]), "+f"(d[116]), "+f"(d[117]), "+f"(d[118]),              \
        "+f"(d[119]), "+f"(d[120]), "+f"(d[121]), "+f"(d[122]), "+f"(d[123]), "+f"(d[124]), "+f"(d[125]),              \
        "+f"(d[126]), "+f"(d[127])                                                                                     \
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(1))

template <typename T>
__device__ __forceinline__ void wgmma_pv_rs_n256(float (&d)[128], const uint32_t* a, uint64_t desc_b) {
#if KF_SM90A
  if constexpr (std::is_same<T, __nv_bfloat16>::value)
    KF_WGMMA_RS_N256_TB("bf16");
  else
    KF_WGMMA_RS_N256_TB("f16");
#else
  (void)d, (void)a, (void)desc_b;
#endif
}
#undef KF_WGMMA_RS_N256_TB

// One half of S = Q K^T: column tiles [kC0, kC1) of Q and of one K stage, 4 k-slices of 16 columns per
// tile (32 bytes apart inside the swizzled 128-byte rows), after the half's full barrier; kFirst: the
// first slice overwrites S. Each half is its own wgmma.fence + commit group, so the wait loop before it
// is outside any wgmma chain (inside one, ptxas inserts its own fence and serializes the wgmmas). The
// descriptors' address field takes the byte offset >> 4 (no carry: shared addresses < 2^18); the
// opaque copies keep the compiler from hoisting them out of the pair loop.
template <typename T, int kC0, int kC1, bool kFirst>
__device__ __forceinline__ void seesaw_gemm_s(float (&s)[32], uint64_t* full, uint32_t parity, uint32_t q_addr,
                                              uint32_t k_addr) {
  mbar_wait(full, parity);
  uint64_t dq = gmma_desc_k(q_addr), dk = gmma_desc_k(k_addr);
  asm volatile("" : "+l"(dq), "+l"(dk));
  reg_fence(s);  // the accumulator's last reads (softmax, P stores) before the fence
  wgmma_fence();
#pragma unroll
  for (int c = kC0; c < kC1; ++c)
#pragma unroll
    for (int k4 = 0; k4 < 4; ++k4) {
      const uint64_t off = uint64_t(c * MlaSeesawSmem::kTileBytes + k4 * 32) >> 4;
      wgmma_ss<T, 64>(s, dq + off, dk + off, (kFirst && c == kC0 && k4 == 0) ? 0 : 1);
    }
  wgmma_commit();
}

// Grid (row tiles, splits, B), kMlaWgmmaWarps * 32 threads, MlaSeesawSmem::kBytes of dynamic shared
// memory; the arguments are mla_decode_wgmma_kernel's.
template <typename T>
__global__ void __launch_bounds__(kMlaWgmmaWarps * 32, 1)
    mla_decode_wgmma_seesaw_kernel(const __grid_constant__ CUtensorMap tm_kv, const DecodeParams p, int box_rows,
                                   int splits, float* ws_o, float* ws_lse) {
#if KF_SM90A
  using L = MlaSeesawSmem;
  constexpr int kBN = kMlaWgmmaBlockN, kRows = kMlaRows;
  constexpr int kColTiles = kMlaHeadDimK / 64;  // 9 column tiles of 64 per cache row / Q row
  constexpr int kLo = kMlaSeesawLoTiles;        // column tiles 0-3 form a stage's lo half
  constexpr int kHalf = kMlaHeadDimV / 2;       // output columns per consumer
  constexpr int kBarQ = 1, kBarScale0 = 2, kBarScale1 = 3, kBarP1 = 4, kBarP0 = 5, kBarEpi = 6;
  constexpr int kBarZero = 7;  // + consumer
  constexpr int kConsumers = 256;

  extern __shared__ uint8_t smem_raw[];
  uint8_t* smem = smem_raw + ((1024 - (smem_u32(smem_raw) & 1023)) & 1023);
  float* s_m0 = reinterpret_cast<float*>(smem + L::kM0);
  float* s_scale0 = reinterpret_cast<float*>(smem + L::kScale0);
  float* s_m1 = reinterpret_cast<float*>(smem + L::kM1);
  float* s_scale1 = reinterpret_cast<float*>(smem + L::kScale1);
  float* s_l0 = reinterpret_cast<float*>(smem + L::kL0);
  float* s_l1 = reinterpret_cast<float*>(smem + L::kL1);
  // full[2 s + h], empty[2 s + h]: stage s, half h (0 lo, 1 hi)
  uint64_t* full = reinterpret_cast<uint64_t*>(smem + L::kBars);
  uint64_t* empty = full + 2 * kMlaWgmmaStages;

  const int row_tile = blockIdx.x, split = blockIdx.y, b = blockIdx.z;
  const int r_first = row_tile * kRows;
  const int rows_here = min(kRows, p.rows - r_first);

  pdl_wait();  // seq_lens, the block table and every load follow the previous kernel
  const KeyRange kr = key_range<kBN>(p, b, r_first, r_first + rows_here - 1, split, splits);
  const int n_tiles = (kr.end - kr.start + kBN - 1) / kBN;
  const int n_pairs = (n_tiles + 1) / 2;

  if (threadIdx.x == 0) {
    for (int s = 0; s < kMlaWgmmaStages; ++s)
      for (int h = 0; h < 2; ++h) {
        mbar_init_count(&full[2 * s + h], 1);                // the producer's expect_tx arrival + the bytes
        mbar_init_count(&empty[2 * s + h], s == h ? 4 : 8);  // reader warps, table in the header
      }
    mbar_init_fence();
  }
  __syncthreads();

  const int wg = threadIdx.x / 128;
  if (wg == 0) {
    // ---- producer ----
    setmaxnreg_dec<kMlaWgmmaProducerRegs>();
    if (threadIdx.x == 0 && n_tiles > 0) {
      tma_prefetch_desc(&tm_kv);
      const int32_t* bt = p.block_table != nullptr ? p.block_table + b * p.bt_sb : nullptr;
      const int chunks = kBN / box_rows;
      // One half of tile `it` (column tiles [c0, c1)) into stage it % 2 once its readers released it.
      auto load_half = [&](int it, int h) {
        const int s = it % 2, use = it / 2;
        const int c0 = h == 0 ? 0 : kLo, c1 = h == 0 ? kLo : kColTiles;
        mbar_wait(&empty[2 * s + h], (use & 1) ^ 1);  // a fresh barrier passes parity 1 at once
        mbar_expect(&full[2 * s + h], (c1 - c0) * L::kTileBytes);
        const int32_t j0 = kr.start + it * kBN;
        for (int pc = 0; pc < chunks; ++pc) {
          const int32_t j = j0 + pc * box_rows;
          int32_t page = -1, row = 0;  // page -1: past the range, read as zeros
          if (j < kr.end) {
            page = bt != nullptr ? __ldg(bt + (j >> p.page_shift)) : b;
            row = bt != nullptr ? (j & (p.page_size - 1)) : j;
          }
          uint8_t* dst = smem + L::kK + s * L::kKBytes + pc * box_rows * 128;
          for (int c = c0; c < c1; ++c)
            tma_load_4d(dst + c * L::kTileBytes, &tm_kv, &full[2 * s + h], c * 64, row, page, 0);
        }
      };
      for (int i = 0; i < n_pairs; ++i) {  // release order: 2i lo, 2i+1 hi, 2i hi, 2i+1 lo
        const bool has1 = 2 * i + 1 < n_tiles;
        load_half(2 * i, 0);
        if (has1) load_half(2 * i + 1, 1);
        load_half(2 * i, 1);
        if (has1) load_half(2 * i + 1, 0);
      }
    }
    return;
  }

  // ---- consumers ----
  setmaxnreg_inc<kMlaWgmmaConsumerRegs>();
  const int cw = wg - 1;  // computes S of the tiles in stage cw; output columns 256 cw .. 256 cw + 255
  const int tid = threadIdx.x - 128 * wg, warp = tid / 32, lane = tid % 32;

  // Q tile: 64 rows x 72 chunks of 16 bytes, 18 per consumer thread, into the swizzled column tiles;
  // rows past rows_here are zero-filled.
  {
    constexpr int kChunks = kMlaHeadDimK / 8;
    const int ct = threadIdx.x - 128;
#pragma unroll
    for (int k = 0; k < kRows * kChunks / kConsumers; ++k) {
      const int i = ct + k * kConsumers;
      const int r = i / kChunks, c = i % kChunks;
      const bool ok = r < rows_here;
      const int rg = r_first + (ok ? r : 0), t = rg / p.group, h = rg % p.group;
      const uint16_t* src = static_cast<const uint16_t*>(p.q) + b * p.q_sb + t * p.q_st + h * p.q_sh + c * 8;
      cp_async16(smem_u32(smem + L::kQ + (c / 8) * L::kTileBytes + r * 128 + (((c % 8) ^ (r % 8)) * 16)), src, ok);
    }
    cp_async_commit();
    cp_async_wait<0>();
    fence_proxy_async();  // the copies are generic-proxy writes; wgmma reads through the async proxy
    named_sync(kBarQ, kConsumers);
  }

  const uint32_t q_addr = smem_u32(smem + L::kQ);
  const uint32_t k_addr0 = smem_u32(smem + L::kK);
  int rloc[2];  // this thread's two accumulator rows (of the 64)
#pragma unroll
  for (int i = 0; i < 2; ++i) rloc[i] = 16 * warp + lane / 4 + 8 * i;
  const float scale_log2 = p.scale * kLog2e;
  int32_t row_hi[2];  // the last key each row sees (-1: a padding row)
#pragma unroll
  for (int i = 0; i < 2; ++i) row_hi[i] = rloc[i] < rows_here ? kr.n - p.q_len + (r_first + rloc[i]) / p.group : -1;
  // keys below full_end are visible to every row of the tile (the earliest token's last key + 1)
  const int32_t full_end = min(kr.end, kr.n - p.q_len + r_first / p.group + 1);
  const int tail_valid = n_tiles > 0 ? kr.end - (kr.start + (n_tiles - 1) * kBN) : kBN;  // 1..64

  float o[128];
#pragma unroll
  for (int e = 0; e < 128; ++e) o[e] = 0.0f;
  float s[32];  // S of this consumer's current tile, then its P (float32)
#pragma unroll
  for (int e = 0; e < 32; ++e) s[e] = 0.0f;
  uint32_t pa[16];  // P as the 16-bit A operand of the local P V: pa[4 kk + r] is k-slice kk's a[r]
  float m_run[2] = {-INFINITY, -INFINITY};  // the rows' running max (log2 domain), after the last pair
  float l_run[2] = {0.0f, 0.0f};            // this thread's part of the rows' sums over this consumer's tiles

  auto rescale_o = [&](const float(&f)[2]) {
#pragma unroll
    for (int e = 0; e < 128; ++e) o[e] *= f[(e >> 1) & 1];
  };
  // Online softmax of tile `it` in place against the running max m_prev: s becomes p = 2^(x - m_new),
  // x = scale log2(e) s (-inf where masked); alpha = 2^(m_prev - m_new); l = l alpha + the row sums.
  auto softmax = [&](int it, const float(&m_prev)[2], float(&m_new)[2], float(&alpha)[2]) {
    const int32_t j0 = kr.start + it * kBN;
    const bool edge = j0 + kBN > full_end;
#pragma unroll
    for (int e = 0; e < 32; ++e) {
      float x = s[e] * scale_log2;
      if (edge) {
        const int32_t j = j0 + 8 * (e / 4) + 2 * (lane % 4) + (e % 2);
        if (j >= kr.end || j > row_hi[(e / 2) % 2]) x = -INFINITY;
      }
      s[e] = x;
    }
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      float mx = m_prev[i];
#pragma unroll
      for (int j = 0; j < 8; ++j) mx = fmaxf(mx, fmaxf(s[4 * j + 2 * i], s[4 * j + 2 * i + 1]));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
      const float m_use = mx == -INFINITY ? 0.0f : mx;  // no visible key yet: p = 0
      alpha[i] = ex2_approx(m_prev[i] - m_use);
      m_new[i] = mx;
      float sum = 0.0f;
#pragma unroll
      for (int j = 0; j < 8; ++j)
#pragma unroll
        for (int c = 0; c < 2; ++c) {
          const float e = ex2_approx(s[4 * j + 2 * i + c] - m_use);
          s[4 * j + 2 * i + c] = e;
          sum += e;
        }
      l_run[i] = l_run[i] * alpha[i] + sum;
    }
  };
  // P to the A fragments: k-slice kk's a[r] is accumulator block 2 kk + r / 2, row half r % 2, which is
  // s[8 kk + 2 r], s[8 kk + 2 r + 1] (sm90_wgmma.cuh's layouts).
  auto pack_p = [&]() {
#pragma unroll
    for (int q = 0; q < 16; ++q) pa[q] = pack2<T>(s[2 * q], s[2 * q + 1]);
  };
  // f P (16-bit) into the swizzled 64 x 64 tile at `off`, for a wgmma of the other consumer.
  auto store_p = [&](int off, const float(&f)[2]) {
#pragma unroll
    for (int j = 0; j < 8; ++j)
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        const int byte = rloc[i] * 128 + ((j ^ (lane / 4)) * 16) + (lane % 4) * 4;  // rloc % 8 == lane / 4
        *reinterpret_cast<uint32_t*>(smem + off + byte) =
            pack2<T>(s[4 * j + 2 * i] * f[i], s[4 * j + 2 * i + 1] * f[i]);
      }
    fence_proxy_async();
  };
  // O[:, 256 cw + 0..255] += P V over a tile's 64 keys (4 k-slices of 16 keys = 2048 bytes of V rows),
  // P from registers (this consumer's tile) or from the shared tile at p_off (the other's).
  auto gemm_pv_local = [&](int stage) {
    const uint32_t v_addr = k_addr0 + stage * L::kKBytes + cw * (kHalf / 64) * L::kTileBytes;
    reg_fence(o);  // the rescale's writes stay before the fence
    reg_fence(pa);
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < kBN / 16; ++kk)
      wgmma_pv_rs_n256<T>(o, &pa[4 * kk], gmma_desc_mn(v_addr + kk * 16 * 128, L::kTileBytes));
    wgmma_commit();
  };
  auto gemm_pv_remote = [&](int stage, int p_off) {
    const uint32_t v_addr = k_addr0 + stage * L::kKBytes + cw * (kHalf / 64) * L::kTileBytes;
    const uint32_t p_addr = smem_u32(smem + p_off);
    reg_fence(o);
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < kBN / 16; ++kk)
      wgmma_pv_n256<T>(o, gmma_desc_k(p_addr + kk * 32), gmma_desc_mn(v_addr + kk * 16 * 128, L::kTileBytes));
    wgmma_commit();
  };
  // The last tile's value rows past the range (valid rows kept) set to zero in this consumer's columns.
  auto zero_tail = [&](int stage) {
    uint8_t* base = smem + L::kK + stage * L::kKBytes + cw * (kHalf / 64) * L::kTileBytes;
    const int n = (kBN - tail_valid) * 8 * (kHalf / 64);  // 16-byte chunks: rows x 8 x 4 column tiles
    for (int i = tid; i < n; i += 128) {
      const int tile = i / ((kBN - tail_valid) * 8), rem = i % ((kBN - tail_valid) * 8);
      *reinterpret_cast<int4*>(base + tile * L::kTileBytes + (tail_valid + rem / 8) * 128 + (rem % 8) * 16) =
          make_int4(0, 0, 0, 0);
    }
    fence_proxy_async();
    named_sync(kBarZero + cw, 128);
  };
  // S of this consumer's use-th tile in its stage, in two commit groups: first the half the producer
  // loads first for it (consumer 0: lo, consumer 1: hi), then the other.
  const uint32_t k_mine = k_addr0 + cw * L::kKBytes;
  auto gemm_s_first = [&](int use) {
    if (cw == 0)
      seesaw_gemm_s<T, 0, kLo, true>(s, &full[0], use & 1, q_addr, k_mine);
    else
      seesaw_gemm_s<T, kLo, kColTiles, true>(s, &full[3], use & 1, q_addr, k_mine);
  };
  auto gemm_s_second = [&](int use) {
    if (cw == 0)
      seesaw_gemm_s<T, kLo, kColTiles, false>(s, &full[1], use & 1, q_addr, k_mine);
    else
      seesaw_gemm_s<T, 0, kLo, false>(s, &full[2], use & 1, q_addr, k_mine);
  };
  auto release = [&](int stage, int h) {
    if (lane == 0) mbar_arrive(&empty[2 * stage + h]);
  };

  if (cw == 0) {
    // ---- consumer 0: even tiles (stage 0), output columns 0-255 ----
    if (n_tiles > 0) {
      gemm_s_first(0);
      gemm_s_second(0);
      wgmma_wait<0>();
      reg_fence(s);
    }
    for (int i = 0; i < n_pairs; ++i) {
      const int t0 = 2 * i;
      const bool has1 = t0 + 1 < n_tiles;
      float m0[2], a0[2];
      softmax(t0, m_run, m0, a0);
      if (lane % 4 == 0) {
#pragma unroll
        for (int k = 0; k < 2; ++k) s_m0[rloc[k]] = m0[k], s_scale0[rloc[k]] = a0[k];
      }
      named_arrive(kBarScale0, kConsumers);
      rescale_o(a0);
      pack_p();
      if (t0 + 1 == n_tiles && tail_valid < kBN) zero_tail(0);  // S of this tile has completed
      gemm_pv_local(0);
      wgmma_wait<0>();  // O is rescaled by a1 next
      reg_fence(o);
      reg_fence(pa);
      release(0, 0);  // stage 0 lo: S and the local P V done

      named_sync(kBarScale1, kConsumers);  // consumer 1's m1 and a1
      float a1[2];
#pragma unroll
      for (int k = 0; k < 2; ++k) a1[k] = s_scale1[rloc[k]], m_run[k] = s_m1[rloc[k]];
      store_p(L::kP0, a1);  // P0' = a1 P0 into stage 0's rope column tile
      named_arrive(kBarP0, kConsumers);
      release(0, 1);  // stage 0 hi: this consumer's S done and P0' written
      rescale_o(a1);
#pragma unroll
      for (int k = 0; k < 2; ++k) l_run[k] *= a1[k];

      named_sync(kBarP1, kConsumers);  // P1 stored (S of tile t0 + 1 has completed)
      if (has1) {
        if (t0 + 2 == n_tiles && tail_valid < kBN) zero_tail(1);
        gemm_pv_remote(1, L::kP1);
      }
      if (i + 1 < n_pairs) {  // S of tile t0 + 2 (has1 holds): its lo half behind the remote P V
        gemm_s_first(i + 1);
        wgmma_wait<1>();  // the remote P V is done
        reg_fence(o);
        release(1, 0);  // stage 1 lo: the remote P V done
        gemm_s_second(i + 1);
        wgmma_wait<0>();
        reg_fence(s);
      } else {
        wgmma_wait<0>();
        reg_fence(o);
        if (has1) release(1, 0);
      }
    }
  } else {
    // ---- consumer 1: odd tiles (stage 1), output columns 256-511 ----
    if (n_tiles > 1) {
      gemm_s_first(0);
      gemm_s_second(0);
      wgmma_wait<0>();
      reg_fence(s);
      release(1, 0);  // stage 1 lo: S done
    }
    for (int i = 0; i < n_pairs; ++i) {
      const int t1 = 2 * i + 1;
      const bool has1 = t1 < n_tiles;
      named_sync(kBarScale0, kConsumers);  // consumer 0's m0 and a0
      float m0[2], a0[2], a1[2] = {1.0f, 1.0f};
#pragma unroll
      for (int k = 0; k < 2; ++k) m0[k] = s_m0[rloc[k]], a0[k] = s_scale0[rloc[k]];
#pragma unroll
      for (int k = 0; k < 2; ++k) l_run[k] *= a0[k];
      if (has1) {
        softmax(t1, m0, m_run, a1);
      } else {
        m_run[0] = m0[0], m_run[1] = m0[1];
      }
      if (lane % 4 == 0) {
#pragma unroll
        for (int k = 0; k < 2; ++k) s_m1[rloc[k]] = m_run[k], s_scale1[rloc[k]] = a1[k];
      }
      named_arrive(kBarScale1, kConsumers);
      if (has1) {
        pack_p();
        const float one[2] = {1.0f, 1.0f};
        store_p(L::kP1, one);
      }
      named_arrive(kBarP1, kConsumers);
      const float a01[2] = {a0[0] * a1[0], a0[1] * a1[1]};
      rescale_o(a01);
      if (has1) {
        if (t1 + 1 == n_tiles && tail_valid < kBN) zero_tail(1);  // S of this tile has completed
        gemm_pv_local(1);
      }

      named_sync(kBarP0, kConsumers);  // P0' stored (S of tile t1 - 1 has completed)
      if (has1) {
        wgmma_wait<0>();
        reg_fence(o);
        reg_fence(pa);
        release(1, 1);  // stage 1 hi: S and the local P V done
      }
      if (t1 == n_tiles && tail_valid < kBN) zero_tail(0);  // tile t1 - 1 is the last
      gemm_pv_remote(0, L::kP0);
      if (t1 + 2 < n_tiles) {  // S of tile t1 + 2: its hi half behind the remote P V
        gemm_s_first(i + 1);
        wgmma_wait<1>();  // the remote P V is done
        reg_fence(o);
        // stage 0 hi: the remote P V done; before the wait for the lo half, which the producer loads
        // after tile t1 + 1's hi half, which needs this release
        release(0, 1);
        gemm_s_second(i + 1);
        wgmma_wait<0>();
        reg_fence(s);
        release(1, 0);  // stage 1 lo: S done
      } else {
        wgmma_wait<0>();
        reg_fence(o);
        release(0, 1);
      }
    }
  }
  pdl_trigger();

  // ---- epilogue: the rows' sums of both consumers (a quad holds a row's 64 keys), then this
  // consumer's 256 columns of its two rows per thread ----
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    float l = l_run[i];
    l += __shfl_xor_sync(0xffffffffu, l, 1);
    l += __shfl_xor_sync(0xffffffffu, l, 2);
    if (lane % 4 == 0) (cw == 0 ? s_l0 : s_l1)[rloc[i]] = l;
  }
  named_sync(kBarEpi, kConsumers);
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const int r = rloc[i];
    if (r >= rows_here) continue;
    const float l = s_l0[r] + s_l1[r], m = m_run[i];
    const float inv = l > 0.0f ? 1.0f / l : 0.0f;
    const float lse2 = l > 0.0f ? m + __log2f(l) : -INFINITY;
    const int rg = r_first + r, t = rg / p.group, h = rg % p.group;
    const int c0 = cw * kHalf + 2 * (lane % 4);
    if (splits == 1) {
      uint16_t* out = static_cast<uint16_t*>(p.out) + b * p.o_sb + t * p.o_st + h * p.o_sh + c0;
#pragma unroll
      for (int j = 0; j < kHalf / 8; ++j) {  // out may be 2-byte aligned only: two 16-bit stores
        const uint32_t pk = pack2<T>(o[4 * j + 2 * i] * inv, o[4 * j + 2 * i + 1] * inv);
        out[8 * j] = uint16_t(pk & 0xffffu);
        out[8 * j + 1] = uint16_t(pk >> 16);
      }
      if (p.lse != nullptr && cw == 0 && lane % 4 == 0) p.lse[b * p.lse_sb + t * p.lse_st + h] = lse2 * kLn2;
    } else {
      const int64_t row = (int64_t(b) * p.q_len + t) * p.heads_q + h;
      float* dst = ws_o + (row * splits + split) * kMlaHeadDimV + c0;
#pragma unroll
      for (int j = 0; j < kHalf / 8; ++j)
        *reinterpret_cast<float2*>(dst + 8 * j) = make_float2(o[4 * j + 2 * i] * inv, o[4 * j + 2 * i + 1] * inv);
      if (cw == 0 && lane % 4 == 0) ws_lse[row * splits + split] = lse2;
    }
  }
#else
  (void)tm_kv, (void)p, (void)box_rows, (void)splits, (void)ws_o, (void)ws_lse;
#if defined(__CUDA_ARCH__)
  __trap();  // no wgmma outside sm_90a: the planner and the launcher never run this build
#endif
#endif
}

}  // namespace decode
}  // namespace kernelforge
