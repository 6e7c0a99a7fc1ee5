// Attention backward, pass 2 of 3 on Hopper (sm_90a): wgmma tensor cores, TMA loads, warp
// specialization. Formula: include/kernelforge/attention.h. Pass 1 (attention_bwd_preprocess.cuh) has
// stored D = rowsum(dout * out) and lse2 = lse * log2(e) and zeroed the float32 dQ accumulator; pass 3
// (attention_bwd_dq_convert.cuh) rounds it into dq. Same work split as the mma kernel
// (attention_bwd_mma.cuh): one CTA per (key tile of 128 keys, kv head, batch) keeps K, V in shared
// memory and dK, dV in registers, and walks the query heads of its group and the query tiles of BM
// rows (64 at d128 and at d64 with a softcap, 128 at d64 without) that see its keys ([m_begin, m_end),
// attention_bwd_common.cuh). With the paired schedule (plan order=paired) a CTA takes two key tiles of
// its sequence, t and T - 1 - t, one after the other (see `paired` below).
//
// 384 threads in three warpgroups:
//   warpgroup 0, the producer (24 registers): warp 0 loads K and V once per key tile (TMA), then per
//     step the Q and dO tiles (TMA, 64-row boxes) and the BM lse2 and D values (plain loads, +inf / 0
//     past the sequence end) into a 2-stage ring; lane 0 of warp 1, the dQ writer, adds the
//     consumers' staged dQ tiles to the float32 accumulator (TMA reduce-adds; in the deterministic
//     mode in a fixed key-tile order, semaphores per (b, h, query tile)); the other warps leave.
//   warpgroups 1 and 2, the consumers (240 registers): keys 64 c .. 64 c + 63 of the tile each. Per
//     query tile:
//       S^T = K_c Q^T, dP^T = V_c dO^T          (wgmma m64nBM, A and B K-major from shared memory)
//       P^T = 2^(S^T scale log2 e - lse2)        (softcap: s = c tanh(u / c), recomputed as the forward)
//       dS^T = P^T (dP^T - D)                    (softcap: times 1 - tanh^2)
//       dV += P^T dO, dK += dS^T Q               (wgmma m64nD, A = P^T / dS^T from registers, the
//                                                 accumulator layout converted in place; B MN-major)
//       dS^T -> shared memory (double-buffered; both warpgroups' halves), then one 64-row tile of
//       dQ = dS K over all 128 keys (wgmma m64nC, A = dS and B = K both MN-major): BM = 64, columns
//       C c .. (C = D / 2: 64 at d128, 32 at d64); BM = 128 (d64), query rows 64 c .., C = 64; staged
//       in shared memory for the dQ writer.
// FLOPs per visible (query, key) pair: 2 D each for S, dP, dV, dK, dQ (2.5x the forward's 4 D).
// Registers per consumer thread: dV, dK D / 2 each, S^T and dP^T BM / 2 each, then P and dS as 16-bit
// A fragments BM / 4 each and dQ C / 2 (d128: 64 + 64 + 32 + 32; d64, BM = 128: 32 + 32 + 64 + 64; d64
// with a softcap, BM = 64: 32 + 32 + 32 + 32, since BM = 128 leaves too few registers for the tanh
// temporaries and spills 160 bytes per thread).
// Shared memory: K, V 2 x 128 D bytes, 2 stages x (Q + dO, 2 x 2 BM D bytes), 2 x dS^T 256 BM bytes,
// 2 x dQ staging 256 C bytes, lse2 / D 2 stages x 8 BM bytes: 193 KB at d128, 194 KB at d64 with BM =
// 128, 113 KB at d64 with BM = 64. Every tile is 64 columns wide (128-byte rows, the TMA 128-byte
// swizzle) and 1024-byte aligned; see sm90_wgmma.cuh for the operand layouts and descriptors.
// dK (times scale) and dV are written once at the end of a key tile, in T; key rows past Sk are
// skipped; a key tile that no query sees writes zeros.
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

// Query rows per step: 64 at d128, where dK and dV take 128 of a consumer thread's 240 registers;
// 128 at d64, where they take 64: S^T and dP^T become m64n128 products and the CTA adds one 128 x 64
// dQ tile per step, half the reduce-add bytes per FLOP of two 64-key halves adding 64 x 64 each. d64
// with a softcap takes 64 rows: at 128, S^T, dP^T, dK and dV hold 192 of the 240 registers and the
// softcap's tanh temporaries spill. The planner's block_m (attention_plan_bwd.cpp) is this value.
template <int kD, bool kSoftcap>
constexpr int kBwdWgmmaBlockM = kD == 64 && !kSoftcap ? 128 : 64;
constexpr int kBwdWgmmaBlockN = 128;  // keys per CTA: two consumer warpgroups x 64
constexpr int kBwdWgmmaBoxRows = 64;  // rows of a Q / dO TMA box and of a consumer's dQ tile
constexpr int kBwdWgmmaStages = 2;    // Q / dO ring depth
constexpr int kBwdWgmmaThreads = 384;
constexpr int kBwdWgmmaProducerRegs = 24;
constexpr int kBwdWgmmaConsumerRegs = 240;  // 128 x 24 + 256 x 240 = 64512 <= 65536 registers

