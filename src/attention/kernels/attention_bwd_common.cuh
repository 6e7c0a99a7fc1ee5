// What the backward main kernels (attention_bwd_mma.cuh, attention_bwd_wgmma.cuh) share.
//
// BwdVisibility: which (query, key) pairs of one sequence are visible, for kernels that walk key tiles
// (include/kernelforge/attention.h has the rule): query row i sees keys [row_lo(i), row_hi(i)), the
// window around the bottom-right-aligned diagonal clamped to [0, Sk]; both bounds are
// non-decreasing in i. A key tile [key0, key0 + block_n) is seen by the query tiles of block_m rows
// in [m_begin, m_end): tile m's key range [keys_lo(m), keys_hi(m)) meets the key tile from m_begin on
// (keys_hi(m) > key0) up to m_end (keys_lo(m) < key0 + block_n); two binary searches find them.
#pragma once

#include <cstdint>

#include "attention/attention_problem.h"
#include "attention/kernels/elementwise.cuh"

namespace kernelforge {

// The deterministic mode's semaphore read (acquire: the additions counted are visible after it).
__device__ __forceinline__ int ld_acquire_gpu(const int32_t* p) {
  int v;
  asm volatile("ld.acquire.gpu.global.s32 %0, [%1];\n" : "=r"(v) : "l"(p) : "memory");
  return v;
}

// P and dS of one (query, key) pair in place: s holds the logit in log2 units (u scale log2 e), or
// th = tanh(u / softcap) with a softcap, and becomes P = 2^(s2 - lse2) (s2 = th * post with a
// softcap); dp holds dP and becomes dS = P (dP - D), times 1 - th^2 with a softcap. pre = scale log2 e
// (no softcap) and post = softcap log2 e, as the wgmma kernels define them; lse2 = +inf gives P = 0.
template <bool kSoftcap>
__device__ __forceinline__ void bwd_p_ds(float& s, float& dp, float lse2, float d, float pre, float post) {
  const float x = kSoftcap ? s * post - lse2 : fmaf(s, pre, -lse2);
  const float g = kSoftcap ? (dp - d) * (1.0f - s * s) : dp - d;
  const float pe = ex2_approx(x);
  s = pe;
  dp = pe * g;
}

// Sequence b of a call: its query and key counts, its first query and key rows in the TMA maps' row
// numbering (varlen: from cu_seqlens; else 0) and the maps' batch coordinate (varlen: 0, one batch of
// all tokens).
struct BwdSequence {
  int sq, sk, q_row0, k_row0, batch_coord;
  __device__ __forceinline__ BwdSequence(const AttentionParams& f, int b)
      : sq(f.seqlen_q), sk(f.seqlen_k), q_row0(0), k_row0(0), batch_coord(b) {
    if (f.varlen) {
      q_row0 = f.cu_seqlens_q[b];
      k_row0 = f.cu_seqlens_k[b];
      sq = f.cu_seqlens_q[b + 1] - q_row0;
      sk = f.cu_seqlens_k[b + 1] - k_row0;
      batch_coord = 0;
    }
  }
};

struct BwdVisibility {
  int64_t diag;  // Sk - Sq
  int sq, sk;
  int window_left, window_right;  // -1: unbounded

  __device__ __forceinline__ BwdVisibility(const AttentionParams& f, int sq_, int sk_)
      : diag(int64_t(sk_) - sq_), sq(sq_), sk(sk_), window_left(f.window_left), window_right(f.window_right) {}

  __device__ __forceinline__ int row_lo(int64_t i) const {
    if (window_left < 0) return 0;
    const int64_t lo = i + diag - window_left;
    return int(lo < 0 ? 0 : (lo > sk ? sk : lo));
  }
  __device__ __forceinline__ int row_hi(int64_t i) const {
    if (window_right < 0) return sk;
    const int64_t hi = i + diag + window_right + 1;
    return int(hi < 0 ? 0 : (hi > sk ? sk : hi));
  }
  __device__ __forceinline__ int keys_lo(int m, int block_m) const { return row_lo(int64_t(m) * block_m); }
  __device__ __forceinline__ int keys_hi(int m, int block_m) const {
    const int last = (m * block_m + block_m < sq ? m * block_m + block_m : sq) - 1;
    return row_hi(last);
  }
  // Row i's visible keys [*lo, *hi) for the masking of a partial tile: row_lo / row_hi without their
  // clamps to [0, Sk], in 32-bit arithmetic (rows and keys < 2^30), hi at most Sk.
  __device__ __forceinline__ void row_bounds32(int i, int* lo, int* hi) const {
    const int diag_row = i + int(diag);
    *lo = window_left < 0 ? 0 : diag_row - window_left;
    *hi = window_right < 0 ? sk : min(diag_row + window_right + 1, sk);
  }
  // Every (query, key) of query tile m0.. and key tile key0.. visible (rows past Sq aside).
  __device__ __forceinline__ bool tile_full(int m0, int block_m, int key0, int block_n) const {
    return row_lo(int64_t(m0) + block_m - 1) <= key0 && row_hi(m0) >= key0 + block_n;
  }
  __device__ __forceinline__ void query_tiles(int key0, int block_n, int block_m, int* m_begin, int* m_end) const {
    const int num_m = (sq + block_m - 1) / block_m;
    int lo = 0, hi = num_m;
    while (lo < hi) {
      const int mid = (lo + hi) >> 1;
      if (keys_hi(mid, block_m) > key0)
        hi = mid;
      else
        lo = mid + 1;
    }
    *m_begin = lo;
    hi = num_m;
    while (lo < hi) {
      const int mid = (lo + hi) >> 1;
      if (keys_lo(mid, block_m) >= key0 + block_n)
        hi = mid;
      else
        lo = mid + 1;
    }
    *m_end = lo;
  }
};

}  // namespace kernelforge
