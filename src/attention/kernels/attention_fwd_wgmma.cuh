// Attention forward on Hopper (sm_90a): wgmma tensor cores, TMA loads, warp specialization.
//   s_ij = scale * q_i . k_j (softcap: softcap * tanh(s_ij / softcap)), masked to the visible keys;
//   out_i = sum_j softmax_j(s_ij) v_j, lse_i = logsumexp_j s_ij (with the sink logit, if any).
// FLOPs 2 * Sq * Sk * (Dqk + Dv) per (b, h) (about half of it causal). At d128 the block's inner step
// is 2 * 128 * 128 * 256 = 8.4 MFLOP against 64 KB of K/V from L2: tensor-core bound (989 TFLOP/s
// dense bf16 on the H100 SXM), so the design keeps the tensor cores busy while softmax runs.
//
// One CTA = one tile of 128 query rows of one (batch, head), 384 threads in three warpgroups:
//   warpgroup 0, the producer (24 registers): one thread issues TMA loads of the Q tile once and of
//     the K and V tiles of every key step into a 2-stage ring (full / empty mbarriers per stage and
//     operand, so Q.K^T can start before V lands);
//   warpgroups 1 and 2, the consumers (240 registers): 64 query rows each. Per key step j:
//     S_j = Q K_j^T (wgmma, A and B from shared memory), then O += P_{j-1} V_{j-1} (wgmma, A = P from
//     registers) both issued back to back; softmax of S_j (online: row max, exp2, row sum) runs while
//     the P.V product is still in flight; then O is rescaled and P_j converted to 16-bit in place.
//     The two consumers take turns issuing their GEMMs (named barriers 1 and 2), so one warpgroup's
//     softmax overlaps the other's GEMMs (FlashAttention-3's ping-pong).
// Shared memory (d128, block_n 128): Q 32 KB + 2 stages x (K 32 KB + V 32 KB) = 160 KB. Tiles are
// 64 columns wide (128 bytes, the TMA swizzle span) and 1024-byte aligned; see sm90_wgmma.cuh.
// Epilogue: O / l in 16-bit into the consumer's own rows of the Q tile (same swizzle, no bank
// conflicts), then 16-byte coalesced stores of the rows inside the sequence; lse per row.
// Key tiles: only those that some row of the tile can see (causal / window ranges); the masked
// element test runs only on tiles that cross a boundary (sequence end, diagonal, window edge).
#pragma once

#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "attention/attention_problem.h"
#include "attention/kernels/sm90_wgmma.cuh"
#include "common/launch.cuh"
#include "common/tma.cuh"