// Shared-memory map (byte offsets from a 1024-aligned base); Dqk = Dv = kD, kBM query rows per step.
template <int kD, int kBM_>
struct BwdWgmmaSmem {
  static constexpr int kBM = kBM_, kBN = kBwdWgmmaBlockN;
  // dQ columns of a consumer's 64-row tile: BM = 64 splits the kD columns between the two consumers,
  // BM = 128 (d64) the query rows.
  static constexpr int kDqCols = kBM == 64 ? kD / 2 : kD;
  static constexpr int kKBytes = kBN * kD * 2;    // K tile; V the same
  static constexpr int kQBytes = kBM * kD * 2;    // one stage of Q; dO the same
  static constexpr int kDsBytes = kBN * kBM * 2;  // dS^T: 128 key rows x kBM queries, 64-query tiles
  static constexpr int kK = 0;
  static constexpr int kV = kK + kKBytes;
  static constexpr int kQ = kV + kKBytes;                      // stage s at kQ + s * kQBytes
  static constexpr int kDo = kQ + kBwdWgmmaStages * kQBytes;   // stage s at kDo + s * kQBytes
  static constexpr int kDs = kDo + kBwdWgmmaStages * kQBytes;  // buffer u at kDs + u * kDsBytes
  static constexpr int kDqBytes = 64 * kDqCols * 4;            // one consumer's float dQ tile
  static constexpr int kDq = kDs + 2 * kDsBytes;               // consumer c at kDq + c * kDqBytes
  static constexpr int kRows = kDq + 2 * kDqBytes;             // stage s: float lse2[kBM], D[kBM]
  static constexpr int kBars = kRows + kBwdWgmmaStages * 2 * kBM * 4;
  // kv_full, q_full[s], q_empty[s], dq_full, dq_empty, kv_empty
  static constexpr int kNumBars = 4 + 2 * kBwdWgmmaStages;
  // int4 {sq, sk, q_row0, k_row0} of the CTA's sequence, then its key tiles {n, m_begin, m_end, 0} x 2
  static constexpr int kInfo = kBars + kNumBars * 8;
  static constexpr int kBytes = kInfo + 3 * 16 + 1024;  // + slack to align the base
  static_assert(kD % 64 == 0, "64-column tiles");
  static_assert(kDqCols % 32 == 0 && kDqBytes % 1024 == 0, "dQ staging: 32-column boxes, 1024-byte aligned");
  static_assert(kBytes <= 227 * 1024, "shared memory of one CTA on sm_90");
};

// P^T and dS^T of one step in place (st: S^T -> P^T, dpt: dP^T -> dS^T). Element 4 j + 2 i + c is key
// key_r + 8 i, query 8 j + 2 (lane % 4) + c of the tile; rows: lse2[kBM], then D[kBM]. kSoftcap is
// the kernel's template parameter, and the masking of a partial tile is a second pass
// (bwd_wgmma_mask), so the common path (a full tile without softcap: FFMA, EX2, FADD, FMUL per element)
// is straight-line code. With both checks inside the loop every element jumped over its masking code,
// the loop spanned 2400 instructions, and "no instruction" (instruction-cache misses) was 31 % of the
// d64 kernel's stall samples on the H200.
template <bool kSoftcap, int kBM>
__device__ __forceinline__ void bwd_wgmma_softmax(float (&st)[kBM / 2], float (&dpt)[kBM / 2], const float* rows,
                                                  float pre, float post, int lane) {
  // Softcap: s = softcap tanh(u / softcap), recomputed as the forward; th = tanh(u / softcap) first,
  // in place, then dS = P (dP - D) (1 - th^2).
  if constexpr (kSoftcap) {
#pragma unroll
    for (int e = 0; e < kBM / 2; ++e) st[e] = tanh_approx(st[e] * pre);
  }
#pragma unroll
  for (int j = 0; j < kBM / 8; ++j) {
    const int q = 8 * j + 2 * (lane % 4);
    const float2 l2 = *reinterpret_cast<const float2*>(rows + q);
    const float2 dd = *reinterpret_cast<const float2*>(rows + kBM + q);
#pragma unroll
    for (int i = 0; i < 2; ++i)
#pragma unroll
      for (int c = 0; c < 2; ++c) {
        const int e = 4 * j + 2 * i + c;
        bwd_p_ds<kSoftcap>(st[e], dpt[e], c ? l2.y : l2.x, c ? dd.y : dd.x, pre, post);
      }
  }
}

