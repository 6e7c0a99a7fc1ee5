// grouped_mm's portable kernel: any strides and alignment, sm_75 (float16) and sm_80+ (both dtypes).
//
// One CTA of 4 warps computes a 64 x 64 output tile; each warp a 32 x 32 quarter as 2 x 2 WMMA
// 16 x 16 x 16 fragments with float32 accumulators. The operands come through shared memory in 32-deep
// slices, element by element with bounds checks (reads coalesced along whichever dimension is
// contiguous), so odd N and K, unaligned bases and row strides all run; the result goes back through
// shared memory for bounds-checked, coalesced stores.
//   rows ops: tile (group e, 64 rows of the group, 64 columns n); reduction over K.
//   wgrad:    tile (group e, 64 rows n of dw[e], 64 columns k); reduction over the group's rows (none
//             for an empty group: the tile is written as 0).
// Grid: rows ops (ceil(T / 64) + E, ceil(N / 64)): enough row tiles for any grouping (each group
// wastes at most one partial tile), CTAs past the last tile return; wgrad (E · ceil(N / 64) · ceil(K / 64)).
#pragma once

#include <mma.h>

#include "common/launch.cuh"
#include "grouped_mm/grouped_mm_problem.h"
#include "grouped_mm/kernels/gmm_groups.cuh"
#include "grouped_mm/kernels/gmm_tiles.h"

