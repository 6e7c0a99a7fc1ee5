// MLA decode on Hopper (sm_90a): wgmma tensor cores, TMA cache tiles, warp specialization. Formula and
// layouts: include/kernelforge/mla.h; the mma.sync kernel for every other case: mla_decode.cuh.
//
// Napkin math (H = 128, Lq = 1, page 64, bf16): per 64-key tile the CTA moves 64 x 576 x 2 = 72 KB of
// cache and does S = Q K^T (2 x 64 x 64 x 576 = 4.7 MFLOP) plus O += P V (2 x 64 x 64 x 512 = 4.2
// MFLOP): ~120 FLOP per byte for each of the two row-tile CTAs of a sequence, ~240 per DRAM byte (the
// pair shares every tile through L2). 2.5 TB/s of cache is then ~600 TF/s: wgmma's rate, not
// mma.sync's (~180 TF/s measured on the mma.sync kernel at this shape).
//
// One CTA per (row tile of 64 query rows, split, sequence), 384 threads in three warpgroups:
//   warpgroup 0, producer (24 registers): one thread issues the TMA loads of every 64-key tile into a
//     2-stage ring (k_full: expect_tx + bytes; k_empty: lane 0 of each of the 8 consumer warps). A tile
//     is one box of 64 columns x box_rows keys per (page of the tile, column tile): box_rows =
//     min(page_size, 64) when paged (tile starts are multiples of 64, so a tile covers whole pages or
//     lies in one), 64 when contiguous. Keys past the range and block-table entries outside [0, P)
//     give a page coordinate outside the tensor: TMA writes zeros and still counts the bytes.
//   warpgroup 1, consumer 0 (240 registers): S = Q K^T (64 x 64, k = 576: 36 wgmma m64n64k16, Q and K
//     from shared memory), online softmax in float32 (log2 domain), P (16-bit) and the rows' rescale
//     alpha to shared memory, then O[:, 0:256] = alpha O + P V[:, 0:256] (4 wgmma m64n256k16).
//   warpgroup 2, consumer 1 (240 registers): O[:, 256:512] = alpha O + P V[:, 256:512] with the P and
//     alpha consumer 0 published. Each consumer holds a 64 x 256 float32 accumulator (128 registers).
// Consumer 0's schedule per tile i: issue S_{i+1}, issue P_i V_i, wait for S_{i+1} (P_i V_i still
// runs), softmax of S_{i+1} in registers, wait for P_i V_i, wait until consumer 1's P_i V_i is done
// (named barrier P_FREE), store P_{i+1} and alpha_{i+1}, release them (named barrier P_FULL). So the
// tensor cores run S of the next tile while both consumers' P V of the current one drains.
// Named barriers (256 threads: consumer 0 arrives, consumer 1 syncs, or the reverse): P_FULL once per
// tile, P_FREE once per tile but the last (the arrivals and syncs pair up exactly), EPI once; plus one
// 256-thread barrier after the Q copy and one 128-thread barrier per consumer after zeroing values.
// Keys of the last tile past the range: their logits are masked by index (-inf); their value rows are
// set to zero by each consumer in its own columns before its P V (a stale or NaN row times p = 0 would
// still give NaN), after consumer 0's S of that tile has completed (P_FULL), so no wgmma reads them
// while they change.
// P and Q tiles use the TMA's 128-byte swizzle (chunk c of row r at c ^ (r % 8)); stores of P are
// 4-byte and conflict-free per quarter warp. Generic-proxy writes (cp.async of Q, P, zeroed rows) are
// followed by fence.proxy.async before the barrier that hands them to wgmma.
// Epilogue: consumer 0 publishes the rows' sums and maxima; each consumer writes its 256 columns of
// out (splits == 1) or of the float32 partials and log2-sum-exp in the workspace (decode_merge.cuh
// combines the splits). Rows past the tile's H * Lq rows are computed on zero queries and not stored.
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
#include "decode/mla_config.h"

