// Decode attention, split-KV merge: combines the splits of every query row (token t, head h of
// sequence b) by their log2-sum-exp, adds the sink, and writes out (T) and lse (natural log).
//   M = max(max_s lse2_s, sink2),  w_s = 2^(lse2_s - M),  den = sum_s w_s + 2^(sink2 - M)
//   out = sum_s w_s o_s / den,     lse = (M + log2(den)) ln 2
// o_s is split s's output normalized by its own sum (decode_attention.cuh); an empty split has
// lse2 = -inf and weight 0. One warp per row; each load of the warp reads 32 × 4 consecutive floats (2 at D = 64).
// Bytes: splits * (D + 1) * 4 per row read (from L2: the partials were written just before), D * sizeof(T) written.
//
// merge_split_row is the merge of one row; decode_attention's last CTA of each (sequence, kv head)
// runs it in place of a second kernel, mla_decode launches decode_merge_kernel. The partials are read
// with ld.global.cg (L2, never a possibly stale L1 line): in the fused merge they were written by other
// CTAs of the same grid.
#pragma once

#include <cstdint>

#include "attention/kernels/elementwise.cuh"
#include "common/launch.cuh"
#include "decode/decode_problem.h"

namespace kernelforge {
namespace decode {

constexpr int kMergeWarps = 4;

// Row `row` = (b * Lq + t) * Hq + h of the partials [rows][splits][kD] / [rows][splits]; every lane
// of the warp calls it with the same row.
template <typename T, int kD>
__device__ __forceinline__ void merge_split_row(const DecodeParams& p, int splits, const float* ws_o,
                                                const float* ws_lse, int64_t row, int lane) {
  constexpr float kLog2e = 1.4426950408889634f, kLn2 = 0.6931471805599453f;
  constexpr int kVec = kD % 128 == 0 ? 4 : 2;  // floats per lane per load: 16-byte loads where D allows
  constexpr int kChunks = kD / (32 * kVec);
  static_assert(kD % 64 == 0, "D is 64, 128, 256 or 512");
  const int h = int(row % p.heads_q);
  const int t = int((row / p.heads_q) % p.q_len);
  const int b = int(row / (int64_t(p.heads_q) * p.q_len));
  const float* lse_row = ws_lse + row * splits;
  float mx = -INFINITY;
  for (int s = lane; s < splits; s += 32) mx = fmaxf(mx, __ldcg(lse_row + s));
#pragma unroll
  for (int off = 16; off > 0; off /= 2) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, off));
  float sink = -INFINITY;
  if (p.sinks != nullptr)
    sink =
        (p.sinks_float ? static_cast<const float*>(p.sinks)[h] : to_float(static_cast<const T*>(p.sinks)[h])) * kLog2e;
  const float m_all = fmaxf(mx, sink);
  const float m_use = m_all == -INFINITY ? 0.0f : m_all;
  // Lane columns: chunk c of 32 * kVec columns, lane l owns columns (c * 32 + l) * kVec .. + kVec, so
  // each load instruction of the warp reads 32 * kVec consecutive floats (coalesced).
  float acc[kChunks][kVec];
#pragma unroll
  for (int c = 0; c < kChunks; ++c)
#pragma unroll
    for (int v = 0; v < kVec; ++v) acc[c][v] = 0.0f;
  float den = sink == -INFINITY ? 0.0f : exp2f(sink - m_use);
  const float* o_row = ws_o + row * splits * kD + lane * kVec;
  // Unrolled so that several splits' loads are in flight: the loop is latency-bound otherwise (at
  // D = 512 and 64 splits, one warp reads 128 KB).
#pragma unroll 4
  for (int s = 0; s < splits; ++s) {
    const float w = exp2f(__ldcg(lse_row + s) - m_use);
    den += w;
#pragma unroll
    for (int c = 0; c < kChunks; ++c) {
      const float* src = o_row + int64_t(s) * kD + c * 32 * kVec;
      float v[kVec];
      if constexpr (kVec == 4) {
        const float4 x = __ldcg(reinterpret_cast<const float4*>(src));
        v[0] = x.x, v[1] = x.y, v[2] = x.z, v[3] = x.w;
      } else {
        const float2 x = __ldcg(reinterpret_cast<const float2*>(src));
        v[0] = x.x, v[1] = x.y;
      }
#pragma unroll
      for (int k = 0; k < kVec; ++k) acc[c][k] += w == 0.0f ? 0.0f : w * v[k];  // an empty split adds nothing
    }
  }
  const float inv = den > 0.0f ? 1.0f / den : 0.0f;
  uint16_t* out = static_cast<uint16_t*>(p.out) + b * p.o_sb + t * p.o_st + h * p.o_sh + lane * kVec;
#pragma unroll
  for (int c = 0; c < kChunks; ++c)
#pragma unroll
    for (int k = 0; k < kVec; k += 2) {
      const uint32_t pk = pack2<T>(acc[c][k] * inv, acc[c][k + 1] * inv);
      out[c * 32 * kVec + k] = uint16_t(pk & 0xffffu);
      out[c * 32 * kVec + k + 1] = uint16_t(pk >> 16);
    }
  if (p.lse != nullptr && lane == 0)
    p.lse[b * p.lse_sb + t * p.lse_st + h] = den > 0.0f ? (m_use + log2f(den)) * kLn2 : -INFINITY;
}

template <typename T, int kD>
__global__ void __launch_bounds__(kMergeWarps * 32)
    decode_merge_kernel(DecodeParams p, int splits, const float* ws_o, const float* ws_lse) {
  if constexpr (!arch_supports<T>()) {
    __trap();
  } else {
    const int64_t row = int64_t(blockIdx.x) * kMergeWarps + threadIdx.x / 32;
    const int64_t rows = int64_t(p.batch) * p.q_len * p.heads_q;
    pdl_wait();
    if (row >= rows) return;
    merge_split_row<T, kD>(p, splits, ws_o, ws_lse, row, int(threadIdx.x % 32));
  }
}

}  // namespace decode
}  // namespace kernelforge
