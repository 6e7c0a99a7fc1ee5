// Attention backward, pass 2 of 3 on Hopper (sm_90a) for head dims 256/256 and 192/128: wgmma tensor
// cores, TMA loads, warp specialization, with dK, dV and dQ split by columns between the two consumer
// warpgroups. Formula: include/kernelforge/attention.h. Pass 1 (attention_bwd_preprocess.cuh) has
// stored D = rowsum(dout * out) and lse2 = lse * log2(e) and zeroed the float32 dQ accumulator; pass 3
// (attention_bwd_dq_convert.cuh) rounds it into dq.
//
// Why a second kernel: attention_bwd_wgmma.cuh gives each consumer 64 keys and all columns of dK and
// dV, (Dqk + Dv) / 2 registers per thread: 256 of 240 at d256, 160 at 192/128 next to S, dP and dQ.
// Here one CTA takes 64 keys (a key tile, kv head, batch) and each consumer owns some 64-column
// tiles of dK, dV and dQ for all 64 keys (BwdColsSplit: 256/256 two each; 192/128 one dV tile each,
// dK two and one, dQ one and two, so both do the same work). S and dP are split by keys (consumer c:
// keys 32 c ..) and P and dS go through shared memory, where both consumers read the whole 64 x 64
// tiles as wgmma operands (FlashAttention-3's sm90 d256 backward splits the same way). The CTA walks
// the query heads of its group and the 64-row query tiles that see its keys ([m_begin, m_end),
// attention_bwd_common.cuh).
//
// 384 threads in three warpgroups:
//   warpgroup 0, the producer (24 registers): warp 0 loads K and V once (TMA), then per step a Q tile
//     into a 2-stage ring with its lse2 and D values (plain loads, +inf / 0 past the sequence end),
//     and a dO tile into its own ring (2 stages at 192/128, 1 at d256); lane 0 of warp 1, the dQ writer, adds the
//     consumers' staged dQ tiles to the float32 accumulator (TMA reduce-adds; in the deterministic mode in a fixed
//     key-tile order, semaphores per (b, h, query tile), as attention_bwd_wgmma.cuh); the other warps
//     leave.
//   warpgroups 1 and 2, the consumers (240 registers). Per query tile, consumer c:
//     S = Q K_c^T, dP = dO V_c^T          (wgmma m64n32, 32 keys, A and B K-major from shared memory)
//     P = 2^(S scale log2 e - lse2)        (softcap: s = cap tanh(u / cap), recomputed as the forward)
//     dS = P (dP - D)                      (softcap: times 1 - tanh^2)
//     P, dS -> shared memory (64 queries x 64 keys each, both consumers' halves)
//     dV_c += P^T dO_c, dK_c += dS^T Q_c   (wgmma m64n64 / m64n128, A = P^T / dS^T MN-major, B MN-major)
//     dQ_c = dS K_c                        (wgmma m64n64 / m64n128, A = dS K-major, B = K MN-major),
//                                          staged one 64-column tile at a time for the dQ writer
//   where X_c is consumer c's column tiles of X (dO, Q, K, dK, dV, dQ) and K_c, V_c in S and dP are
//   keys 32 c ..
// FLOPs per visible (query, key) pair: 2 Dqk each for S, dK, dQ and 2 Dv each for dP, dV.
// Registers per consumer thread: 32 per 64-column tile of dV, dK and dQ it owns (d256: 64 + 64 + 64;
// 192/128: 32 + 64 + 32 or 32 + 32 + 64), S and dP 16 each (dead when dQ is computed).
// Shared memory: K, V, 2 Q stages, 1 (d256) or 2 (192/128) dO stages (64 rows each), P and dS 2 x 8 KB, dQ staging 2 x
// 16 KB (one 64 x 64 float tile per consumer), lse2 / D 2 stages x 512 B: 210 KB at d256, 170 KB at
// 192/128. At d256 a second dO stage would need 32 KB more than the 227 KB a CTA may have. Every
// tile is 64 columns wide (128-byte rows, the TMA 128-byte swizzle) and 1024-byte aligned; see
// sm90_wgmma.cuh for the operand layouts.
// dK (times scale) and dV are written once at the end, in T; key rows past Sk are skipped; a key tile
// that no query sees writes zeros.
#pragma once

