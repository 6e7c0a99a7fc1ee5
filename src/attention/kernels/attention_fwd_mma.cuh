// Attention forward, FlashAttention-2 design on mma.sync tensor cores (sm_80 and later; runs on
// sm_90 too). The production kernel of every head dim below the wgmma kernel (attention_plan.cpp).
//
// Formula (include/kernelforge/attention.h), per (batch b, query head h, query row i < Sq_b):
//   s_ij = scale * q_i . k_j, then softcap * tanh(s_ij / softcap) when softcap > 0
//   visible: j < Sk_b, j >= i + d - window_left (window_left >= 0), j <= i + d + window_right
//            (window_right >= 0), d = Sk_b - Sq_b (bottom-right aligned; causal is window_right = 0)
//   m_i = max(visible s_ij, sink_h), l_i = sum exp(s_ij - m_i) + exp(sink_h - m_i)
//   out_i = sum exp(s_ij - m_i) / l_i * v_j, lse_i = m_i + log(l_i)
//   a row that sees no key: out 0, lse -inf (sink_h with sinks); never NaN.
// FLOPs: 2 * Sq * Sk * (Dqk + Dv) per (b, h) (visible pairs only: about half for causal). Minimum
// traffic: q, k, v read once and out written once; K and V are re-read from L2 by every query tile
// of a (b, kv head), Sq / block_m times.
//
// Tiling: one block of kWarps warps owns block_m = 16 * kWarps query rows of one (b, h); warp w owns
// rows 16 w .. 16 w + 15 (one m16 tile). The Q tile is copied to shared memory once and, for
// Dqk <= 192, held as mma A fragments in registers (Dqk / 16 k-steps x 4 registers); for Dqk = 256
// it would not fit beside the 128-float output accumulator, so the fragments are read from shared
// memory with ldmatrix at every k-step. K and V tiles of kBlockN rows stream through a 2-stage
// cp.async pipeline (tile n + 1 loads while tile n is computed). Shared rows are padded by 8
// elements (attention_fwd_mma_config.h): ldmatrix phases are free of bank conflicts.
//
// Per key tile, per warp: S[16 x kBlockN] = Q K^T (mma m16n8k16, fp32 accumulate), scaled into
// the log2 domain (scale * log2(e) folded in), masked only on tiles that straddle a window
// boundary or the sequence end (tiles entirely invisible to the block are never visited: the key
// tile range [n_begin, n_end) comes from the visibility rule of the first and last row), online
// softmax (row max over the 4 threads of a quad by shuffles; the row sum kept per thread and
// reduced once at the end), P rounded to T in registers and used directly as the A operand of
// O += P V (V fragments by ldmatrix.trans).
//
// Fragment layouts of mma.m16n8k16 (g = lane / 4, t = lane % 4; pairs of T packed in a 32-bit
// register, the lower column in the low half):
//   A 16x16 (row): a0 = (g, 2t..2t+1), a1 = (g+8, 2t..), a2 = (g, 2t+8..), a3 = (g+8, 2t+8..)
//   B 16x8  (col): b0 = (k 2t..2t+1, n g), b1 = (k 2t+8..2t+9, n g)
//   C 16x8       : c0,c1 = (g, 2t..2t+1), c2,c3 = (g+8, 2t..2t+1)
// ldmatrix .x4: lanes 8i..8i+7 give the row addresses of 8x8 matrix i, register i receives it
// (non-trans: thread holds row g, columns 2t..2t+1; .trans: rows 2t..2t+1 of column g).
//   Q (A): lane row 16w + (lane % 16), column 16kk + 8 (lane / 16) -> a0..a3.
//   K (B of S, B[k][n] = K[n][k]): lane row n0 + lane % 8 + 8 (lane / 16), column 16kk +
//     8 ((lane / 8) % 2) -> b0, b1 of key tile n0 and b0, b1 of key tile n0 + 8.
//   V (B of O, B[k][n] = V[k][n], .trans): lane row 16kk + lane % 16, column d0 + 8 (lane / 16)
//     -> b0, b1 of dim tile d0 and b0, b1 of dim tile d0 + 8.
//   P (A of O): the S accumulators of key tiles 2kk and 2kk + 1 are exactly a0..a3 of k-step kk:
//     a0 = S[2kk].c0c1, a1 = S[2kk].c2c3, a2 = S[2kk+1].c0c1, a3 = S[2kk+1].c2c3.
//
// Every feature is a run-time argument (one instantiation per dtype, head dims and tile): window /
// causal, softcap, sinks, varlen, GQA, lse. Loads use 16-byte cp.async when every base and stride
// allows it (vec16), element loads otherwise; rows past the sequence are zero-filled (V rows past
// Sk must be finite: P is 0 there and 0 * NaN would poison O).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

