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

namespace kernelforge {

// The deterministic mode's semaphore read (acquire: the additions counted are visible after it).
__device__ __forceinline__ int ld_acquire_gpu(const int32_t* p) {
  int v;
  asm volatile("ld.acquire.gpu.global.s32 %0, [%1];\n" : "=r"(v) : "l"(p) : "memory");
  return v;
}

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