namespace kernelforge {

template <typename T, bool kWgrad>
__global__ void __launch_bounds__(kGmmMmaThreads) gmm_mma(const GmmParams p) {
  pdl_wait();
  if constexpr (!arch_supports<T>()) {
    __trap();
  } else {
    namespace wmma = nvcuda::wmma;
    constexpr int BM = kGmmMmaBM, BN = kGmmMmaBN, BK = kGmmMmaBK, LDS = BK + 8, LDC = BN + 4;
    __shared__ alignas(32) T as[BM][LDS];  // as[i][kk] = A(i, kk)
    __shared__ alignas(32) T bs[BN][LDS];  // bs[j][kk] = B(kk, j)
    __shared__ alignas(32) float cs[BM][LDC];
    __shared__ int64_t s_tile[3];
    __shared__ int s_group;
    const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
    const T* a = static_cast<const T*>(p.a);
    const T* b = static_cast<const T*>(p.b);
    T* out = static_cast<T*>(p.out);

    // The tile: group e, output rows [m0, m_end) and columns [n0, n_end); reduction [r0, r_end).
    int64_t m0, m_end, n0, n_end, r0, r_end;
    int e;
    if (warp == 0) {
      bool ok;
      int64_t x0 = 0, x1 = 0;
      if constexpr (kWgrad) {
        const int64_t tn = (p.n + BM - 1) / BM, tk = (p.k + BN - 1) / BN;
        const int64_t bx = blockIdx.x;
        e = int(bx / (tn * tk));
        gmm_detail::group_rows(p.offsets, e, p.t, lane, &x0, &x1);
        ok = true;
      } else {
        ok = gmm_detail::find_row_tile(p.offsets, p.groups, p.t, BM, blockIdx.x, lane, &e, &x0, &x1);
      }
      if (lane == 0) {
        s_group = ok ? e : -1;
        s_tile[0] = x0;
        s_tile[1] = x1;
      }
    }
    __syncthreads();
    e = s_group;
    if (e < 0) return;  // past the last row tile
    if constexpr (kWgrad) {
      const int64_t tk = (p.k + BN - 1) / BN, rem = int64_t(blockIdx.x) % (((p.n + BM - 1) / BM) * tk);
      m0 = (rem / tk) * BM, m_end = min(m0 + BM, p.n);
      n0 = (rem % tk) * BN, n_end = min(n0 + BN, p.k);
      r0 = s_tile[0], r_end = s_tile[1];
    } else {
      m0 = s_tile[0], m_end = min(m0 + BM, s_tile[1]);
      n0 = int64_t(blockIdx.y) * BN, n_end = min(n0 + BN, p.n);
      r0 = 0, r_end = p.k;
    }
    const T zero = T(0.0f);

    wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc[2][2];
#pragma unroll
    for (int i = 0; i < 2; ++i)
#pragma unroll
      for (int j = 0; j < 2; ++j) wmma::fill_fragment(acc[i][j], 0.0f);
    const int wm = (warp / 2) * 32, wn = (warp % 2) * 32;

    for (int64_t r = r0; r < r_end; r += BK) {
      // A slice: rows ops A(i, kk) = x[m0 + i, r + kk] (kk contiguous); wgrad A(i, kk) = dy[r + kk, m0 + i]
      // (i contiguous). B slice: rows ops B(kk, j) = w[e, n0 + j, r + kk]; wgrad B(kk, j) = x[r + kk, n0 + j].
      for (int idx = tid; idx < BM * BK; idx += kGmmMmaThreads) {
        int i, kk;
        if constexpr (kWgrad) {
          i = idx % BM, kk = idx / BM;
        } else {
          i = idx / BK, kk = idx % BK;
        }
        const int64_t row = m0 + i, red = r + kk;
        T v = zero;
        if (row < m_end && red < r_end) v = kWgrad ? a[red * p.a_ld + row] : a[row * p.a_ld + red];
        as[i][kk] = v;
      }
      const bool b_red_fast = !kWgrad && p.b_sk == 1;
      for (int idx = tid; idx < BN * BK; idx += kGmmMmaThreads) {
        const int j = b_red_fast ? idx / BK : idx % BN, kk = b_red_fast ? idx % BK : idx / BN;
        const int64_t col = n0 + j, red = r + kk;
        T v = zero;
        if (col < n_end && red < r_end)
          v = kWgrad ? b[red * p.b_sn + col] : b[int64_t(e) * p.b_batch + col * p.b_sn + red * p.b_sk];
        bs[j][kk] = v;
      }
      __syncthreads();
#pragma unroll
      for (int ks = 0; ks < BK; ks += 16) {
        wmma::fragment<wmma::matrix_a, 16, 16, 16, T, wmma::row_major> fa[2];
        wmma::fragment<wmma::matrix_b, 16, 16, 16, T, wmma::col_major> fb[2];
#pragma unroll
        for (int i = 0; i < 2; ++i) wmma::load_matrix_sync(fa[i], &as[wm + 16 * i][ks], LDS);
#pragma unroll
        for (int j = 0; j < 2; ++j) wmma::load_matrix_sync(fb[j], &bs[wn + 16 * j][ks], LDS);
#pragma unroll
        for (int i = 0; i < 2; ++i)
#pragma unroll
          for (int j = 0; j < 2; ++j) wmma::mma_sync(acc[i][j], fa[i], fb[j], acc[i][j]);
      }
      __syncthreads();
    }

#pragma unroll
    for (int i = 0; i < 2; ++i)
#pragma unroll
      for (int j = 0; j < 2; ++j)
        wmma::store_matrix_sync(&cs[wm + 16 * i][wn + 16 * j], acc[i][j], LDC, wmma::mem_row_major);
    __syncthreads();
    T* dst = kWgrad ? out + int64_t(e) * p.out_batch : out;
    for (int idx = tid; idx < BM * BN; idx += kGmmMmaThreads) {
      const int i = idx / BN, j = idx % BN;
      const int64_t row = m0 + i, col = n0 + j;
      if (row < m_end && col < n_end) dst[row * p.out_ld + col] = T(cs[i][j]);
    }
  }
}

// Rows of no group (past the last group's end) of the rows ops' out, set to 0 (grid-stride).
template <typename T>
__global__ void __launch_bounds__(256) gmm_fill_tail(const GmmParams p) {
  pdl_wait();
  if constexpr (!arch_supports<T>()) {
    __trap();
  } else {
    __shared__ int64_t s_end;
    if (threadIdx.x < 32) {
      const int64_t end = gmm_detail::last_end(p.offsets, p.groups, p.t, int(threadIdx.x));
      if (threadIdx.x == 0) s_end = end;
    }
    __syncthreads();
    gmm_detail::fill_tail(static_cast<T*>(p.out), p.out_ld, p.t, p.n, s_end);
  }
}

}  // namespace kernelforge