#include "attention/attention_fwd_mma_config.h"
#include "attention/attention_problem.h"
#include "attention/kernels/mma_common.cuh"
#include "common/launch.cuh"

namespace kernelforge {

// T: __half or __nv_bfloat16. Grid (query tiles, Hq, B); block kWarps * 32 threads; dynamic shared
// memory attention_mma_smem_bytes(kDqk, kDv, 16 * kWarps, kBlockN).
// longest_first: blockIdx.x walks the query tiles from the last (causal: the most keys) to the first.
// vec16: q, k, v bases 16-byte aligned and every q/k/v stride a multiple of 8 elements.
// pair_out: out base 4-byte aligned and every out stride even (2-element stores).
template <typename T, int kDqk, int kDv, int kBlockN, int kWarps>
__global__ void __launch_bounds__(kWarps * 32)
    attention_fwd_mma(const AttentionParams p, const bool longest_first, const bool vec16, const bool pair_out) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  using namespace attn_mma;
  constexpr int kBlockM = kAttnMmaWarpRows * kWarps;
  constexpr int kThreads = kWarps * 32;
  constexpr int kQStride = kDqk + kAttnMmaPad;  // shared row strides, elements
  constexpr int kVStride = kDv + kAttnMmaPad;
  constexpr int kKElems = kBlockN * kQStride;
  constexpr int kStageElems = kKElems + kBlockN * kVStride;
  constexpr bool kQInRegs = kDqk <= 192;
  constexpr int kQSteps = kDqk / 16;    // k-steps of S = Q K^T
  constexpr int kNTiles = kBlockN / 8;  // n8 tiles of S
  constexpr int kDTiles = kDv / 8;      // n8 tiles of O
  static_assert(kDqk % 16 == 0 && kDv % 16 == 0 && kBlockN % 16 == 0, "tile shapes are multiples of 16");
  static_assert(sizeof(T) == 2, "T is a 16-bit type");

  extern __shared__ __align__(128) unsigned char smem_raw[];
  uint16_t* sQ = reinterpret_cast<uint16_t*>(smem_raw);
  uint16_t* sKV = sQ + kBlockM * kQStride;  // stage s: K at sKV + s * kStageElems, V after it

  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int g = lane >> 2, t = lane & 3;
  const int b = blockIdx.z, h = blockIdx.y;
  const int m_tile = longest_first ? int(gridDim.x) - 1 - int(blockIdx.x) : int(blockIdx.x);

  pdl_wait();
  int64_t q_start = 0, k_start = 0;
  int Sq = p.seqlen_q, Sk = p.seqlen_k;
  if (p.varlen) {
    q_start = p.cu_seqlens_q[b];
    Sq = p.cu_seqlens_q[b + 1] - int(q_start);
    k_start = p.cu_seqlens_k[b];
    Sk = p.cu_seqlens_k[b + 1] - int(k_start);
  }
  const int m0 = m_tile * kBlockM;
  if (m0 >= Sq) return;  // the whole block: varlen sequences shorter than the grid's bound

