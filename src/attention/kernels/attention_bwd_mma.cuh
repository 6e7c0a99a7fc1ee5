// Attention backward, pass 2 of 3 (the main kernel): FlashAttention-2's backward on mma.sync tensor
// cores (sm_80 and later; runs on sm_90 too). Formula: include/kernelforge/attention.h; pass 1
// (attention_bwd_preprocess.cuh) has stored D = rowsum(dout * out) and lse * log2(e) and zeroed the
// float32 dQ accumulator; pass 3 (attention_bwd_dq_convert.cuh) rounds it into dq.
//
// One block per (key tile of kBlockN keys, kv head, batch). It keeps its K and V tiles in shared
// memory and its dK, dV in float32 registers, and walks the query heads of its kv head (the GQA
// group: dK, dV sum over them in registers, no reduction pass) and, per head, the query tiles of
// kBlockM rows that see its keys (the range [m_begin, m_end) from the visibility rule: query tile m
// is visited when its rows' key range [row_lo(first row), row_hi(last row)) meets the key tile).
// Q, dO (and lse2, D) tiles stream through a kStages cp.async pipeline. Per query tile:
//   dP^T = V dO^T, S^T = K Q^T                         (warp: 16 keys x kBlockM / kParts queries)
//   P^T  = 2^(S^T scale log2(e) - lse2)                 (softcap: s = c tanh(u / c) recomputed)
//   dS^T = P^T (dP^T - D), times (1 - (s / c)^2) with softcap    -> P^T, dS^T to shared memory (T)
//   dV += P^T dO, dK += dS^T Q                          (warp: 16 keys x Dv / kParts, Dqk / kParts)
//   dQ  = dS K  -> added to the float32 accumulator     (warp: 16 queries x Dqk / kQParts)
// masked elements only on tiles that straddle a window boundary or the sequence ends. At the end
// dK * scale and dV are written once in T (zeros when no query sees the keys: every key tile of a
// sequence has a block, so dk / dv are always written).
// FLOPs per visible (query, key) pair: 2 Dqk each for S, dK and dQ, 2 Dv each for dP and dV:
// 6 Dqk + 4 Dv, 2.5 x the forward's 2 (Dqk + Dv) at Dqk = Dv. Traffic: K, V read once, dK, dV
// written once; Q, dO (and lse2, D) re-read from L2 by every key tile, the dQ accumulator added
// to (float32) by every key tile: Sk / kBlockN times per query row.
//
// dQ addition. Default: red.global.add.f32 (atomicAdd) of every element, order-dependent rounding.
// Deterministic: per (b, h, query tile m) an int32 semaphore (zeroed by pass 1) counts the key tiles
// that have added. The key tiles that visit m form one contiguous range [keys_lo(m) / kBlockN, ...),
// so the block of key tile n waits until the counter equals n - keys_lo(m) / kBlockN (every lower
// visiting tile has added), adds, fences and increments: each element receives its additions in
// ascending key-tile order on every run. No deadlock: a block only waits for blocks of the same
// (kv head, batch) with a lower blockIdx.x, i.e. a lower linear block index; blocks are dispatched
// in increasing linear index, so every block that one waits for is resident or finished, and it
// waits in turn only for lower ones: the lowest unfinished block never waits, by induction all
// finish. (FlashAttention 2 and 3 rely on the same dispatch order for their deterministic mode.)
//
// Shared memory layout: attention_bwd_mma_config.h. Fragment layouts and the three ldmatrix lane
// patterns (A, B from [n][k], B from [k][n] with .trans): mma_common.cuh. The operands here:
//   S^T, dP^T: A = K, V rows (keys) [key][dim]; B = Q, dO from [query][dim] (non-trans pattern)
//   dV, dK:    A = P^T, dS^T [key][query]; B = dO, Q from [query][dim] (.trans pattern)
//   dQ:        A = dS [query][key], read from dS^T [key][query] with ldmatrix.trans: matrix i =
//              lane / 8 holds keys k0 + 8 (i / 2) and queries q0 + 8 (i % 2), lane row (a key)
//              k0 + lane % 8 + 8 (lane / 16), column q0 + 8 ((lane / 8) % 2); the .trans delivery
//              (rows 2t..2t+1 of column g) is then (query g, keys 2t..2t+1) = a0..a3.
//              B = K from [key][dim] (.trans pattern)
// The C fragments of S^T / dP^T: c0, c1 = (key 16 wrow + g, queries q0 + 8 j + 2t, +1), c2, c3 the
// key + 8; written as 32-bit pairs to P^T / dS^T (the pair is two adjacent queries).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