// Zeroes P^T and dS^T of the invisible pairs of a partial tile (overwrites: an invisible logit may
// have given P = inf). Keys key + 8 i (key = key0 + key_r), queries m0 + 8 j + 2 (lane % 4) + c; row
// i sees [lo, hi) (BwdVisibility::row_bounds32: keys >= Sk, a last tile's rows past the end, invisible).
template <int kBM>
__device__ __forceinline__ void bwd_wgmma_mask(float (&st)[kBM / 2], float (&dpt)[kBM / 2], int lane, int key, int m0,
                                               const BwdVisibility& vis) {
#pragma unroll
  for (int j = 0; j < kBM / 8; ++j)
#pragma unroll
    for (int c = 0; c < 2; ++c) {
      int lo, hi;
      vis.row_bounds32(m0 + 8 * j + 2 * (lane % 4) + c, &lo, &hi);
#pragma unroll
      for (int i = 0; i < 2; ++i)
        if (key + 8 * i < lo || key + 8 * i >= hi) st[4 * j + 2 * i + c] = dpt[4 * j + 2 * i + c] = 0.0f;
    }
}

// One key tile of the CTA: its index n (-1: none) and the query tiles [m_begin, m_end) that see it
// (BwdVisibility::query_tiles).
struct BwdWgmmaKeyTile {
  int n, m_begin, m_end;
  __device__ __forceinline__ explicit BwdWgmmaKeyTile(const int4& v) : n(v.x), m_begin(v.y), m_end(v.z) {}
  __device__ __forceinline__ int key0() const { return n * kBwdWgmmaBlockN; }
  __device__ __forceinline__ int nm() const { return m_end - m_begin; }
  // Query tile of the step mi of a query head: downwards in the deterministic mode (rev), upwards
  // otherwise.
  __device__ __forceinline__ int step_m(int mi, bool rev) const { return rev ? m_end - 1 - mi : m_begin + mi; }
};