namespace kernelforge {

constexpr int kWgmmaBlockM = 128;  // query rows per CTA: two consumer warpgroups x 64
constexpr int kWgmmaStages = 2;    // K/V ring depth
constexpr int kWgmmaThreads = 384;
constexpr int kWgmmaProducerRegs = 24;
constexpr int kWgmmaConsumerRegs = 240;  // 128 x 24 + 256 x 240 = 64512 <= 65536 registers

// Shared-memory map (byte offsets from a 1024-aligned base).
template <int kDqk, int kDv, int kBlockN>
struct WgmmaSmem {
  static constexpr int kTileRowBytes = 128;  // 64 16-bit columns
  static constexpr int kQBytes = kWgmmaBlockM * kDqk * 2;
  static constexpr int kKBytes = kBlockN * kDqk * 2;
  static constexpr int kVBytes = kBlockN * kDv * 2;
  static constexpr int kQ = 0;
  static constexpr int kK = kQ + kQBytes;                 // stage s at kK + s * kKBytes
  static constexpr int kV = kK + kWgmmaStages * kKBytes;  // stage s at kV + s * kVBytes
  static constexpr int kBars = kV + kWgmmaStages * kVBytes;
  static constexpr int kNumBars = 1 + 4 * kWgmmaStages;
  static constexpr int kBytes = kBars + kNumBars * 8 + 1024;  // + slack to align the base
  static_assert(kBlockN % 16 == 0 && kDqk % 64 == 0 && kDv % 64 == 0, "tile shapes");
  static_assert(kBytes <= 227 * 1024, "shared memory of one CTA on sm_90");
};

// The key tiles [first, first + count) that some query row in [m0, min(m0 + block_m, sq)) sees.
struct KeyTiles {
  int first, count;
};
__device__ __forceinline__ KeyTiles wgmma_key_tiles(int m0, int sq, int sk, int wl, int wr, int block_n) {
  const int64_t d = int64_t(sk) - sq;
  const int64_t row_hi = int64_t(min(m0 + kWgmmaBlockM, sq)) - 1;
  const int64_t lo = wl >= 0 ? max(int64_t(0), m0 + d - wl) : 0;
  const int64_t hi = wr >= 0 ? min(int64_t(sk) - 1, row_hi + d + wr) : int64_t(sk) - 1;
  if (hi < lo) return {0, 0};
  const int first = int(lo / block_n);
  return {first, int(hi / block_n) + 1 - first};
}

// Grid (query tiles, Hq, B); 384 threads; WgmmaSmem<...>::kBytes of dynamic shared memory.
// tm_q / tm_k / tm_v: 4-D maps (column, row, head, batch) with 64 x {128, kBlockN} x 1 x 1 boxes and
// the 128-byte swizzle (kVarlen: batch extent 1, rows = all tokens, row offset cu_seqlens[b]).
template <typename T, int kDqk, int kDv, int kBlockN>
__global__ void __launch_bounds__(kWgmmaThreads, 1)
    attention_fwd_wgmma(const __grid_constant__ CUtensorMap tm_q, const __grid_constant__ CUtensorMap tm_k,
                        const __grid_constant__ CUtensorMap tm_v, const AttentionParams p, bool longest_first) {
#if KF_SM90A
  using L = WgmmaSmem<kDqk, kDv, kBlockN>;
  constexpr int kBM = kWgmmaBlockM;
  constexpr int kPvN = kDv == 64 ? 64 : 128;  // N of one P.V instruction; d256: two per k-slice
  constexpr int kPvParts = kDv / kPvN;
  constexpr float kLog2e = 1.4426950408889634f;
  constexpr float kLn2 = 0.6931471805599453f;

  extern __shared__ uint8_t smem_raw[];
  uint8_t* smem = smem_raw + ((1024 - (smem_u32(smem_raw) & 1023)) & 1023);
  uint64_t* q_full = reinterpret_cast<uint64_t*>(smem + L::kBars);
  uint64_t* k_full = q_full + 1;
  uint64_t* v_full = k_full + kWgmmaStages;
  uint64_t* k_empty = v_full + kWgmmaStages;
  uint64_t* v_empty = k_empty + kWgmmaStages;

  pdl_wait();  // every global access (TMA loads, cu_seqlens, stores) follows the previous kernel

  const int m_block = longest_first ? int(gridDim.x) - 1 - int(blockIdx.x) : int(blockIdx.x);
  const int h = blockIdx.y, b = blockIdx.z;
  const int hkv = h / p.group;
  int sq = p.seqlen_q, sk = p.seqlen_k, q_row0 = 0, k_row0 = 0, batch_coord = b;
  if (p.varlen) {
    q_row0 = p.cu_seqlens_q[b];
    k_row0 = p.cu_seqlens_k[b];
    sq = p.cu_seqlens_q[b + 1] - q_row0;
    sk = p.cu_seqlens_k[b + 1] - k_row0;
    batch_coord = 0;
  }
  const int m0 = m_block * kBM;
  if (m0 >= sq) return;  // varlen: a tile past this sequence's end (the whole CTA leaves together)
  const KeyTiles kt = wgmma_key_tiles(m0, sq, sk, p.window_left, p.window_right, kBlockN);

  if (threadIdx.x == 0) {
    mbar_init_count(q_full, 1);
    for (int s = 0; s < kWgmmaStages; ++s) {
      mbar_init_count(&k_full[s], 1);  // the producer's expect_tx arrival + the bytes
      mbar_init_count(&v_full[s], 1);
      mbar_init_count(&k_empty[s], 8);  // lane 0 of each of the 8 consumer warps
      mbar_init_count(&v_empty[s], 8);
    }
    mbar_init_fence();
  }
  __syncthreads();

  const int wg = threadIdx.x / 128;
  if (wg == 0) {
    // ---- producer ----
    setmaxnreg_dec<kWgmmaProducerRegs>();
    if (threadIdx.x == 0) {
      tma_prefetch_desc(&tm_q);
      tma_prefetch_desc(&tm_k);
      tma_prefetch_desc(&tm_v);
      mbar_expect(q_full, L::kQBytes);
#pragma unroll
      for (int c = 0; c < kDqk / 64; ++c)
        tma_load_4d(smem + L::kQ + c * kBM * 128, &tm_q, q_full, c * 64, q_row0 + m0, h, batch_coord);
      for (int it = 0; it < kt.count; ++it) {
        const int s = it % kWgmmaStages;
        const uint32_t phase = (it / kWgmmaStages) & 1;
        const int row = k_row0 + (kt.first + it) * kBlockN;
        mbar_wait(&k_empty[s], phase ^ 1);  // a fresh barrier passes parity 1 at once
        mbar_expect(&k_full[s], L::kKBytes);
#pragma unroll
        for (int c = 0; c < kDqk / 64; ++c)
          tma_load_4d(smem + L::kK + s * L::kKBytes + c * kBlockN * 128, &tm_k, &k_full[s], c * 64, row, hkv,
                      batch_coord);
        mbar_wait(&v_empty[s], phase ^ 1);
        mbar_expect(&v_full[s], L::kVBytes);
#pragma unroll
        for (int c = 0; c < kDv / 64; ++c)
          tma_load_4d(smem + L::kV + s * L::kVBytes + c * kBlockN * 128, &tm_v, &v_full[s], c * 64, row, hkv,
                      batch_coord);
      }
    }
    return;
  }

  // ---- consumers ----
  setmaxnreg_inc<kWgmmaConsumerRegs>();
  const int cw = wg - 1;  // consumer warpgroup: rows 64 cw .. 64 cw + 63 of the tile
  const int tid = threadIdx.x - 128 * wg;
  const int warp = tid / 32, lane = tid % 32;
  const bool softcap = p.softcap > 0.0f;
  // s is held in units where p = exp2(s * sl2 - m * sl2), sl2 > 0 (the row max must be taken in
  // units that increase with the logit): raw q.k (scale folded into sl2); tanh(scale q.k / softcap)
  // with a softcap (softcap folded into sl2); the logit itself with a negative scale.
  const bool logit_units = !softcap && p.scale < 0.0f;
  const float sl2 = softcap ? p.softcap * kLog2e : logit_units ? kLog2e : p.scale * kLog2e;
  const float cap_in = softcap ? p.scale / p.softcap : 0.0f;
  const int d = sk - sq;
  // Visible keys of this thread's two rows: [row_lo[i], row_hi[i]].
  int row_lo[2], row_hi[2];
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const int row = m0 + 64 * cw + 16 * warp + lane / 4 + 8 * i;
    row_lo[i] = p.window_left >= 0 ? row + d - p.window_left : 0;
    row_hi[i] = p.window_right >= 0 ? min(sk - 1, row + d + p.window_right) : sk - 1;
  }