#include "attention/attention_bwd_mma_config.h"
#include "attention/attention_bwd_workspace.h"
#include "attention/attention_problem.h"
#include "attention/kernels/attention_bwd_common.cuh"
#include "attention/kernels/mma_common.cuh"
#include "common/launch.cuh"

namespace kernelforge {
namespace attn_mma {

// Stores a packed pair of T at row[col], row[col + 1]: one 32-bit store when `pair`.
__device__ __forceinline__ void store_pair(uint16_t* row, int col, uint32_t w, bool pair) {
  if (pair) {
    *reinterpret_cast<uint32_t*>(row + col) = w;
  } else {
    row[col] = uint16_t(w & 0xffffu);
    row[col + 1] = uint16_t(w >> 16);
  }
}

}  // namespace attn_mma

// T: __half or __nv_bfloat16. Grid (ceil(Sk / kBlockN), Hkv, B); block kWarps * 32 threads; dynamic
// shared memory attention_bwd_mma_smem_bytes(kDqk, kDv, kBlockM, kBlockN, kStages).
// vec16: q, k, v, dout bases 16-byte aligned and all their strides multiples of 8 elements.
// pair_dk, pair_dv: that gradient's base 4-byte aligned and its strides even.
template <typename T, int kDqk, int kDv, int kBlockM, int kBlockN, int kWarps, int kStages>
__global__ void __launch_bounds__(kWarps * 32)
    attention_bwd_mma(const AttentionGradParams p, const AttnBwdWs ws, const bool vec16, const bool pair_dk,
                      const bool pair_dv) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  using namespace attn_mma;
  constexpr int kThreads = kWarps * 32;
  constexpr int kKS = kDqk + kAttnMmaPad;  // shared row strides, elements
  constexpr int kVS = kDv + kAttnMmaPad;
  constexpr int kPS = kBlockM + kAttnMmaPad;
  // S^T, dP^T and dK, dV: warp w owns key rows 16 wrow .. 16 wrow + 15 (wrow = w % kKeyRows) and
  // part wpart = w / kKeyRows of the query columns (S^T) or of the head dims (dK, dV).
  constexpr int kKeyRows = kBlockN / 16;
  constexpr int kParts = kWarps / kKeyRows;
  constexpr int kQCols = kBlockM / kParts;  // query columns of S^T per warp
  constexpr int kNA = kQCols / 8;           // their n8 tiles
  constexpr int kDvW = kDv / kParts;        // dV, dK columns per warp
  constexpr int kDkW = kDqk / kParts;
  // dQ: warp w owns query rows 16 crow .. (crow = w % kQRows) and part cpart = w / kQRows of Dqk,
  // computed in chunks of kDqChunk columns (few live accumulators beside dK, dV).
  constexpr int kQRows = kBlockM / 16;
  constexpr int kQParts = kWarps / kQRows;
  constexpr int kDqW = kDqk / kQParts;
  constexpr int kDqChunk = kDqW % 64 == 0 ? 64 : (kDqW % 32 == 0 ? 32 : 16);
  constexpr int kStageElems = kBlockM * (kKS + kVS) + 2 * kBlockM * 2;  // Q, dO, then float lse2, D
  static_assert(sizeof(T) == 2, "T is a 16-bit type");
  static_assert(kBlockN % 16 == 0 && kWarps % kKeyRows == 0, "whole warps per 16-key row tile");
  static_assert(kQCols % 16 == 0 && kDvW % 16 == 0 && kDkW % 16 == 0, "warp tiles are multiples of 16");
  static_assert(kBlockM % 16 == 0 && kWarps % kQRows == 0 && kDqW % 16 == 0, "dQ warp tiles");
  static_assert(kThreads >= 2 * kBlockM, "one thread per lse2 / D element of a query tile");
  static_assert(kStages == 1 || kStages == 2, "one or two query-tile stages");