// A shared-memory read that stays where it is written (volatile). Thread 0 stores the CTA's sequence
// bounds and key tiles in shared memory before the roles split, and the producer warpgroup re-reads
// them where it needs them: its 24 registers then hold only its loop counters through the steps.
__device__ __forceinline__ int4 ld_shared_v4(const int4* p) {
  int4 v;
  asm volatile("ld.shared.v4.s32 {%0, %1, %2, %3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "r"(smem_u32(p)));
  return v;
}

// Grid (ceil(Sk / 128), Hkv, B), or (ceil(ceil(Sk / 128) / 2), Hkv, B) with `paired`; 384 threads;
// BwdWgmmaSmem<kD, kBM>::kBytes of dynamic shared memory.
// tm_q / tm_do: 4-D maps (column, row, head, batch) with 64 x 64 boxes; tm_k / tm_v: 64 x 128 boxes;
// 128-byte swizzle (varlen: batch extent 1, rows = all tokens, a sequence's rows from cu_seqlens).
// tm_dq: the float32 dQ accumulator (column, row over the batch, head), 32 x 64 boxes, 128-byte swizzle.
// paired: CTA x takes key tiles x and T_b - 1 - x of sequence b (T_b = ceil(Sk_b / 128); x alone when
// x = T_b - 1 - x; CTAs with 2 x >= T_b leave), the plan's order=paired; never with p.deterministic.
// kSoftcap = f.softcap > 0 (a template parameter: one softmax variant per kernel; two in one kernel
// spilled at d64); kBM = kBwdWgmmaBlockM<kD, kSoftcap> (instantiated: d128 64, d64 128 without and 64
// with a softcap).
template <typename T, int kD, int kBM, bool kSoftcap>
__global__ void __launch_bounds__(kBwdWgmmaThreads, 1)
    attention_bwd_wgmma(const __grid_constant__ CUtensorMap tm_q, const __grid_constant__ CUtensorMap tm_k,
                        const __grid_constant__ CUtensorMap tm_v, const __grid_constant__ CUtensorMap tm_do,
                        const __grid_constant__ CUtensorMap tm_dq, const AttentionGradParams p, const AttnBwdWs ws,
                        const bool paired) {
#if KF_SM90A
  using L = BwdWgmmaSmem<kD, kBM>;
  constexpr int kBN = kBwdWgmmaBlockN, kStages = kBwdWgmmaStages;
  // dQ = dS K (kBM queries x kD columns over all 128 keys, dS^T of both warpgroups exchanged through
  // shared memory), one 64-row tile of kDqCols columns per consumer warpgroup: 64 queries (d128, and
  // d64 with a softcap), columns kDqCols c .. (kDqCols = kD / 2: 64 at d128, 32 at d64); 128 queries
  // (d64), query rows 64 c .., kDqCols = 64. The two tiles are disjoint.
  constexpr bool kSplitCols = kBM == 64;
  constexpr int kDqCols = L::kDqCols;
  static_assert((kBM == 64 && (kD == 64 || kD == 128)) || (kD == 64 && kBM == 128), "head dims 64 and 128");
  constexpr float kLog2e = 1.4426950408889634f;

  extern __shared__ uint8_t smem_raw[];
  uint8_t* smem = smem_raw + ((1024 - (smem_u32(smem_raw) & 1023)) & 1023);
  uint64_t* kv_full = reinterpret_cast<uint64_t*>(smem + L::kBars);
  uint64_t* q_full = kv_full + 1;
  uint64_t* q_empty = q_full + kStages;
  uint64_t* dq_full = q_empty + kStages;                         // both consumers' dQ tiles staged
  uint64_t* dq_empty = dq_full + 1;                              // the writer's reduce-adds have read them
  uint64_t* kv_empty = dq_empty + 1;                             // the consumers have read a key tile's K, V
  int4* info = reinterpret_cast<int4*>(smem + L::kInfo);         // sequence bounds, then the key tiles
  float* rows_lse2 = reinterpret_cast<float*>(smem + L::kRows);  // stage s: lse2 at 2 kBM s, D after it

  pdl_wait();  // every global access follows the previous kernel (pass 1)

  const AttentionParams& f = p.f;
  // Deterministic mode: each key tile walks its query tiles downwards; see the dQ writer below.
  const bool rev = p.deterministic;
  const int kvh = blockIdx.y, b = blockIdx.z;
  const BwdSequence bs(f, b);
  const int sq = bs.sq, sk = bs.sk, q_row0 = bs.q_row0, k_row0 = bs.k_row0, batch_coord = bs.batch_coord;
  // The CTA's key tiles. Unpaired: blockIdx.x's. Paired: x and
  // T_b - 1 - x, the longer first (causal: T_b - x query tiles, then x + 1 at Sq = Sk and BM = 128).
  // The pairing is per sequence, so varlen calls pair too: blockIdx.z is the sequence and the grid's
  // ceil(ceil(max Sk / 128) / 2) CTAs per sequence cover the pairs of every sequence; the CTAs past a
  // sequence's pairs leave.
  // Paired is never deterministic: that mode adds to each query tile in increasing key-tile order,
  // and it cannot deadlock because a CTA waits only for CTAs of lower linear index (dispatched before
  // it). A CTA holding t and T - 1 - t waits through t for the key tiles 0 .. t - 1 (the pairs around
  // its own) and through T - 1 - t for t + 1 .. T - 2 - t (the pairs nested inside it), so no
  // linear order of the CTAs has each wait only for CTAs before it: progress would need the whole
  // grid resident, which nothing guarantees (running t first, a CTA would even wait for its own
  // second tile). An order of additions that follows the dispatch (by CTA, then first and second
  // tile) would be deadlock-free, but the key tiles would no longer reach a query tile at the same
  // step and the chain of waits would serialize the additions. check_bwd_plan rejects the
  // combination and the launcher refuses it.
  int n0, n1 = -1;
  if (paired) {
    const int t_seq = (sk + kBN - 1) / kBN;
    n0 = blockIdx.x;
    if (2 * n0 >= t_seq) return;  // past this sequence's pairs (the whole CTA leaves)
    if (t_seq - 1 - n0 != n0) n1 = t_seq - 1 - n0;
  } else {
    n0 = int(blockIdx.x);
    if (n0 * kBN >= sk) return;  // varlen: a key tile past this sequence's end (the whole CTA leaves)
  }
  // The workspace's first row of the sequence (below 2^30: the planner's limit on total_q).
  auto qbase_of = [&](int q_row0_) { return f.varlen ? q_row0_ : int(blockIdx.z) * f.seqlen_q; };
  const BwdVisibility vis(f, sq, sk);

  if (threadIdx.x == 0) {
    mbar_init_count(kv_full, 1);
    for (int s = 0; s < kStages; ++s) {
      mbar_init_count(&q_full[s], 1 + 32);  // the TMA issuer's expect_tx + warp 0's lse2 / D stores
      mbar_init_count(&q_empty[s], 256);    // every consumer thread (each has read the lse2 / D rows)
    }
    mbar_init_count(dq_full, 2);     // thread 0 of each consumer warpgroup
    mbar_init_count(dq_empty, 1);    // the writer
    mbar_init_count(kv_empty, 256);  // every consumer thread, after a key tile's last step
    info[0] = make_int4(sq, sk, q_row0, k_row0);
    for (int ti = 0; ti < 2; ++ti) {
      const int n = ti == 0 ? n0 : n1;
      int m_begin = 0, m_end = 0;
      if (n >= 0) vis.query_tiles(n * kBN, kBN, kBM, &m_begin, &m_end);
      info[1 + ti] = make_int4(n, m_begin, m_end, 0);
    }
    mbar_init_fence();
  }
  __syncthreads();

  const int wg = threadIdx.x / 128;
  if (wg == 0) {
    // ---- producer ----
    setmaxnreg_dec<kBwdWgmmaProducerRegs>();
    if (threadIdx.x < 32) {
      const int lane = threadIdx.x;
      if (lane == 0) {
        tma_prefetch_desc(&tm_q);
        tma_prefetch_desc(&tm_do);
      }
      // g: the CTA's step over its key tiles; the Q / dO ring's stage and phase continue across them.
      // A key tile's K and V load first; the second tile's once the consumers have finished the first
      // tile's last step (kv_empty: they arrive after its wgmma_wait<0>, so the tensor cores' reads
      // are done and TMA may overwrite the tiles), while they stage that step's dQ and store dK, dV.
      int g = 0;
#pragma unroll 1
      for (int ti = 0; ti < 2; ++ti) {
        const BwdWgmmaKeyTile kt(ld_shared_v4(&info[1 + ti]));
        if (kt.n < 0) break;
        if (kt.nm() == 0) continue;  // no query sees it: no load, dK = dV = 0
        // The first tile's K, V are out when it has steps (re-read: no register holds it).
        if (ti > 0 && BwdWgmmaKeyTile(ld_shared_v4(&info[1])).nm() > 0) mbar_wait(kv_empty, 0);
        if (lane == 0) {
          const int row = ld_shared_v4(&info[0]).w + kt.key0();  // k_row0 + key0
          mbar_expect(kv_full, 2 * L::kKBytes);
#pragma unroll
          for (int c = 0; c < kD / 64; ++c) {
            tma_load_4d(smem + L::kK + c * kBN * 128, &tm_k, kv_full, c * 64, row, kvh, batch_coord);
            tma_load_4d(smem + L::kV + c * kBN * 128, &tm_v, kv_full, c * 64, row, kvh, batch_coord);
          }
        }
#pragma unroll 1
        for (int h = kvh * f.group; h < (kvh + 1) * f.group; ++h)
#pragma unroll 1
          for (int mi = 0;; ++mi, ++g) {
            const BwdWgmmaKeyTile t(ld_shared_v4(&info[1 + ti]));
            if (mi >= t.nm()) break;
            const int s = g % kStages;
            const uint32_t phase = (g / kStages) & 1;
            const int m0 = t.step_m(mi, rev) * kBM;
            mbar_wait(&q_empty[s], phase ^ 1);        // a fresh barrier passes parity 1 at once
            const int4 seq = ld_shared_v4(&info[0]);  // sq, sk, q_row0, k_row0
            if (lane == 0) {
              mbar_expect(&q_full[s], 2 * L::kQBytes);
#pragma unroll
              for (int c = 0; c < kD / 64; ++c)
#pragma unroll
                for (int r = 0; r < kBM / kBwdWgmmaBoxRows; ++r) {
                  const int off = c * kBM * 128 + r * kBwdWgmmaBoxRows * 128, row = seq.z + m0 + r * kBwdWgmmaBoxRows;
                  tma_load_4d(smem + L::kQ + s * L::kQBytes + off, &tm_q, &q_full[s], c * 64, row, h, batch_coord);
                  tma_load_4d(smem + L::kDo + s * L::kQBytes + off, &tm_do, &q_full[s], c * 64, row, h, batch_coord);
                }
            }
            float* rows = rows_lse2 + s * 2 * kBM;
            const int row0 = m0 + lane;  // this lane's rows: row0 + 32 i
            const int64_t src = int64_t(h) * f.total_q + qbase_of(seq.z) + row0;
#pragma unroll
            for (int i = 0; i < kBM / 32; ++i) {
              const bool ok = row0 + 32 * i < seq.x;
              rows[lane + 32 * i] = ok ? ws.lse2[src + 32 * i] : INFINITY;  // P = 0 past the sequence end
              rows[kBM + lane + 32 * i] = ok ? ws.dsum[src + 32 * i] : 0.0f;
            }
            mbar_arrive(&q_full[s]);  // release: the stores above are seen by the consumers' wait
          }
      }
    } else if (threadIdx.x == 32) {
      // ---- the dQ writer (one thread): per step, after both consumers have staged their 64-row
      // tiles, one TMA reduce-add per 32-column box into the float32 accumulator (one bulk group per
      // step); the staging tiles are released as soon as the TMA unit has read them, so the consumers
      // compute the next step while the additions (and in the deterministic mode the wait for their
      // turn) go on.
      // Deterministic mode: query tile m receives its additions in increasing key-tile order. Every
      // key tile walks the query tiles downwards from the last one that sees it, and that last query
      // tile is non-decreasing in the key tile (causal: the same for all; a left window: later for
      // later key tiles), so key tile n reaches m no earlier than key tile n - 1 and waits at most
      // about one addition's latency for it. Key tile 0, the longest under a causal mask and the
      // first dispatched, never waits. A CTA waits only for CTAs of lower linear index, dispatched
      // before it, so the chain cannot deadlock. The semaphore of (b, h, m) counts the key tiles
      // whose additions to m are complete; key tile n adds to m once the count reaches the number
      // of key tiles below it that visit m, so every rerun adds in the same order. (Decreasing order,
      // the last key tile first, measured 1.27-1.33x the default mode's time on causal calls against
      // 1.07-1.11x without a mask: there the longest CTAs were dispatched last and waited longest.)
      // The writer signals per step: after a step's additions it waits for them to complete
      // (bulk_wait<0>), signals, then takes the next step.
      // The step's four (d128) or two (d64) reduce-adds, one bulk group; the staging tiles released
      // once the TMA unit has read them.
      auto add_dq = [&](int h, int m) {
        const int row = qbase_of(ld_shared_v4(&info[0]).z) + m * kBM;
#pragma unroll
        for (int c = 0; c < 2; ++c)
#pragma unroll
          for (int box = 0; box < kDqCols / 32; ++box)
            tma_reduce_add_3d(&tm_dq, smem + L::kDq + c * L::kDqBytes + box * 64 * 128,
                              (kSplitCols ? kDqCols * c : 0) + 32 * box, row + (kSplitCols ? 0 : 64 * c), h);
        bulk_commit();
        bulk_wait_read<0>();
        mbar_arrive(dq_empty);
      };
      if (p.deterministic) {
        // One key tile (never paired), its query tiles downwards.
        int it = 0;  // dq_full's phase
#pragma unroll 1
        for (int h = kvh * f.group; h < (kvh + 1) * f.group; ++h)
#pragma unroll 1
          for (int mi = 0;; ++mi, ++it) {
            const BwdWgmmaKeyTile kt(ld_shared_v4(&info[1]));
            if (mi >= kt.nm()) break;
            const int m = kt.step_m(mi, true);
            mbar_wait(dq_full, it & 1);
            int32_t* sem = ws.sem + (int64_t(blockIdx.z) * f.heads_q + h) * ws.q_tiles + m;
            // Key tiles below this one that visit m: from the one holding key keys_lo(m).
            const int4 seq = ld_shared_v4(&info[0]);
            const int first = BwdVisibility(f, seq.x, seq.y).keys_lo(m, kBM) / kBN;
            while (ld_acquire_gpu(sem) < kt.n - first) __nanosleep(32);
            add_dq(h, m);
            bulk_wait<0>();  // the additions are done (in L2) before the next key tile's turn
            __threadfence();
            atomicAdd(sem, 1);
          }
        bulk_wait<0>();
      } else {
        // The CTA's key tiles in order, their query tiles upwards; dq_full's phase continues across
        // them.
        uint32_t phase = 0;
#pragma unroll 1
        for (int ti = 0; ti < 2; ++ti) {
          if (ld_shared_v4(&info[1 + ti]).x < 0) break;
#pragma unroll 1
          for (int h = kvh * f.group; h < (kvh + 1) * f.group; ++h)
#pragma unroll 1
            for (int mi = 0;; ++mi) {
              const BwdWgmmaKeyTile t(ld_shared_v4(&info[1 + ti]));
              if (mi >= t.nm()) break;
              mbar_wait(dq_full, phase);
              phase ^= 1;
              add_dq(h, t.m_begin + mi);
            }
        }
        bulk_wait<0>();
      }
    }
    return;
  }

  // ---- consumers ----
  setmaxnreg_inc<kBwdWgmmaConsumerRegs>();
  const int cw = wg - 1;  // consumer warpgroup: keys 64 cw .. 64 cw + 63 of the tile
  const int tid = threadIdx.x - 128 * wg;
  const int warp = tid / 32, lane = tid % 32;
  // s2 = u * pre (no softcap: the logit in log2 units); with softcap th = tanh(u * pre), s2 = th * post.
  const float pre = kSoftcap ? f.scale / f.softcap : f.scale * kLog2e;
  const float post = kSoftcap ? f.softcap * kLog2e : 1.0f;

  const uint32_t k_addr = smem_u32(smem + L::kK), v_addr = smem_u32(smem + L::kV);
  // This thread's key rows (tile-local): key_r + 8 i.
  const int key_r = 64 * cw + 16 * warp + lane / 4;

  // g: the CTA's step over its key tiles (the Q / dO ring's stage and phase, the dS^T buffer and
  // dq_empty's phase continue across them); kv_phase: kv_full's (the CTA loads K, V at most twice).
  // Per key tile: dK, dV from zero, its steps, its dK, dV stores.
  int g = 0;
  uint32_t kv_phase = 0;
#pragma unroll 1
  for (int ti = 0; ti < 2; ++ti) {
    const BwdWgmmaKeyTile kt(info[1 + ti]);
    if (kt.n < 0) break;
    const int nm = kt.nm(), steps = nm * f.group;  // (query head, query tile) steps, head-major
    float dv[kD / 2], dk[kD / 2];
#pragma unroll
    for (int e = 0; e < kD / 2; ++e) dv[e] = dk[e] = 0.0f;

    if (steps > 0) {
      mbar_wait(kv_full, kv_phase);
      kv_phase ^= 1;
    }
    for (int it = 0; it < steps; ++it, ++g) {
      const int s = g % kStages;
      const uint32_t phase = (g / kStages) & 1;
      const int m0 = kt.step_m(it % nm, rev) * kBM;
      const uint32_t q_addr = smem_u32(smem + L::kQ + s * L::kQBytes);
      const uint32_t do_addr = smem_u32(smem + L::kDo + s * L::kQBytes);
      uint8_t* ds_tile = smem + L::kDs + (g & 1) * L::kDsBytes;
      mbar_wait(&q_full[s], phase);

      // ---- S^T = K_c Q^T, dP^T = V_c dO^T (64 keys x 64 queries each) ----
      float st[kBM / 2], dpt[kBM / 2];
      wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < kD / 16; ++kk) {
        const uint64_t da = gmma_desc_k(k_addr + (kk / 4) * (kBN * 128) + cw * 64 * 128 + (kk % 4) * 32);
        const uint64_t db = gmma_desc_k(q_addr + (kk / 4) * (kBM * 128) + (kk % 4) * 32);
        wgmma_ss<T, kBM>(st, da, db, kk > 0 ? 1 : 0);
      }
      wgmma_commit();
#pragma unroll
      for (int kk = 0; kk < kD / 16; ++kk) {
        const uint64_t da = gmma_desc_k(v_addr + (kk / 4) * (kBN * 128) + cw * 64 * 128 + (kk % 4) * 32);
        const uint64_t db = gmma_desc_k(do_addr + (kk / 4) * (kBM * 128) + (kk % 4) * 32);
        wgmma_ss<T, kBM>(dpt, da, db, kk > 0 ? 1 : 0);
      }
      wgmma_commit();
      wgmma_wait<0>();
      reg_fence(st);
      reg_fence(dpt);

      // ---- P^T and dS^T in place, then the partial tile's masking ----
      const float* rows = rows_lse2 + s * 2 * kBM;
      bwd_wgmma_softmax<kSoftcap, kBM>(st, dpt, rows, pre, post, lane);
      if (!vis.tile_full(m0, kBM, kt.key0(), kBN)) bwd_wgmma_mask<kBM>(st, dpt, lane, kt.key0() + key_r, m0, vis);
      // 16-bit A fragments: k-slice kk (queries 16 kk ..), register r = elements 8 kk + 2 r, + 1.
      uint32_t pa[kBM / 16][4], dsa[kBM / 16][4];
#pragma unroll
      for (int kk = 0; kk < kBM / 16; ++kk)
#pragma unroll
        for (int r = 0; r < 4; ++r) {
          pa[kk][r] = pack2<T>(st[8 * kk + 2 * r], st[8 * kk + 2 * r + 1]);
          dsa[kk][r] = pack2<T>(dpt[8 * kk + 2 * r], dpt[8 * kk + 2 * r + 1]);
        }

      // ---- dV += P^T dO, dK += dS^T Q (B: 16 query rows x kD, MN-major, 64-column tiles kBM rows long) ----
      wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < kBM / 16; ++kk)
        wgmma_rs<T, kD>(dv, pa[kk], gmma_desc_mn(do_addr + kk * 16 * 128, kBM * 128), 1);
      wgmma_commit();
#pragma unroll
      for (int kk = 0; kk < kBM / 16; ++kk)
        wgmma_rs<T, kD>(dk, dsa[kk], gmma_desc_mn(q_addr + kk * 16 * 128, kBM * 128), 1);
      wgmma_commit();

      // ---- dS^T into shared memory, 64-query tiles of 128 key rows: key row key_r + 8 (r % 2), query
      // 16 kk + 8 (r / 2) + 2 (lane % 4) in tile kk / 4, 16-byte chunk (2 kk + r / 2) % 8 (the swizzled
      // layout TMA would write: chunk ch of row r at ch ^ (r % 8); r % 8 = lane / 4) ----
#pragma unroll
      for (int kk = 0; kk < kBM / 16; ++kk)
#pragma unroll
        for (int r = 0; r < 4; ++r) {
          const int row = key_r + 8 * (r % 2);
          const int chunk = (2 * kk + r / 2) % 8;
          *reinterpret_cast<uint32_t*>(ds_tile + (kk / 4) * (kBN * 128) + row * 128 + ((chunk ^ (lane / 4)) * 16) +
                                       (lane % 4) * 4) = dsa[kk][r];
        }
      fence_proxy_async();  // the generic-proxy stores before the tensor cores read them
      named_sync(1, 256);   // both halves of the 128 keys are in ds_tile

      // ---- dQ = dS K: A = dS (64 queries x 128 keys), B = K (128 keys x kDqCols columns), both
      // MN-major. BM = 64: queries 0..63, columns kDqCols cw .. (d64: consumer 1's B starts 64 bytes into
      // the 128-byte rows of K's tile, a start address inside the swizzle atom as the K-major k-slices'
      // 32-byte steps; the swizzle applies to the summed address); BM = 128: queries 64 cw .., columns
      // 0..63 ----
      float dq[kDqCols / 2];
      const uint32_t ds_addr = smem_u32(ds_tile) + (kSplitCols ? 0 : cw * (kBN * 128));
      const uint32_t kq_addr = k_addr + (kSplitCols ? (kDqCols * cw / 64) * (kBN * 128) + (kDqCols * cw % 64) * 2 : 0);
      wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < kBN / 16; ++kk) {
        const uint64_t da = gmma_desc_mn(ds_addr + kk * 16 * 128, kBN * 128);
        const uint64_t db = gmma_desc_mn(kq_addr + kk * 16 * 128, kBN * 128);
        wgmma_ss<T, kDqCols, 1, 1>(dq, da, db, kk > 0 ? 1 : 0);
      }
      wgmma_commit();
      wgmma_wait<0>();  // dV, dK, dQ done: Q, dO of stage s and ds_tile are no longer read by this warpgroup
      reg_fence(dq);
      reg_fence(dv);
      reg_fence(dk);
#pragma unroll
      for (int kk = 0; kk < kBM / 16; ++kk) {
        reg_fence(pa[kk]);
        reg_fence(dsa[kk]);
      }
      mbar_arrive(&q_empty[s]);  // every thread: its reads of the stage's lse2 / D rows come before the release
      if (it == steps - 1) mbar_arrive(kv_empty);  // the tile's K, V are no longer read

      // ---- dQ into this consumer's staging tile (boxes of 32 columns x 64 rows, 128-byte swizzle:
      // 16-byte chunk ch of row r at ch ^ (r % 8); conflict-free float2 stores), added to the float32
      // accumulator by the writer thread with TMA reduce-adds (scalar reductions from every thread cost
      // a third of the kernel's time). Element 4 j + 2 i + c is query 16 warp + lane / 4 + 8 i, column
      // 8 j + 2 (lane % 4) + c of the tile (BM = 64: column kDqCols cw + that; BM = 128: query 64 cw +
      // that). Rows past the sequence end hold zeros (P = 0 there), so a tile that reaches into the next
      // sequence adds nothing to it.
      uint8_t* stage_dq = smem + L::kDq + cw * L::kDqBytes;
      mbar_wait(dq_empty, (g & 1) ^ 1);  // the previous step's additions have read the tiles
#pragma unroll
      for (int j = 0; j < kDqCols / 8; ++j)
#pragma unroll
        for (int i = 0; i < 2; ++i) {
          const int row = 16 * warp + lane / 4 + 8 * i;
          const int chunk = (8 * j % 32) / 4 + (lane % 4) / 2;
          const int byte = (8 * j / 32) * (64 * 128) + row * 128 + ((chunk ^ (lane / 4)) * 16) + (lane % 2) * 8;
          *reinterpret_cast<float2*>(stage_dq + byte) = make_float2(dq[4 * j + 2 * i], dq[4 * j + 2 * i + 1]);
        }
      fence_proxy_async();  // the staging stores before the TMA unit reads them
      named_sync(3 + cw, 128);
      if (tid == 0) mbar_arrive(dq_full);
    }

    // ---- dK = scale * sum dS^T q, dV: element 4 j + 2 i + c is key key_r + 8 i, column 8 j + 2 (lane % 4) + c ----
    T* dkp = static_cast<T*>(p.dk) + b * p.dk_sb + (int64_t(k_row0) + kt.key0()) * p.dk_ss + kvh * p.dk_sh;
    T* dvp = static_cast<T*>(p.dv) + b * p.dv_sb + (int64_t(k_row0) + kt.key0()) * p.dv_ss + kvh * p.dv_sh;
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const int row = key_r + 8 * i;
      if (kt.key0() + row >= sk) continue;
#pragma unroll
      for (int j = 0; j < kD / 8; ++j) {
        const int col = 8 * j + 2 * (lane % 4);
        *reinterpret_cast<uint32_t*>(dkp + row * p.dk_ss + col) =
            pack2<T>(dk[4 * j + 2 * i] * f.scale, dk[4 * j + 2 * i + 1] * f.scale);
        *reinterpret_cast<uint32_t*>(dvp + row * p.dv_ss + col) = pack2<T>(dv[4 * j + 2 * i], dv[4 * j + 2 * i + 1]);
      }
    }
  }
#else
  (void)tm_q, (void)tm_k, (void)tm_v, (void)tm_do, (void)tm_dq, (void)p, (void)ws, (void)paired;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  __trap();  // built for sm_90 without the "a" features: no wgmma; the launcher refuses this build
#endif
#endif
}

}  // namespace kernelforge