namespace kernelforge {
namespace decode {

// D[64 x 256] += A[64 x 16] * B[16 x 256]: A K-major and B MN-major (transposed), both from shared
// memory. The accumulator fragment is sm90_wgmma.cuh's: d[4j + 2i + c] is row 16 w + l / 4 + 8 i,
// column 8 j + 2 (l % 4) + c.
#define KF_WGMMA_SS_N256_TB(TY)                                                                                        \
  asm volatile(                                                                                                        \
      "{\n.reg .pred p;\nsetp.ne.b32 p, %130, 0;\n"                                                                    \
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
      " %128, %129, p, 1, 1, 0, 1;\n}\n"                                                                               \
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
      : "l"(desc_a), "l"(desc_b), "r"(1))

template <typename T>
__device__ __forceinline__ void wgmma_pv_n256(float (&d)[128], uint64_t desc_a, uint64_t desc_b) {
#if KF_SM90A
  if constexpr (std::is_same<T, __nv_bfloat16>::value)
    KF_WGMMA_SS_N256_TB("bf16");
  else
    KF_WGMMA_SS_N256_TB("f16");
#else
  (void)d, (void)desc_a, (void)desc_b;
#endif
}
#undef KF_WGMMA_SS_N256_TB

// Grid (row tiles, splits, B), kMlaWgmmaWarps * 32 threads, MlaWgmmaSmem::kBytes of dynamic shared
// memory. tm_kv: the cache as a 4-D map (column, row in page, page, 1), boxes of 64 columns x box_rows
// rows, 128-byte swizzle (contiguous caches: one "page" per sequence, the cache length its rows).
template <typename T>
__global__ void __launch_bounds__(kMlaWgmmaWarps * 32, 1)
    mla_decode_wgmma_kernel(const __grid_constant__ CUtensorMap tm_kv, const DecodeParams p, int box_rows, int splits,
                            float* ws_o, float* ws_lse) {
#if KF_SM90A
  using L = MlaWgmmaSmem;
  constexpr int kBN = kMlaWgmmaBlockN, kRows = kMlaRows, kStages = kMlaWgmmaStages;
  constexpr int kColTiles = kMlaHeadDimK / 64;  // 9 column tiles of 64 per cache row / Q row
  constexpr int kHalf = kMlaHeadDimV / 2;       // output columns per consumer
  constexpr int kBarQ = 1, kBarPFull = 2, kBarPFree = 3, kBarEpi = 4, kBarZero = 5;  // kBarZero + consumer
  constexpr int kConsumers = 256;

  extern __shared__ uint8_t smem_raw[];
  uint8_t* smem = smem_raw + ((1024 - (smem_u32(smem_raw) & 1023)) & 1023);
  float* s_alpha = reinterpret_cast<float*>(smem + L::kAlpha);
  float* s_l = reinterpret_cast<float*>(smem + L::kL);
  float* s_m = reinterpret_cast<float*>(smem + L::kM);
  uint64_t* k_full = reinterpret_cast<uint64_t*>(smem + L::kBars);
  uint64_t* k_empty = k_full + kStages;

  const int row_tile = blockIdx.x, split = blockIdx.y, b = blockIdx.z;
  const int r_first = row_tile * kRows;
  const int rows_here = min(kRows, p.rows - r_first);

  pdl_wait();  // seq_lens, the block table and every load follow the previous kernel
  const KeyRange kr = key_range<kBN>(p, b, r_first, r_first + rows_here - 1, split, splits);
  const int n_tiles = (kr.end - kr.start + kBN - 1) / kBN;

  if (threadIdx.x == 0) {
    for (int s = 0; s < kStages; ++s) {
      mbar_init_count(&k_full[s], 1);   // the producer's expect_tx arrival + the bytes
      mbar_init_count(&k_empty[s], 8);  // lane 0 of each of the 8 consumer warps
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
      for (int it = 0; it < n_tiles; ++it) {
        const int s = it % kStages;
        mbar_wait(&k_empty[s], ((it / kStages) & 1) ^ 1);  // a fresh barrier passes parity 1 at once
        mbar_expect(&k_full[s], L::kKBytes);
        const int32_t j0 = kr.start + it * kBN;
        for (int pc = 0; pc < chunks; ++pc) {
          const int32_t j = j0 + pc * box_rows;
          int32_t page = -1, row = 0;  // page -1: past the range, read as zeros
          if (j < kr.end) {
            page = bt != nullptr ? __ldg(bt + (j >> p.page_shift)) : b;
            row = bt != nullptr ? (j & (p.page_size - 1)) : j;
          }
          uint8_t* dst = smem + L::kK + s * L::kKBytes + pc * box_rows * 128;
#pragma unroll
          for (int c = 0; c < kColTiles; ++c)
            tma_load_4d(dst + c * L::kTileBytes, &tm_kv, &k_full[s], c * 64, row, page, 0);
        }
      }
    }
    return;
  }

  // ---- consumers ----
  setmaxnreg_inc<kMlaWgmmaConsumerRegs>();
  const int cw = wg - 1;  // 0: S, softmax and output columns 0-255; 1: output columns 256-511
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
  const uint32_t p_addr = smem_u32(smem + L::kP);
  int rloc[2];  // this thread's two accumulator rows (of the 64)
#pragma unroll
  for (int i = 0; i < 2; ++i) rloc[i] = 16 * warp + lane / 4 + 8 * i;

  float o[128];
#pragma unroll
  for (int e = 0; e < 128; ++e) o[e] = 0.0f;
  auto rescale_o = [&](const float(&alpha)[2]) {
#pragma unroll
    for (int e = 0; e < 128; ++e) o[e] *= alpha[(e >> 1) & 1];
  };
  // O[:, 256 cw + 0..255] += P V over the tile's 64 keys (4 k-slices of 16 keys = 2048 bytes of V rows).
  auto gemm_pv = [&](int stage) {
    const uint32_t v_addr = k_addr0 + stage * L::kKBytes + cw * (kHalf / 64) * L::kTileBytes;
    reg_fence(o);  // the rescale's writes stay before the fence
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < kBN / 16; ++kk)
      wgmma_pv_n256<T>(o, gmma_desc_k(p_addr + kk * 32), gmma_desc_mn(v_addr + kk * 16 * 128, L::kTileBytes));
    wgmma_commit();
  };
  // The last tile's value rows past the range (valid rows kept) set to zero in this consumer's columns.
  auto zero_tail = [&](int stage, int valid) {
    uint8_t* base = smem + L::kK + stage * L::kKBytes + cw * (kHalf / 64) * L::kTileBytes;
    const int n = (kBN - valid) * 8 * (kHalf / 64);  // 16-byte chunks: rows x 8 x 4 column tiles
    for (int i = tid; i < n; i += 128) {
      const int tile = i / ((kBN - valid) * 8), rem = i % ((kBN - valid) * 8);
      *reinterpret_cast<int4*>(base + tile * L::kTileBytes + (valid + rem / 8) * 128 + (rem % 8) * 16) =
          make_int4(0, 0, 0, 0);
    }
    fence_proxy_async();
    named_sync(kBarZero + cw, 128);
  };
  const int tail_valid = n_tiles > 0 ? kr.end - (kr.start + (n_tiles - 1) * kBN) : kBN;  // 1..64