  extern __shared__ __align__(128) unsigned char smem_raw[];
  uint16_t* sK = reinterpret_cast<uint16_t*>(smem_raw);
  uint16_t* sV = sK + kBlockN * kKS;
  uint16_t* sStages = sV + kBlockN * kVS;  // stage s: Q, dO, lse2, D at sStages + s * kStageElems
  uint16_t* sP = sStages + kStages * kStageElems;
  uint16_t* sdS = sP + kBlockN * kPS;

  const AttentionParams& f = p.f;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int g = lane >> 2, t = lane & 3;
  const int n_tile = blockIdx.x, kvh = blockIdx.y, b = blockIdx.z;
  const int wrow = warp % kKeyRows, wpart = warp / kKeyRows;
  const int crow = warp % kQRows, cpart = warp / kQRows;

  pdl_wait();
  int64_t q_start = 0, k_start = 0;
  int Sq = f.seqlen_q, Sk = f.seqlen_k;
  if (f.varlen) {
    q_start = f.cu_seqlens_q[b];
    Sq = f.cu_seqlens_q[b + 1] - int(q_start);
    k_start = f.cu_seqlens_k[b];
    Sk = f.cu_seqlens_k[b + 1] - int(k_start);
  }
  const int key0 = n_tile * kBlockN;
  if (key0 >= Sk) return;  // the whole block: varlen sequences shorter than the grid's bound
  const int64_t qbase = f.varlen ? q_start : int64_t(b) * f.seqlen_q;  // workspace row numbering

  // The query tiles that see this key tile: [m_begin, m_end) (attention_bwd_common.cuh).
  const BwdVisibility vis(f, Sq, Sk);
  int m_begin = 0, m_end = 0;
  vis.query_tiles(key0, kBlockN, kBlockM, &m_begin, &m_end);
  const int nm = m_end - m_begin;
  const int n_iters = nm * f.group;  // (query head, query tile) pairs, head-major

  // Scores in the log2 domain: s2 = s * log2(e). Without softcap s2 = acc * (scale log2 e); with it
  // th = tanh(acc * scale / softcap), s2 = th * (softcap log2 e).
  const bool softcap = f.softcap > 0.0f;
  const float pre = softcap ? f.scale / f.softcap : f.scale * kLog2e;
  const float post = softcap ? f.softcap * kLog2e : 1.0f;

  float dv[kDvW / 8][4], dk[kDkW / 8][4];
#pragma unroll
  for (int j = 0; j < kDvW / 8; ++j) dv[j][0] = dv[j][1] = dv[j][2] = dv[j][3] = 0.0f;
#pragma unroll
  for (int j = 0; j < kDkW / 8; ++j) dk[j][0] = dk[j][1] = dk[j][2] = dk[j][3] = 0.0f;