  const int kvh = h / p.group;
  const uint16_t* q = static_cast<const uint16_t*>(p.q) + b * p.q_sb + (q_start + m0) * p.q_ss + h * p.q_sh;
  const uint16_t* k = static_cast<const uint16_t*>(p.k) + b * p.k_sb + k_start * p.k_ss + kvh * p.k_sh;
  const uint16_t* v = static_cast<const uint16_t*>(p.v) + b * p.v_sb + k_start * p.v_ss + kvh * p.v_sh;

  // Visible keys of row i: [row_lo(i), row_hi(i)), both non-decreasing in i, clamped to [0, Sk].
  const int64_t diag = int64_t(Sk) - Sq;
  auto row_lo = [&](int64_t i) -> int {
    if (p.window_left < 0) return 0;
    const int64_t lo = i + diag - p.window_left;
    return int(lo < 0 ? 0 : (lo > Sk ? Sk : lo));
  };
  auto row_hi = [&](int64_t i) -> int {
    if (p.window_right < 0) return Sk;
    const int64_t hi = i + diag + p.window_right + 1;
    return int(hi < 0 ? 0 : (hi > Sk ? Sk : hi));
  };
  const int last_row = (m0 + kBlockM < Sq ? m0 + kBlockM : Sq) - 1;
  const int keys_lo = row_lo(m0), keys_hi = row_hi(last_row);  // the block's key range
  const int n_begin = keys_lo / kBlockN;
  const int n_end = keys_hi > keys_lo ? (keys_hi + kBlockN - 1) / kBlockN : n_begin;
  // A key tile [key0, key0 + kBlockN) needs no element mask when every row sees all of it.
  const int full_lo = row_lo(int64_t(m0) + kBlockM - 1), full_hi = row_hi(m0);
  // This thread's two rows (g and g + 8 of the warp's m16 tile).
  const int row_a = m0 + warp * kAttnMmaWarpRows + g, row_b = row_a + 8;
  const int lo_a = row_lo(row_a), hi_a = row_hi(row_a), lo_b = row_lo(row_b), hi_b = row_hi(row_b);

  // Scores in the log2 domain: s2 = s * log2(e). Without softcap s2 = acc * (scale log2 e); with it
  // s2 = tanh(acc * scale / softcap) * (softcap log2 e).
  const bool softcap = p.softcap > 0.0f;
  const float pre = softcap ? p.scale / p.softcap : p.scale * kLog2e;
  const float post = softcap ? p.softcap * kLog2e : 1.0f;
  float sink2 = -INFINITY;
  if (p.sinks != nullptr)
    sink2 =
        kLog2e * (p.sinks_float ? static_cast<const float*>(p.sinks)[h] : to_float(static_cast<const T*>(p.sinks)[h]));

  float acc[kDTiles][4];
#pragma unroll
  for (int j = 0; j < kDTiles; ++j) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.0f;
  float m_a = sink2, m_b = sink2;  // running row max (log2 domain), starting at the sink logit
  float l_a = 0.0f, l_b = 0.0f;    // this thread's share of the running row sum