#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "attention/attention_bwd_workspace.h"
#include "attention/attention_problem.h"
#include "attention/kernels/attention_bwd_common.cuh"
#include "attention/kernels/sm90_wgmma.cuh"
#include "common/launch.cuh"
#include "common/tma.cuh"

namespace kernelforge {

constexpr int kBwdColsBlockM = 64;  // query rows per step
constexpr int kBwdColsBlockN = 64;  // keys per CTA
constexpr int kBwdColsQStages = 2;  // Q ring depth (dO: BwdColsSmem::kDoStages)
constexpr int kBwdColsThreads = 384;
constexpr int kBwdColsProducerRegs = 24;
constexpr int kBwdColsConsumerRegs = 240;  // 128 x 24 + 256 x 240 = 64512 <= 65536 registers

// Which 64-column tiles of dV, dK and dQ consumer c owns: [first, first + count). The counts of dK and
// dQ cross over at 192/128 so that both consumers multiply the same number of columns per step.
template <int kDqk, int kDv>
struct BwdColsSplit {
  static_assert((kDqk == 256 && kDv == 256) || (kDqk == 192 && kDv == 128), "head dims 256/256 and 192/128");
  static constexpr int kQkTiles = kDqk / 64, kVTiles = kDv / 64;
  static constexpr int v_first(int c) { return c * (kVTiles / 2); }
  static constexpr int v_count(int) { return kVTiles / 2; }
  static constexpr bool kOdd = kQkTiles % 2 == 1;
  static constexpr int k_first(int c) { return c == 0 ? 0 : (kQkTiles + 1) / 2; }
  static constexpr int k_count(int c) { return c == 0 ? (kQkTiles + 1) / 2 : kQkTiles / 2; }
  static constexpr int q_first(int c) { return kOdd ? (c == 0 ? (kQkTiles + 1) / 2 : 0) : k_first(c); }
  static constexpr int q_count(int c) { return kOdd ? (c == 0 ? kQkTiles / 2 : (kQkTiles + 1) / 2) : k_count(c); }
  // dQ tiles staged per step: rounds of one tile per consumer (a consumer with fewer skips its last).
  static constexpr int kDqRounds = (kQkTiles + 1) / 2;
  // Each tile of dV, dK and dQ has one owner, and both consumers multiply the same number of columns.
  static_assert(v_first(1) == v_count(0) && v_count(0) + v_count(1) == kVTiles, "dV tiles split");
  static_assert(k_first(1) == k_count(0) && k_count(0) + k_count(1) == kQkTiles, "dK tiles split");
  static_assert((q_first(0) == 0 ? q_first(1) == q_count(0) : q_first(0) == q_count(1)) &&
                    q_count(0) + q_count(1) == kQkTiles,
                "dQ tiles split");
  static_assert(v_count(0) + k_count(0) + q_count(0) == v_count(1) + k_count(1) + q_count(1), "balanced");
  static_assert(q_count(0) <= kDqRounds && q_count(1) <= kDqRounds, "one dQ tile per consumer and round");
};

// Shared-memory map (byte offsets from a 1024-aligned base) for head dims kDqk / kDv.
template <int kDqk, int kDv>
struct BwdColsSmem {
  static constexpr int kBM = kBwdColsBlockM, kBN = kBwdColsBlockN;
  static constexpr int kKBytes = kBN * kDqk * 2;  // K tile
  static constexpr int kVBytes = kBN * kDv * 2;   // V tile
  static constexpr int kQBytes = kBM * kDqk * 2;  // one Q stage
  static constexpr int kDoBytes = kBM * kDv * 2;  // one dO stage
  static constexpr int kPBytes = kBM * kBN * 2;   // P (64 queries x 64 keys); dS the same
  static constexpr int kDqBytes = kBM * 64 * 4;   // one consumer's 64-column float dQ tile
  // kv_full, q_full[s], q_empty[s], do_full[s], do_empty[s], dq_full, dq_empty
  static constexpr int kNumBars = 1 + 2 * kBwdColsQStages + 2 * 2 + 2;
  static constexpr int bytes_with(int do_stages) {  // + slack to align the base
    return kKBytes + kVBytes + kBwdColsQStages * kQBytes + do_stages * kDoBytes + 2 * kPBytes + 2 * kDqBytes +
           kBwdColsQStages * 2 * kBM * 4 + kNumBars * 8 + 1024;
  }
  // dO stages: two where they fit (192/128: 170 KB), one at d256 (two would need 242 KB).
  static constexpr int kDoStages = bytes_with(2) <= 227 * 1024 ? 2 : 1;
  static constexpr int kK = 0;
  static constexpr int kV = kK + kKBytes;
  static constexpr int kQ = kV + kVBytes;                     // stage s at kQ + s * kQBytes
  static constexpr int kDo = kQ + kBwdColsQStages * kQBytes;  // stage s at kDo + s * kDoBytes
  static constexpr int kP = kDo + kDoStages * kDoBytes;
  static constexpr int kDs = kP + kPBytes;
  static constexpr int kDq = kDs + kPBytes;         // consumer c at kDq + c * kDqBytes
  static constexpr int kRows = kDq + 2 * kDqBytes;  // stage s: float lse2[kBM], D[kBM]
  static constexpr int kBars = kRows + kBwdColsQStages * 2 * kBM * 4;
  static constexpr int kBytes = kBars + kNumBars * 8 + 1024;
  static_assert(kBytes == bytes_with(kDoStages), "the map and its size agree");
  static_assert(kBytes <= 227 * 1024, "shared memory of one CTA on sm_90");
};

// P and dS of one step in place (st: S -> P, dpt: dP -> dS). Element 4 j + 2 i + c is query row
// 16 warp + lane / 4 + 8 i of the tile, key 32 cw + 8 j + 2 (lane % 4) + c; rows: lse2[64], then D[64].
// Straight-line code; the masking of a partial tile is a second pass (bwd_cols_mask), as in
// attention_bwd_wgmma.cuh.
template <bool kSoftcap>
__device__ __forceinline__ void bwd_cols_softmax(float (&st)[16], float (&dpt)[16], const float* rows, float pre,
                                                 float post, int row0) {
  if constexpr (kSoftcap) {
#pragma unroll
    for (int e = 0; e < 16; ++e) st[e] = tanh_approx(st[e] * pre);
  }
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const float lse2 = rows[row0 + 8 * i], d = rows[kBwdColsBlockM + row0 + 8 * i];
#pragma unroll
    for (int j = 0; j < 4; ++j)
#pragma unroll
      for (int c = 0; c < 2; ++c) bwd_p_ds<kSoftcap>(st[4 * j + 2 * i + c], dpt[4 * j + 2 * i + c], lse2, d, pre, post);
  }
}