  float m_run[2] = {-INFINITY, -INFINITY};  // consumer 0: the rows' running max (log2 domain)
  float l_run[2] = {0.0f, 0.0f};            // consumer 0: this thread's part of the rows' sums

  if (cw == 0) {
    const float scale_log2 = p.scale * kLog2e;
    int32_t row_hi[2];  // the last key each row sees (-1: a padding row)
#pragma unroll
    for (int i = 0; i < 2; ++i) row_hi[i] = rloc[i] < rows_here ? kr.n - p.q_len + (r_first + rloc[i]) / p.group : -1;
    // keys below full_end are visible to every row of the tile (the earliest token's last key + 1)
    const int32_t full_end = min(kr.end, kr.n - p.q_len + r_first / p.group + 1);
    float s[32];
#pragma unroll
    for (int e = 0; e < 32; ++e) s[e] = 0.0f;
    float alpha[2] = {1.0f, 1.0f};

    // S = Q K^T over the 576 columns: 36 k-slices of 16 (32 bytes within a 64-column tile).
    auto gemm_s = [&](int stage) {
      // The k-slice's descriptors are the tile's plus (byte offset >> 4) in the address field (no carry:
      // shared addresses < 2^18). The opaque copy keeps the compiler from hoisting the 36 Q descriptors
      // out of the tile loop (72 registers next to the 128 of O).
      uint64_t dq = gmma_desc_k(q_addr), dk = gmma_desc_k(k_addr0 + stage * L::kKBytes);
      asm volatile("" : "+l"(dq), "+l"(dk));
      reg_fence(s);  // the accumulator's last writes (zero-fill, softmax) before the fence
      wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < kMlaHeadDimK / 16; ++kk) {
        const uint64_t off = ((kk / 4) * L::kTileBytes + (kk % 4) * 32) >> 4;
        wgmma_ss<T, 64>(s, dq + off, dk + off, kk > 0 ? 1 : 0);
      }
      wgmma_commit();
    };
    // Online softmax of tile `it` in place: s becomes p = 2^(x - m) with x = scale log2(e) s (-inf where
    // masked); alpha = 2^(m_old - m_new).
    auto softmax = [&](int it) {
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
        float mx = m_run[i];
#pragma unroll
        for (int j = 0; j < 8; ++j) mx = fmaxf(mx, fmaxf(s[4 * j + 2 * i], s[4 * j + 2 * i + 1]));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
        const float m_use = mx == -INFINITY ? 0.0f : mx;  // no visible key yet: p = 0
        alpha[i] = ex2_approx(m_run[i] - m_use);
        m_run[i] = mx;
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
    // P (16-bit) and alpha to shared memory, then handed to both consumers' P V.
    auto publish_p = [&]() {
#pragma unroll
      for (int j = 0; j < 8; ++j)
#pragma unroll
        for (int i = 0; i < 2; ++i) {
          const int byte = rloc[i] * 128 + ((j ^ (lane / 4)) * 16) + (lane % 4) * 4;  // rloc % 8 == lane / 4
          *reinterpret_cast<uint32_t*>(smem + L::kP + byte) = pack2<T>(s[4 * j + 2 * i], s[4 * j + 2 * i + 1]);
        }
      if (lane % 4 == 0) s_alpha[rloc[0]] = alpha[0], s_alpha[rloc[1]] = alpha[1];
      fence_proxy_async();
      named_arrive(kBarPFull, kConsumers);
    };

    if (n_tiles > 0) {
      mbar_wait(&k_full[0], 0);
      gemm_s(0);
      wgmma_wait<0>();
      reg_fence(s);
      softmax(0);
      publish_p();
      // Every tile but the last: S of the next tile and P V of this one in flight together. (The last
      // tile is peeled so that each loop iteration issues the same wgmma groups.)
      for (int it = 0; it + 1 < n_tiles; ++it) {
        const int st = it % kStages, sn = (it + 1) % kStages;
        rescale_o(alpha);
        mbar_wait(&k_full[sn], ((it + 1) / kStages) & 1);
        gemm_s(sn);
        gemm_pv(st);
        wgmma_wait<1>();  // S_{it+1} is ready; P_it V_it may still run
        reg_fence(s);
        softmax(it + 1);
        wgmma_wait<0>();
        reg_fence(o);
        named_sync(kBarPFree, kConsumers);  // consumer 1's P_it V_it no longer reads P and alpha
        publish_p();
        if (lane == 0) mbar_arrive(&k_empty[st]);
      }
      const int st = (n_tiles - 1) % kStages;
      rescale_o(alpha);
      if (tail_valid < kBN) zero_tail(st, tail_valid);  // S of this tile has completed
      gemm_pv(st);
      wgmma_wait<0>();
      reg_fence(o);
      if (lane == 0) mbar_arrive(&k_empty[st]);
    }
    // the rows' sums (a quad holds a row's 64 keys) and maxima for both consumers' epilogues
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      float l = l_run[i];
      l += __shfl_xor_sync(0xffffffffu, l, 1);
      l += __shfl_xor_sync(0xffffffffu, l, 2);
      if (lane % 4 == 0) s_l[rloc[i]] = l, s_m[rloc[i]] = m_run[i];
    }
  } else {
    for (int it = 0; it < n_tiles; ++it) {
      const int st = it % kStages;
      named_sync(kBarPFull, kConsumers);  // P_it and alpha_it published (S_it completed)
      const float alpha[2] = {s_alpha[rloc[0]], s_alpha[rloc[1]]};
      rescale_o(alpha);
      mbar_wait(&k_full[st], (it / kStages) & 1);
      if (it + 1 == n_tiles && tail_valid < kBN) zero_tail(st, tail_valid);
      gemm_pv(st);
      wgmma_wait<0>();
      reg_fence(o);
      if (lane == 0) mbar_arrive(&k_empty[st]);
      if (it + 1 < n_tiles) named_arrive(kBarPFree, kConsumers);
    }
  }
  pdl_trigger();
  named_sync(kBarEpi, kConsumers);  // consumer 0's sums and maxima

  // ---- epilogue: this consumer's 256 columns of its two rows per thread ----
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const int r = rloc[i];
    if (r >= rows_here) continue;
    const float l = s_l[r], m = s_m[r];
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