  if (n_begin < n_end) {
    auto load_kv = [&](int n, int stage) {
      const int key0 = n * kBlockN;
      uint16_t* sK = sKV + stage * kStageElems;
      load_tile<kBlockN, kDqk, kThreads>(sK, k + key0 * p.k_ss, p.k_ss, Sk - key0, vec16);
      load_tile<kBlockN, kDv, kThreads>(sK + kKElems, v + key0 * p.v_ss, p.v_ss, Sk - key0, vec16);
    };
    load_tile<kBlockM, kDqk, kThreads>(sQ, q, p.q_ss, Sq - m0, vec16);
    load_kv(n_begin, 0);
    cp_async_commit();

    uint32_t qf[kQInRegs ? kQSteps : 1][4];  // Q's A fragments (Dqk <= 192)
    (void)qf;
    const uint32_t q_lane = smem_addr(sQ + (warp * kAttnMmaWarpRows + (lane & 15)) * kQStride + (lane >> 4) * 8);
    const int k_lane_elem = ((lane & 7) + ((lane >> 4) << 3)) * kQStride + ((lane >> 3) & 1) * 8;
    const int v_lane_elem = (lane & 15) * kVStride + (lane >> 4) * 8;

    for (int n = n_begin; n < n_end; ++n) {
      const int stage = (n - n_begin) & 1;
      if (n + 1 < n_end) {
        load_kv(n + 1, stage ^ 1);
        cp_async_commit();
        cp_async_wait<1>();
      } else {
        cp_async_wait<0>();
      }
      __syncthreads();
      const uint16_t* sK = sKV + stage * kStageElems;
      const uint32_t k_lane = smem_addr(sK + k_lane_elem);
      const uint32_t v_lane = smem_addr(sK + kKElems + v_lane_elem);
      if constexpr (kQInRegs) {
        if (n == n_begin) {
#pragma unroll
          for (int kk = 0; kk < kQSteps; ++kk) ldmatrix_x4(q_lane + kk * 32, qf[kk]);
        }
      }

      // S = Q K^T for this warp's 16 rows and the tile's kBlockN keys.
      float s[kNTiles][4];
#pragma unroll
      for (int j = 0; j < kNTiles; ++j) s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.0f;
#pragma unroll
      for (int kk = 0; kk < kQSteps; ++kk) {
        uint32_t a[4];
        if constexpr (kQInRegs) {
#pragma unroll
          for (int r = 0; r < 4; ++r) a[r] = qf[kk][r];
        } else {
          ldmatrix_x4(q_lane + kk * 32, a);
        }
#pragma unroll
        for (int np = 0; np < kNTiles / 2; ++np) {
          uint32_t bk[4];
          ldmatrix_x4(k_lane + (np * 16 * kQStride + kk * 16) * 2, bk);
          mma_16816<T>(s[2 * np], a, bk[0], bk[1]);
          mma_16816<T>(s[2 * np + 1], a, bk[2], bk[3]);
        }
      }

      // Scale (and cap) into the log2 domain; mask the tiles that straddle a boundary.
      const int key0 = n * kBlockN;
      const bool masked = key0 < full_lo || key0 + kBlockN > full_hi;
#pragma unroll
      for (int j = 0; j < kNTiles; ++j) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          float x = s[j][e] * pre;
          if (softcap) x = tanh_approx(x) * post;
          if (masked) {
            const int key = key0 + 8 * j + 2 * t + (e & 1);
            const bool vis = e < 2 ? (key >= lo_a && key < hi_a) : (key >= lo_b && key < hi_b);
            if (!vis) x = -INFINITY;
          }
          s[j][e] = x;
        }
      }

      // Online softmax: new row max over the quad, rescale, exponentiate.
      float mx_a = m_a, mx_b = m_b;
#pragma unroll
      for (int j = 0; j < kNTiles; ++j) {
        mx_a = fmaxf(mx_a, fmaxf(s[j][0], s[j][1]));
        mx_b = fmaxf(mx_b, fmaxf(s[j][2], s[j][3]));
      }
#pragma unroll
      for (int off = 1; off <= 2; off <<= 1) {
        mx_a = fmaxf(mx_a, __shfl_xor_sync(0xffffffffu, mx_a, off));
        mx_b = fmaxf(mx_b, __shfl_xor_sync(0xffffffffu, mx_b, off));
      }
      // A row with nothing visible yet keeps max -inf: subtract 0 instead (every term is then 0).
      const float mu_a = mx_a == -INFINITY ? 0.0f : mx_a;
      const float mu_b = mx_b == -INFINITY ? 0.0f : mx_b;
      const float alpha_a = ex2_approx(m_a - mu_a), alpha_b = ex2_approx(m_b - mu_b);  // m = -inf -> 0
      m_a = mx_a;
      m_b = mx_b;
      float sum_a = 0.0f, sum_b = 0.0f;
#pragma unroll
      for (int j = 0; j < kNTiles; ++j) {
        s[j][0] = ex2_approx(s[j][0] - mu_a);
        s[j][1] = ex2_approx(s[j][1] - mu_a);
        s[j][2] = ex2_approx(s[j][2] - mu_b);
        s[j][3] = ex2_approx(s[j][3] - mu_b);
        sum_a += s[j][0] + s[j][1];
        sum_b += s[j][2] + s[j][3];
      }
      l_a = l_a * alpha_a + sum_a;
      l_b = l_b * alpha_b + sum_b;
#pragma unroll
      for (int j = 0; j < kDTiles; ++j) {
        acc[j][0] *= alpha_a;
        acc[j][1] *= alpha_a;
        acc[j][2] *= alpha_b;
        acc[j][3] *= alpha_b;
      }