// acc = A B^T over kDepth columns (the wgmma issue; the caller fences and commits): A the 64 query rows
// at a_addr (Q or dO: 64-column tiles of kBwdColsBlockM rows), B 32 key rows at b_addr inside the K or
// V tile (64-column tiles of kBwdColsBlockN rows); both K-major. S = Q K_c^T, dP = dO V_c^T.
template <typename T, int kDepth>
__device__ __forceinline__ void bwd_cols_rows_by_keys(float (&acc)[16], uint32_t a_addr, uint32_t b_addr) {
#pragma unroll
  for (int kk = 0; kk < kDepth / 16; ++kk) {
    const uint64_t da = gmma_desc_k(a_addr + (kk / 4) * (kBwdColsBlockM * 128) + (kk % 4) * 32);
    const uint64_t db = gmma_desc_k(b_addr + (kk / 4) * (kBwdColsBlockN * 128) + (kk % 4) * 32);
    wgmma_ss<T, 32>(acc, da, db, kk > 0 ? 1 : 0);
  }
}

// Zeroes P and dS of the invisible pairs of a partial tile. Queries m0 + row0 + 8 i, keys key + 8 j + c
// (key = key0 + 32 cw + 2 (lane % 4)); row q sees [lo, hi) (BwdVisibility::row_bounds32).
__device__ __forceinline__ void bwd_cols_mask(float (&st)[16], float (&dpt)[16], int key, int row,
                                              const BwdVisibility& vis) {
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    int lo, hi;
    vis.row_bounds32(row + 8 * i, &lo, &hi);
#pragma unroll
    for (int j = 0; j < 4; ++j)
#pragma unroll
      for (int c = 0; c < 2; ++c)
        if (key + 8 * j + c < lo || key + 8 * j + c >= hi) st[4 * j + 2 * i + c] = dpt[4 * j + 2 * i + c] = 0.0f;
  }
}