  if (n_iters > 0) {
    const uint16_t* kp = static_cast<const uint16_t*>(f.k) + b * f.k_sb + (k_start + key0) * f.k_ss + kvh * f.k_sh;
    const uint16_t* vp = static_cast<const uint16_t*>(f.v) + b * f.v_sb + (k_start + key0) * f.v_ss + kvh * f.v_sh;
    load_tile<kBlockN, kDqk, kThreads>(sK, kp, f.k_ss, Sk - key0, vec16);
    load_tile<kBlockN, kDv, kThreads>(sV, vp, f.v_ss, Sk - key0, vec16);
    // Q, dO, lse2, D of iteration `it` into stage `st`; rows past Sq zero-filled (their P is then
    // 2^0 = 1 at most, times dO = 0 and dP - D = 0: no contribution, and dQ skips them).
    auto load_q = [&](int it, int st) {
      const int h = kvh * f.group + it / nm;
      const int m0 = (m_begin + it % nm) * kBlockM;
      uint16_t* sQ = sStages + st * kStageElems;
      uint16_t* sdO = sQ + kBlockM * kKS;
      float* sL = reinterpret_cast<float*>(sdO + kBlockM * kVS);
      const uint16_t* qp = static_cast<const uint16_t*>(f.q) + b * f.q_sb + (q_start + m0) * f.q_ss + h * f.q_sh;
      const uint16_t* dop = static_cast<const uint16_t*>(p.dout) + b * p.do_sb + (q_start + m0) * p.do_ss + h * p.do_sh;
      load_tile<kBlockM, kDqk, kThreads>(sQ, qp, f.q_ss, Sq - m0, vec16);
      load_tile<kBlockM, kDv, kThreads>(sdO, dop, p.do_ss, Sq - m0, vec16);
      const int64_t row0 = int64_t(h) * f.total_q + qbase + m0;
      if (tid < 2 * kBlockM) {
        const int r = tid < kBlockM ? tid : tid - kBlockM;
        const float* src = (tid < kBlockM ? ws.lse2 : ws.dsum) + row0;
        const bool ok = r < Sq - m0;
        cp_async4(smem_addr(sL + tid), ok ? src + r : src, ok);  // sL[0, kBlockM): lse2; then D
      }
    };
    load_q(0, 0);
    cp_async_commit();

    // Lane addresses (bytes, shared space) that do not depend on the stage.
    const uint32_t k_a = smem_addr(sK + (wrow * 16 + (lane & 15)) * kKS + (lane >> 4) * 8);
    const uint32_t v_a = smem_addr(sV + (wrow * 16 + (lane & 15)) * kVS + (lane >> 4) * 8);
    const uint32_t p_a = smem_addr(sP + (wrow * 16 + (lane & 15)) * kPS + (lane >> 4) * 8);
    const uint32_t ds_a = smem_addr(sdS + (wrow * 16 + (lane & 15)) * kPS + (lane >> 4) * 8);
    const uint32_t ds_t = smem_addr(sdS + ((lane & 7) + ((lane >> 4) << 3)) * kPS + crow * 16 + ((lane >> 3) & 1) * 8);
    const uint32_t k_t = smem_addr(sK + (lane & 15) * kKS + cpart * kDqW + (lane >> 4) * 8);
    const int q0 = wpart * kQCols;  // this warp's first query column of S^T
    const int b_elem_q = (q0 + (lane & 7) + ((lane >> 4) << 3)) * kKS + ((lane >> 3) & 1) * 8;
    const int b_elem_do = (q0 + (lane & 7) + ((lane >> 4) << 3)) * kVS + ((lane >> 3) & 1) * 8;
    const int t_elem_q = (lane & 15) * kKS + wpart * kDkW + (lane >> 4) * 8;
    const int t_elem_do = (lane & 15) * kVS + wpart * kDvW + (lane >> 4) * 8;

    for (int it = 0; it < n_iters; ++it) {
      const int st = kStages == 2 ? (it & 1) : 0;
      if (kStages == 2 && it + 1 < n_iters) {
        load_q(it + 1, st ^ 1);
        cp_async_commit();
        cp_async_wait<1>();
      } else {
        cp_async_wait<0>();
      }
      __syncthreads();
      const int h = kvh * f.group + it / nm;
      const int m = m_begin + it % nm;
      const int m0 = m * kBlockM;
      const uint16_t* sQ = sStages + st * kStageElems;
      const uint16_t* sdO = sQ + kBlockM * kKS;
      const float* sLse2 = reinterpret_cast<const float*>(sdO + kBlockM * kVS);
      const float* sD = sLse2 + kBlockM;
      // Every (query, key) of the tile visible (rows past Sq aside): no element mask.
      const bool masked = !vis.tile_full(m0, kBlockM, key0, kBlockN);

      // ---- dP^T = V dO^T, S^T = K Q^T; P^T and dS^T to shared memory ----
      {
        float dp[kNA][4], s[kNA][4];
#pragma unroll
        for (int j = 0; j < kNA; ++j) {
          dp[j][0] = dp[j][1] = dp[j][2] = dp[j][3] = 0.0f;
          s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.0f;
        }
        const uint32_t do_b = smem_addr(sdO + b_elem_do);
        const uint32_t q_b = smem_addr(sQ + b_elem_q);
#pragma unroll 1
        for (int kk = 0; kk < kDv / 16; ++kk) {
          uint32_t a[4];
          ldmatrix_x4(v_a + kk * 32, a);
#pragma unroll
          for (int np = 0; np < kNA / 2; ++np) {
            uint32_t bb[4];
            ldmatrix_x4(do_b + (np * 16 * kVS + kk * 16) * 2, bb);
            mma_16816<T>(dp[2 * np], a, bb[0], bb[1]);
            mma_16816<T>(dp[2 * np + 1], a, bb[2], bb[3]);
          }
        }
#pragma unroll 1
        for (int kk = 0; kk < kDqk / 16; ++kk) {
          uint32_t a[4];
          ldmatrix_x4(k_a + kk * 32, a);
#pragma unroll
          for (int np = 0; np < kNA / 2; ++np) {
            uint32_t bb[4];
            ldmatrix_x4(q_b + (np * 16 * kKS + kk * 16) * 2, bb);
            mma_16816<T>(s[2 * np], a, bb[0], bb[1]);
            mma_16816<T>(s[2 * np + 1], a, bb[2], bb[3]);
          }
        }
        const int r = wrow * 16 + g;  // this thread's key rows r and r + 8 (tile-local)
#pragma unroll
        for (int j = 0; j < kNA; ++j) {
          const int qc = q0 + 8 * j + 2 * t;  // this thread's query columns qc and qc + 1
          float pv[4], dsv[4];
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const int qi = qc + (e & 1);
            float x = s[j][e] * pre;
            float th = 0.0f;
            if (softcap) {
              th = tanh_approx(x);
              x = th * post;
            }
            float pe = ex2_approx(x - sLse2[qi]);  // lse2 = +inf (a row that saw nothing): 0
            if (masked) {
              const int key = key0 + r + (e >> 1) * 8;
              const int64_t i = int64_t(m0) + qi;
              if (key < vis.row_lo(i) || key >= vis.row_hi(i)) pe = 0.0f;
            }
            float d = pe * (dp[j][e] - sD[qi]);
            if (softcap) d *= 1.0f - th * th;
            pv[e] = pe;
            dsv[e] = d;
          }
          *reinterpret_cast<uint32_t*>(sP + r * kPS + qc) = pack2<T>(pv[0], pv[1]);
          *reinterpret_cast<uint32_t*>(sP + (r + 8) * kPS + qc) = pack2<T>(pv[2], pv[3]);
          *reinterpret_cast<uint32_t*>(sdS + r * kPS + qc) = pack2<T>(dsv[0], dsv[1]);
          *reinterpret_cast<uint32_t*>(sdS + (r + 8) * kPS + qc) = pack2<T>(dsv[2], dsv[3]);
        }
      }
      __syncthreads();

      // ---- dV += P^T dO, dK += dS^T Q ----
      {
        const uint32_t do_t = smem_addr(sdO + t_elem_do);
        const uint32_t q_t = smem_addr(sQ + t_elem_q);
#pragma unroll 1
        for (int kk = 0; kk < kBlockM / 16; ++kk) {
          uint32_t a[4];
          ldmatrix_x4(p_a + kk * 32, a);
#pragma unroll
          for (int dq2 = 0; dq2 < kDvW / 16; ++dq2) {
            uint32_t bb[4];
            ldmatrix_x4_trans(do_t + (kk * 16 * kVS + dq2 * 16) * 2, bb);
            mma_16816<T>(dv[2 * dq2], a, bb[0], bb[1]);
            mma_16816<T>(dv[2 * dq2 + 1], a, bb[2], bb[3]);
          }
          ldmatrix_x4(ds_a + kk * 32, a);
#pragma unroll
          for (int dq2 = 0; dq2 < kDkW / 16; ++dq2) {
            uint32_t bb[4];
            ldmatrix_x4_trans(q_t + (kk * 16 * kKS + dq2 * 16) * 2, bb);
            mma_16816<T>(dk[2 * dq2], a, bb[0], bb[1]);
            mma_16816<T>(dk[2 * dq2 + 1], a, bb[2], bb[3]);
          }
        }
      }

      // ---- dQ = dS K, added to the float32 accumulator ----
      {
        int32_t* sem = nullptr;
        if (p.deterministic) {
          sem = ws.sem + (int64_t(b) * f.heads_q + h) * ws.q_tiles + m;
          if (tid == 0) {
            const int target = n_tile - vis.keys_lo(m, kBlockM) / kBlockN;  // lower key tiles that visit m
            while (ld_acquire_gpu(sem) < target) __nanosleep(64);
          }
          __syncthreads();
        }
        const int row_a = m0 + crow * 16 + g;  // this thread's query rows row_a and row_a + 8
        const bool ok_a = row_a < Sq, ok_b = row_a + 8 < Sq;
        float* acc_a = ws.dq_acc + (int64_t(h) * f.total_q + qbase + row_a) * kDqk + cpart * kDqW + 2 * t;
        float* acc_b = acc_a + 8 * kDqk;
#pragma unroll
        for (int ch = 0; ch < kDqW / kDqChunk; ++ch) {
          float acc[kDqChunk / 8][4];
#pragma unroll
          for (int j = 0; j < kDqChunk / 8; ++j) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.0f;
#pragma unroll 1
          for (int kk = 0; kk < kBlockN / 16; ++kk) {
            uint32_t a[4];
            ldmatrix_x4_trans(ds_t + kk * 16 * kPS * 2, a);
#pragma unroll
            for (int dq2 = 0; dq2 < kDqChunk / 16; ++dq2) {
              uint32_t bb[4];
              ldmatrix_x4_trans(k_t + (kk * 16 * kKS + ch * kDqChunk + dq2 * 16) * 2, bb);
              mma_16816<T>(acc[2 * dq2], a, bb[0], bb[1]);
              mma_16816<T>(acc[2 * dq2 + 1], a, bb[2], bb[3]);
            }
          }
#pragma unroll
          for (int j = 0; j < kDqChunk / 8; ++j) {
            const int c = ch * kDqChunk + 8 * j;
            if (ok_a) {
              atomicAdd(acc_a + c, acc[j][0]);
              atomicAdd(acc_a + c + 1, acc[j][1]);
            }
            if (ok_b) {
              atomicAdd(acc_b + c, acc[j][2]);
              atomicAdd(acc_b + c + 1, acc[j][3]);
            }
          }
        }
        if (p.deterministic) __threadfence();  // this thread's additions visible before the count
        __syncthreads();                       // every read of this stage and of P^T / dS^T done; additions fenced
        if (p.deterministic && tid == 0) atomicAdd(sem, 1);
      }
      if (kStages == 1 && it + 1 < n_iters) {
        load_q(it + 1, 0);
        cp_async_commit();
      }
    }
  }

  // dK = scale * sum du q, dV: written once, in T; key rows past Sk skipped.
  const int r = wrow * 16 + g;
  uint16_t* dkp = static_cast<uint16_t*>(p.dk) + b * p.dk_sb + (k_start + key0) * p.dk_ss + kvh * p.dk_sh;
  uint16_t* dvp = static_cast<uint16_t*>(p.dv) + b * p.dv_sb + (k_start + key0) * p.dv_ss + kvh * p.dv_sh;
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int row = r + 8 * half;
    if (key0 + row >= Sk) continue;
#pragma unroll
    for (int j = 0; j < kDkW / 8; ++j)
      store_pair(dkp + row * p.dk_ss, wpart * kDkW + 8 * j + 2 * t,
                 pack2<T>(dk[j][2 * half] * f.scale, dk[j][2 * half + 1] * f.scale), pair_dk);
#pragma unroll
    for (int j = 0; j < kDvW / 8; ++j)
      store_pair(dvp + row * p.dv_ss, wpart * kDvW + 8 * j + 2 * t, pack2<T>(dv[j][2 * half], dv[j][2 * half + 1]),
                 pair_dv);
  }
#else
  (void)p;
  (void)ws;
  (void)vec16;
  (void)pair_dk;
  (void)pair_dv;
#endif
}

}  // namespace kernelforge