  float o[kPvParts][kPvN / 2];
#pragma unroll
  for (int part = 0; part < kPvParts; ++part)
#pragma unroll
    for (int e = 0; e < kPvN / 2; ++e) o[part][e] = 0.0f;
  float s[kBlockN / 2];
#pragma unroll
  for (int e = 0; e < kBlockN / 2; ++e) s[e] = 0.0f;
  uint32_t pa[kBlockN / 16][4];
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f}, alpha[2];

  const uint32_t q_addr = smem_u32(smem + L::kQ) + cw * 64 * 128;
  const uint32_t k_addr0 = smem_u32(smem + L::kK);
  const uint32_t v_addr0 = smem_u32(smem + L::kV);

  // S = Q K^T over Dqk in k-slices of 16 (32 bytes within a 64-column tile).
  auto gemm_qk = [&](int stage) {
    const uint32_t k_addr = k_addr0 + stage * L::kKBytes;
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < kDqk / 16; ++kk) {
      const uint64_t da = gmma_desc_k(q_addr + (kk / 4) * (kBM * 128) + (kk % 4) * 32);
      const uint64_t db = gmma_desc_k(k_addr + (kk / 4) * (kBlockN * 128) + (kk % 4) * 32);
      wgmma_ss<T, kBlockN>(s, da, db, kk > 0 ? 1 : 0);
    }
    wgmma_commit();
  };
  // O += P V over the block's keys in k-slices of 16 rows of V (2048 bytes).
  auto gemm_pv = [&](int stage) {
    const uint32_t v_addr = v_addr0 + stage * L::kVBytes;
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < kBlockN / 16; ++kk)
#pragma unroll
      for (int part = 0; part < kPvParts; ++part) {
        const uint64_t db = gmma_desc_mn(v_addr + kk * 16 * 128 + part * (kPvN / 64) * (kBlockN * 128), kBlockN * 128);
        wgmma_rs<T, kPvN>(o[part], pa[kk], db, 1);
      }
    wgmma_commit();
  };
  // Online softmax of the S tile of keys n0.. (in place: s becomes exp2(s * sl2 - m * sl2)).
  auto softmax = [&](int n0) {
    if (softcap) {
#pragma unroll
      for (int e = 0; e < kBlockN / 2; ++e) s[e] = tanh_approx(s[e] * cap_in);
    } else if (logit_units) {
#pragma unroll
      for (int e = 0; e < kBlockN / 2; ++e) s[e] *= p.scale;
    }
    const bool edge = n0 + kBlockN > sk || (p.window_right >= 0 && n0 + kBlockN - 1 > m0 + d + p.window_right) ||
                      (p.window_left >= 0 && n0 < m0 + kBM - 1 + d - p.window_left);
    if (edge) {
#pragma unroll
      for (int j = 0; j < kBlockN / 8; ++j)
#pragma unroll
        for (int i = 0; i < 2; ++i)
#pragma unroll
          for (int c = 0; c < 2; ++c) {
            const int col = n0 + 8 * j + 2 * (lane % 4) + c;
            if (col < row_lo[i] || col > row_hi[i]) s[4 * j + 2 * i + c] = -INFINITY;
          }
    }
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      float mx = m[i];
#pragma unroll
      for (int j = 0; j < kBlockN / 8; ++j) mx = fmaxf(mx, fmaxf(s[4 * j + 2 * i], s[4 * j + 2 * i + 1]));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
      const float m_use = mx == -INFINITY ? 0.0f : mx;  // a row with no visible key yet: exp2(-inf) = 0
      alpha[i] = ex2_approx((m[i] - m_use) * sl2);
      m[i] = mx;
      const float base = m_use * sl2;
      float sum = 0.0f;
#pragma unroll
      for (int j = 0; j < kBlockN / 8; ++j)
#pragma unroll
        for (int c = 0; c < 2; ++c) {
          const float e = ex2_approx(fmaf(s[4 * j + 2 * i + c], sl2, -base));
          s[4 * j + 2 * i + c] = e;
          sum += e;
        }
      l[i] = l[i] * alpha[i] + sum;  // this thread's columns; the quad's partial sums add up at the end
    }
  };
  auto rescale_o = [&]() {
#pragma unroll
    for (int part = 0; part < kPvParts; ++part)
#pragma unroll
      for (int e = 0; e < kPvN / 2; ++e) o[part][e] *= alpha[(e >> 1) & 1];
  };
  auto convert_p = [&]() {
#pragma unroll
    for (int kk = 0; kk < kBlockN / 16; ++kk)
#pragma unroll
      for (int r = 0; r < 4; ++r) pa[kk][r] = pack2<T>(s[8 * kk + 2 * r], s[8 * kk + 2 * r + 1]);
  };

  // Ping-pong: warpgroup cw issues its GEMMs after bar.sync(1 + cw) and lets the other one go with
  // bar.arrive(2 - cw); consumer 0 goes first (consumer 1's arrival up front). Both warpgroups visit
  // the same key tiles, so the arrivals and syncs pair up exactly (consumer 1 skips its last arrival).
  constexpr int kBarSched = 1;
  const int count = kt.count;
  mbar_wait(q_full, 0);  // also before the epilogue overwrites the Q tile when count == 0
  if (count > 0) {
    if (cw == 1) named_arrive(kBarSched + 0, 256);
    mbar_wait(&k_full[0], 0);
    named_sync(kBarSched + cw, 256);
    gemm_qk(0);
    if (!(cw == 1 && count == 1)) named_arrive(kBarSched + 1 - cw, 256);
    wgmma_wait<0>();
    reg_fence(s);
    if (lane == 0) mbar_arrive(&k_empty[0]);
    softmax(kt.first * kBlockN);
    convert_p();
    for (int it = 1; it < count; ++it) {
      const int st = it % kWgmmaStages, sp = (it - 1) % kWgmmaStages;
      const uint32_t ph = (it / kWgmmaStages) & 1, php = ((it - 1) / kWgmmaStages) & 1;
      mbar_wait(&k_full[st], ph);
      named_sync(kBarSched + cw, 256);
      gemm_qk(st);
      mbar_wait(&v_full[sp], php);
      gemm_pv(sp);
      if (!(cw == 1 && it == count - 1)) named_arrive(kBarSched + 1 - cw, 256);
      wgmma_wait<1>();  // S_it is ready; P_{it-1} V_{it-1} may still run
      reg_fence(s);
      if (lane == 0) mbar_arrive(&k_empty[st]);
      softmax((kt.first + it) * kBlockN);
      wgmma_wait<0>();
#pragma unroll
      for (int part = 0; part < kPvParts; ++part) reg_fence(o[part]);
#pragma unroll
      for (int kk = 0; kk < kBlockN / 16; ++kk) reg_fence(pa[kk]);  // P.V's registers live until it completed
      if (lane == 0) mbar_arrive(&v_empty[sp]);
      rescale_o();
      convert_p();
    }
    const int sl = (count - 1) % kWgmmaStages;
    mbar_wait(&v_full[sl], ((count - 1) / kWgmmaStages) & 1);
    gemm_pv(sl);
    wgmma_wait<0>();
#pragma unroll
    for (int part = 0; part < kPvParts; ++part) reg_fence(o[part]);
    if (lane == 0) mbar_arrive(&v_empty[sl]);
  }

  // ---- epilogue: normalize, sinks, lse ----
  float inv[2], lse[2];
  const float sink2 = p.sinks == nullptr ? -INFINITY
                      : p.sinks_float    ? static_cast<const float*>(p.sinks)[h] * kLog2e
                                         : to_float(static_cast<const T*>(p.sinks)[h]) * kLog2e;
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    float lt = l[i];
    lt += __shfl_xor_sync(0xffffffffu, lt, 1);
    lt += __shfl_xor_sync(0xffffffffu, lt, 2);
    const float m2 = m[i] * sl2;  // the row max in log2 units of the logit
    const float mf = fmaxf(m2, sink2);
    if (mf == -INFINITY) {  // no visible key and no sink
      inv[i] = 0.0f;
      lse[i] = -INFINITY;
    } else {
      const float f = ex2_approx(m2 - mf);
      lt = lt * f + ex2_approx(sink2 - mf);
      inv[i] = f / lt;
      lse[i] = (mf + __log2f(lt)) * kLn2;
    }
  }
  // O rows into this warpgroup's rows of the Q tile: element (row r, column col) at tile col / 64,
  // byte r * 128 + ((col % 64 / 8) ^ (r % 8)) * 16 + (col % 8) * 2 (r % 8 == lane / 4 here).
  uint8_t* q_tile = smem + L::kQ;