// What the consumers share with the kernel: shared-memory addresses, barriers and the CTA's walk.
struct BwdColsCta {
  uint8_t* smem;
  uint64_t *kv_full, *q_full, *q_empty, *do_full, *do_empty, *dq_full, *dq_empty;
  const float* rows_lse2;
  int n_iters, nm, m_begin, m_end, key0, sk, b, kvh, k_row0;
  bool rev;
  __device__ __forceinline__ int step_m(int it) const { return rev ? m_end - 1 - it % nm : m_begin + it % nm; }
};

// Consumer warpgroup kC (threads 128 (kC + 1) ..): the per-step products of the kernel's comment for
// its keys 32 kC .. of S and dP and its column tiles of dV, dK, dQ (BwdColsSplit), then dK and dV.
template <typename T, int kDqk, int kDv, bool kSoftcap, int kC>
__device__ __forceinline__ void bwd_cols_consumer(const BwdColsCta& cta, const AttentionGradParams& p,
                                                  const BwdVisibility& vis) {
  using L = BwdColsSmem<kDqk, kDv>;
  using Split = BwdColsSplit<kDqk, kDv>;
  constexpr int kBM = L::kBM, kBN = L::kBN, kStages = kBwdColsQStages;
  constexpr int kV0 = Split::v_first(kC), kNV = 64 * Split::v_count(kC);  // dV columns kV0 * 64 .., kNV of them
  constexpr int kK0 = Split::k_first(kC), kNK = 64 * Split::k_count(kC);  // dK
  constexpr int kQ0 = Split::q_first(kC), kNQ = 64 * Split::q_count(kC);  // dQ
  constexpr float kLog2e = 1.4426950408889634f;
  const AttentionParams& f = p.f;
  uint8_t* smem = cta.smem;
  const int tid = threadIdx.x - 128 * (kC + 1);
  const int warp = tid / 32, lane = tid % 32;
  const int row0 = 16 * warp + lane / 4;  // this thread's query rows of S, dP, dQ (+ 8) and key rows of dK, dV
  // s2 = u * pre (no softcap: the logit in log2 units); with softcap th = tanh(u * pre), s2 = th * post.
  const float pre = kSoftcap ? f.scale / f.softcap : f.scale * kLog2e;
  const float post = kSoftcap ? f.softcap * kLog2e : 1.0f;

  float dv[kNV / 2], dk[kNK / 2];
#pragma unroll
  for (int e = 0; e < kNV / 2; ++e) dv[e] = 0.0f;
#pragma unroll
  for (int e = 0; e < kNK / 2; ++e) dk[e] = 0.0f;

  const uint32_t k_addr = smem_u32(smem + L::kK), v_addr = smem_u32(smem + L::kV);
  const uint32_t p_addr = smem_u32(smem + L::kP), ds_addr = smem_u32(smem + L::kDs);

  if (cta.n_iters > 0) mbar_wait(cta.kv_full, 0);
  for (int it = 0; it < cta.n_iters; ++it) {
    const int s = it % kStages;
    const int m0 = cta.step_m(it) * kBM;
    const uint32_t q_addr = smem_u32(smem + L::kQ + s * L::kQBytes);
    mbar_wait(&cta.q_full[s], (it / kStages) & 1);

    // ---- S = Q K_c^T (over Dqk), dP = dO V_c^T (over Dv): 64 queries x 32 keys each ----
    float st[16], dpt[16];
    wgmma_fence();
    bwd_cols_rows_by_keys<T, kDqk>(st, q_addr, k_addr + kC * 32 * 128);
    wgmma_commit();
    const int sd = it % L::kDoStages;
    const uint32_t do_addr = smem_u32(smem + L::kDo + sd * L::kDoBytes);
    mbar_wait(&cta.do_full[sd], (it / L::kDoStages) & 1);
    wgmma_fence();  // dP's accumulator registers, after the wait
    bwd_cols_rows_by_keys<T, kDv>(dpt, do_addr, v_addr + kC * 32 * 128);
    wgmma_commit();
    wgmma_wait<0>();
    reg_fence(st);
    reg_fence(dpt);

    // ---- P and dS in place, then the partial tile's masking ----
    bwd_cols_softmax<kSoftcap>(st, dpt, cta.rows_lse2 + s * 2 * kBM, pre, post, row0);
    if (!vis.tile_full(m0, kBM, cta.key0, kBN))
      bwd_cols_mask(st, dpt, cta.key0 + 32 * kC + 2 * (lane % 4), m0 + row0, vis);

    // ---- P, dS into shared memory: row = query, 64 keys of 128 bytes, 128-byte swizzle (16-byte
    // chunk ch of row r at ch ^ (r % 8), r % 8 = lane / 4); key 32 kC + 8 j + 2 (lane % 4) is in chunk
    // 4 kC + j. Both consumers' products of the previous step have read the tiles (barrier 1). ----
    named_sync(1, 256);
#pragma unroll
    for (int i = 0; i < 2; ++i)
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const int byte = (row0 + 8 * i) * 128 + (((4 * kC + j) ^ (lane / 4)) * 16) + (lane % 4) * 4;
        *reinterpret_cast<uint32_t*>(smem + L::kP + byte) = pack2<T>(st[4 * j + 2 * i], st[4 * j + 2 * i + 1]);
        *reinterpret_cast<uint32_t*>(smem + L::kDs + byte) = pack2<T>(dpt[4 * j + 2 * i], dpt[4 * j + 2 * i + 1]);
      }
    fence_proxy_async();  // the generic-proxy stores before the tensor cores read them
    named_sync(2, 256);   // both halves of the 64 keys are in P and dS

    // ---- dV_c += P^T dO_c, dK_c += dS^T Q_c (A: 64 keys x 16 queries, MN-major; B: 16 queries x kN
    // columns, MN-major, 64-column tiles kBM rows long), dQ_c = dS K_c (A: 64 queries x 16 keys,
    // K-major; B: 16 keys x kNQ columns, MN-major) ----
    float dq[kNQ / 2];
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < kBM / 16; ++kk)
      wgmma_ss<T, kNV, 1, 1>(dv, gmma_desc_mn(p_addr + kk * 16 * 128, kBM * 128),
                             gmma_desc_mn(do_addr + kV0 * (kBM * 128) + kk * 16 * 128, kBM * 128), 1);
    wgmma_commit();