      // O += P V: P rounded to T straight from the S accumulators into A fragments.
#pragma unroll
      for (int kk = 0; kk < kBlockN / 16; ++kk) {
        const uint32_t a[4] = {pack2<T>(s[2 * kk][0], s[2 * kk][1]), pack2<T>(s[2 * kk][2], s[2 * kk][3]),
                               pack2<T>(s[2 * kk + 1][0], s[2 * kk + 1][1]),
                               pack2<T>(s[2 * kk + 1][2], s[2 * kk + 1][3])};
#pragma unroll
        for (int dp = 0; dp < kDTiles / 2; ++dp) {
          uint32_t bv[4];
          ldmatrix_x4_trans(v_lane + (kk * 16 * kVStride + dp * 16) * 2, bv);
          mma_16816<T>(acc[2 * dp], a, bv[0], bv[1]);
          mma_16816<T>(acc[2 * dp + 1], a, bv[2], bv[3]);
        }
      }
      __syncthreads();  // the next iteration's loads overwrite this stage
    }
  }

  // Row sums over the quad, the sink's term, normalization.
#pragma unroll
  for (int off = 1; off <= 2; off <<= 1) {
    l_a += __shfl_xor_sync(0xffffffffu, l_a, off);
    l_b += __shfl_xor_sync(0xffffffffu, l_b, off);
  }
  if (m_a != -INFINITY) l_a += ex2_approx(sink2 - m_a);  // 0 without sinks
  if (m_b != -INFINITY) l_b += ex2_approx(sink2 - m_b);
  const float inv_a = l_a > 0.0f ? 1.0f / l_a : 0.0f;
  const float inv_b = l_b > 0.0f ? 1.0f / l_b : 0.0f;

  T* o = static_cast<T*>(p.out) + b * p.o_sb + q_start * p.o_ss + h * p.o_sh;
  const int c0 = 2 * t;
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int row = half == 0 ? row_a : row_b;
    if (row >= Sq) continue;
    const float inv = half == 0 ? inv_a : inv_b;
    T* orow = o + row * p.o_ss;
#pragma unroll
    for (int j = 0; j < kDTiles; ++j) {
      const uint32_t w = pack2<T>(acc[j][2 * half] * inv, acc[j][2 * half + 1] * inv);
      if (pair_out) {
        *reinterpret_cast<uint32_t*>(orow + 8 * j + c0) = w;
      } else {
        reinterpret_cast<uint16_t*>(orow)[8 * j + c0] = uint16_t(w & 0xffffu);
        reinterpret_cast<uint16_t*>(orow)[8 * j + c0 + 1] = uint16_t(w >> 16);
      }
    }
    if (p.lse != nullptr && t == 0) {
      const float l = half == 0 ? l_a : l_b, m = half == 0 ? m_a : m_b;
      p.lse[b * p.lse_sb + h * p.lse_sh + q_start + row] = l > 0.0f ? m * kLn2 + logf(l) : -INFINITY;
    }
  }
#else
  (void)p;
  (void)longest_first;
  (void)vec16;
  (void)pair_out;
#endif
}

}  // namespace kernelforge