#pragma unroll
  for (int part = 0; part < kPvParts; ++part)
#pragma unroll
    for (int j = 0; j < kPvN / 8; ++j)
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        const int col = part * kPvN + 8 * j;
        const int r = 64 * cw + 16 * warp + lane / 4 + 8 * i;
        const float v0 = o[part][4 * j + 2 * i] * inv[i], v1 = o[part][4 * j + 2 * i + 1] * inv[i];
        const int byte = (col / 64) * (kBM * 128) + r * 128 + ((((col % 64) / 8) ^ (lane / 4)) * 16) + (lane % 4) * 4;
        *reinterpret_cast<uint32_t*>(q_tile + byte) = pack2<T>(v0, v1);
      }
  named_sync(3 + cw, 128);
  constexpr int kChunks = kDv / 8;  // 16-byte chunks per output row
  T* out = static_cast<T*>(p.out);
  for (int idx = tid; idx < 64 * kChunks; idx += 128) {
    const int rr = idx / kChunks, ch = idx % kChunks;
    const int r = 64 * cw + rr;
    const int row = m0 + r;
    if (row < sq) {
      const int byte = (ch / 8) * (kBM * 128) + r * 128 + (((ch % 8) ^ (r % 8)) * 16);
      const int4 v = *reinterpret_cast<const int4*>(q_tile + byte);
      T* dst = out + b * p.o_sb + int64_t(q_row0 + row) * p.o_ss + h * p.o_sh + ch * 8;
      *reinterpret_cast<int4*>(dst) = v;
    }
  }
  if (p.lse != nullptr && lane % 4 == 0) {
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const int row = m0 + 64 * cw + 16 * warp + lane / 4 + 8 * i;
      if (row < sq) p.lse[b * p.lse_sb + h * p.lse_sh + q_row0 + row] = lse[i];
    }
  }
#else
  (void)tm_q, (void)tm_k, (void)tm_v, (void)p, (void)longest_first;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  __trap();  // built for sm_90 without the "a" features: no wgmma; the launcher refuses this build
#endif
#endif
}

}  // namespace kernelforge