#pragma unroll
    for (int kk = 0; kk < kBM / 16; ++kk)
      wgmma_ss<T, kNK, 1, 1>(dk, gmma_desc_mn(ds_addr + kk * 16 * 128, kBM * 128),
                             gmma_desc_mn(q_addr + kK0 * (kBM * 128) + kk * 16 * 128, kBM * 128), 1);
    wgmma_commit();
#pragma unroll
    for (int kk = 0; kk < kBN / 16; ++kk)
      wgmma_ss<T, kNQ, 0, 1>(dq, gmma_desc_k(ds_addr + kk * 32),
                             gmma_desc_mn(k_addr + kQ0 * (kBN * 128) + kk * 16 * 128, kBN * 128), kk > 0 ? 1 : 0);
    wgmma_commit();
    wgmma_wait<2>();  // dV done: this warpgroup no longer reads dO
    mbar_arrive(&cta.do_empty[sd]);
    wgmma_wait<1>();  // dK done: Q of stage s (and its lse2 / D rows) no longer read
    mbar_arrive(&cta.q_empty[s]);
    wgmma_wait<0>();  // dQ done: P and dS no longer read by this warpgroup
    reg_fence(dv);
    reg_fence(dk);
    reg_fence(dq);

    // ---- dQ_c one 64-column tile per round through this consumer's staging tile (boxes of 32
    // columns x 64 rows, 128-byte swizzle; conflict-free float2 stores), added to the float32
    // accumulator by the writer thread with TMA reduce-adds; a consumer with fewer tiles than rounds
    // arrives without staging in its last. Element 4 j + 2 i + c is query row0 + 8 i, column 8 j +
    // 2 (lane % 4) + c of this consumer's kNQ. Rows past the sequence end hold zeros (P = 0 there). ----
    uint8_t* stage_dq = smem + L::kDq + kC * L::kDqBytes;
#pragma unroll
    for (int round = 0; round < Split::kDqRounds; ++round) {
      mbar_wait(cta.dq_empty,
                ((it * Split::kDqRounds + round) & 1) ^ 1);  // the previous round's additions read the tiles
      if (round < kNQ / 64) {
#pragma unroll
        for (int jj = 0; jj < 8; ++jj)
#pragma unroll
          for (int i = 0; i < 2; ++i) {
            const int j = 8 * round + jj, row = row0 + 8 * i;
            const int ch = (8 * jj % 32) / 4 + (lane % 4) / 2;
            const int byte = (8 * jj / 32) * (kBM * 128) + row * 128 + ((ch ^ (lane / 4)) * 16) + (lane % 2) * 8;
            *reinterpret_cast<float2*>(stage_dq + byte) = make_float2(dq[4 * j + 2 * i], dq[4 * j + 2 * i + 1]);
          }
        fence_proxy_async();  // the staging stores before the TMA unit reads them
      }
      named_sync(3 + kC, 128);
      if (tid == 0) mbar_arrive(cta.dq_full);
    }
  }

  // ---- dK = scale * sum dS^T q, dV: element 4 j + 2 i + c is key row0 + 8 i, column 64 kK0 (kV0) +
  // 8 j + 2 (lane % 4) + c ----
  T* dkp = static_cast<T*>(p.dk) + cta.b * p.dk_sb + (int64_t(cta.k_row0) + cta.key0) * p.dk_ss + cta.kvh * p.dk_sh;
  T* dvp = static_cast<T*>(p.dv) + cta.b * p.dv_sb + (int64_t(cta.k_row0) + cta.key0) * p.dv_ss + cta.kvh * p.dv_sh;
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const int row = row0 + 8 * i;
    if (cta.key0 + row >= cta.sk) continue;
#pragma unroll
    for (int j = 0; j < kNK / 8; ++j) {
      const int col = 64 * kK0 + 8 * j + 2 * (lane % 4);
      *reinterpret_cast<uint32_t*>(dkp + row * p.dk_ss + col) =
          pack2<T>(dk[4 * j + 2 * i] * f.scale, dk[4 * j + 2 * i + 1] * f.scale);
    }
#pragma unroll
    for (int j = 0; j < kNV / 8; ++j) {
      const int col = 64 * kV0 + 8 * j + 2 * (lane % 4);
      *reinterpret_cast<uint32_t*>(dvp + row * p.dv_ss + col) = pack2<T>(dv[4 * j + 2 * i], dv[4 * j + 2 * i + 1]);
    }
  }
}

// Grid (ceil(Sk / 64), Hkv, B); 384 threads; BwdColsSmem<kDqk, kDv>::kBytes of dynamic shared memory.
// tm_q / tm_do / tm_k / tm_v: 4-D maps (column, row, head, batch) with 64 x 64 boxes, 128-byte
// swizzle (varlen: batch extent 1, rows = all tokens, a sequence's rows from cu_seqlens). tm_dq: the
// float32 dQ accumulator (column, row over the batch, head), 32 x 64 boxes, 128-byte swizzle.
template <typename T, int kDqk, int kDv, bool kSoftcap>
__global__ void __launch_bounds__(kBwdColsThreads, 1)
    attention_bwd_wgmma_cols(const __grid_constant__ CUtensorMap tm_q, const __grid_constant__ CUtensorMap tm_k,
                             const __grid_constant__ CUtensorMap tm_v, const __grid_constant__ CUtensorMap tm_do,
                             const __grid_constant__ CUtensorMap tm_dq, const AttentionGradParams p,
                             const AttnBwdWs ws) {
#if KF_SM90A
  using L = BwdColsSmem<kDqk, kDv>;
  using Split = BwdColsSplit<kDqk, kDv>;
  constexpr int kBM = L::kBM, kBN = L::kBN, kStages = kBwdColsQStages;

  extern __shared__ uint8_t smem_raw[];
  BwdColsCta cta;
  cta.smem = smem_raw + ((1024 - (smem_u32(smem_raw) & 1023)) & 1023);
  uint8_t* smem = cta.smem;
  cta.kv_full = reinterpret_cast<uint64_t*>(smem + L::kBars);
  cta.q_full = cta.kv_full + 1;
  cta.q_empty = cta.q_full + kStages;
  cta.do_full = cta.q_empty + kStages;
  cta.do_empty = cta.do_full + 2;
  cta.dq_full = cta.do_empty + 2;                                // both consumers' dQ tiles of a round staged
  cta.dq_empty = cta.dq_full + 1;                                // the writer's reduce-adds have read them
  float* rows_lse2 = reinterpret_cast<float*>(smem + L::kRows);  // stage s: lse2 at 2 kBM s, D after it
  cta.rows_lse2 = rows_lse2;

  pdl_wait();  // every global access follows the previous kernel (pass 1)

  const AttentionParams& f = p.f;
  // Deterministic mode: each key tile walks its query tiles downwards; see the dQ writer below.
  cta.rev = p.deterministic;
  const int n_tile = int(blockIdx.x);
  const int kvh = blockIdx.y, b = blockIdx.z;
  const BwdSequence bs(f, b);
  const int sq = bs.sq, sk = bs.sk, q_row0 = bs.q_row0, k_row0 = bs.k_row0, batch_coord = bs.batch_coord;
  const int key0 = n_tile * kBN;
  if (key0 >= sk) return;  // varlen: a key tile past this sequence's end (the whole CTA leaves)
  const int64_t qbase = f.varlen ? int64_t(q_row0) : int64_t(b) * f.seqlen_q;  // workspace row numbering
  const BwdVisibility vis(f, sq, sk);
  vis.query_tiles(key0, kBN, kBM, &cta.m_begin, &cta.m_end);
  cta.nm = cta.m_end - cta.m_begin;
  cta.n_iters = cta.nm * f.group;  // (query head, query tile) steps, head-major
  cta.key0 = key0, cta.sk = sk, cta.b = b, cta.kvh = kvh, cta.k_row0 = k_row0;
  const int n_iters = cta.n_iters, nm = cta.nm;

  if (threadIdx.x == 0) {
    mbar_init_count(cta.kv_full, 1);
    for (int s = 0; s < kStages; ++s) {
      mbar_init_count(&cta.q_full[s], 1 + 32);  // the TMA issuer's expect_tx + warp 0's lse2 / D stores
      mbar_init_count(&cta.q_empty[s], 256);    // every consumer thread (each has read the lse2 / D rows)
    }
    for (int s = 0; s < L::kDoStages; ++s) {
      mbar_init_count(&cta.do_full[s], 1);
      mbar_init_count(&cta.do_empty[s], 256);
    }
    mbar_init_count(cta.dq_full, 2);   // thread 0 of each consumer warpgroup
    mbar_init_count(cta.dq_empty, 1);  // the writer
    mbar_init_fence();
  }
  __syncthreads();

  const int wg = threadIdx.x / 128;
  if (wg == 1) {
    setmaxnreg_inc<kBwdColsConsumerRegs>();
    bwd_cols_consumer<T, kDqk, kDv, kSoftcap, 0>(cta, p, vis);
    return;
  }
  if (wg == 2) {
    setmaxnreg_inc<kBwdColsConsumerRegs>();
    bwd_cols_consumer<T, kDqk, kDv, kSoftcap, 1>(cta, p, vis);
    return;
  }

  // ---- producer ----
  setmaxnreg_dec<kBwdColsProducerRegs>();
  if (threadIdx.x < 32 && n_iters > 0) {
    const int lane = threadIdx.x;
    if (lane == 0) {
      tma_prefetch_desc(&tm_q);
      tma_prefetch_desc(&tm_do);
      mbar_expect(cta.kv_full, L::kKBytes + L::kVBytes);
#pragma unroll
      for (int c = 0; c < kDqk / 64; ++c)
        tma_load_4d(smem + L::kK + c * kBN * 128, &tm_k, cta.kv_full, c * 64, k_row0 + key0, kvh, batch_coord);
#pragma unroll
      for (int c = 0; c < kDv / 64; ++c)
        tma_load_4d(smem + L::kV + c * kBN * 128, &tm_v, cta.kv_full, c * 64, k_row0 + key0, kvh, batch_coord);
    }
    for (int it = 0; it < n_iters; ++it) {
      const int s = it % kStages;
      const int h = kvh * f.group + it / nm;
      const int m0 = cta.step_m(it) * kBM, row = q_row0 + m0;
      mbar_wait(&cta.q_empty[s], ((it / kStages) & 1) ^ 1);  // a fresh barrier passes parity 1 at once
      if (lane == 0) {
        mbar_expect(&cta.q_full[s], L::kQBytes);
#pragma unroll
        for (int c = 0; c < kDqk / 64; ++c)
          tma_load_4d(smem + L::kQ + s * L::kQBytes + c * kBM * 128, &tm_q, &cta.q_full[s], c * 64, row, h,
                      batch_coord);
      }
      float* rows = rows_lse2 + s * 2 * kBM;
      const int64_t src = int64_t(h) * f.total_q + qbase + m0;
#pragma unroll
      for (int r = lane; r < kBM; r += 32) {
        const bool ok = m0 + r < sq;
        rows[r] = ok ? ws.lse2[src + r] : INFINITY;  // P = 0 on rows past the sequence end
        rows[kBM + r] = ok ? ws.dsum[src + r] : 0.0f;
      }
      mbar_arrive(&cta.q_full[s]);  // release: the stores above are seen by the consumers' wait
      // dO: stage sd is free once both consumers' dV product of step it - kDoStages is done.
      const int sd = it % L::kDoStages;
      mbar_wait(&cta.do_empty[sd], ((it / L::kDoStages) & 1) ^ 1);
      if (lane == 0) {
        mbar_expect(&cta.do_full[sd], L::kDoBytes);
#pragma unroll
        for (int c = 0; c < kDv / 64; ++c)
          tma_load_4d(smem + L::kDo + sd * L::kDoBytes + c * kBM * 128, &tm_do, &cta.do_full[sd], c * 64, row, h,
                      batch_coord);
      }
    }
  } else if (threadIdx.x == 32 && n_iters > 0) {
    // ---- the dQ writer (one thread): per step kDqRounds rounds of one 64-column tile per consumer;
    // per round, after both consumers have arrived, one TMA reduce-add per 32-column box staged; the
    // staging tiles are released as soon as the TMA unit has read them. Deterministic mode: as in
    // attention_bwd_wgmma.cuh (query tile m receives its additions in increasing key-tile order; a
    // CTA waits only for CTAs of lower linear index).
    for (int it = 0; it < n_iters; ++it) {
      const int h = kvh * f.group + it / nm;
      const int m = cta.step_m(it);
      int32_t* sem = ws.sem + (int64_t(b) * f.heads_q + h) * ws.q_tiles + m;
#pragma unroll 1
      for (int round = 0; round < Split::kDqRounds; ++round) {
        mbar_wait(cta.dq_full, (it * Split::kDqRounds + round) & 1);
        if (p.deterministic && round == 0) {
          const int first = vis.keys_lo(m, kBM) / kBN;  // key tiles below this one that visit m
          while (ld_acquire_gpu(sem) < n_tile - first) __nanosleep(32);
        }
#pragma unroll
        for (int c = 0; c < 2; ++c) {
          if (round >= Split::q_count(c)) continue;
#pragma unroll
          for (int box = 0; box < 2; ++box)
            tma_reduce_add_3d(&tm_dq, smem + L::kDq + c * L::kDqBytes + box * kBM * 128,
                              64 * (Split::q_first(c) + round) + 32 * box, int(qbase + m * kBM), h);
        }
        bulk_commit();
        bulk_wait_read<0>();
        mbar_arrive(cta.dq_empty);
      }
      if (p.deterministic) {
        bulk_wait<0>();  // the additions are done (in L2) before the next key tile's turn
        __threadfence();
        atomicAdd(sem, 1);
      }
    }
    bulk_wait<0>();
  }
#else
  (void)tm_q, (void)tm_k, (void)tm_v, (void)tm_do, (void)tm_dq, (void)p, (void)ws;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  __trap();  // built for sm_90 without the "a" features: no wgmma; the launcher refuses this build
#endif
#endif
}

}  // namespace kernelforge
