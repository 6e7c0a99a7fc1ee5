// Attention backward, pass 3 of 3: dq_i = scale * (the float32 dQ accumulator of row i) rounded to
// T into dq's strides, and dsinks_h = the sum of pass 1's per-block partials of head h in a fixed
// order (lanes over the partials, then a shuffle tree): bit-identical reruns in both modes.
// Traffic: 4 * Dqk bytes read and 2 * Dqk written a row.
//
// Grid (max(pre_tiles, 1), Hq, max(B, 1)) (the dsinks sum runs even when there are no query rows),
// kAttnBwdPreThreads threads; a warp converts one row at a time, a lane two adjacent columns.
// pair_dq: dq base 4-byte aligned and every dq stride even (2-element stores).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "attention/attention_bwd_workspace.h"
#include "attention/attention_problem.h"
#include "attention/kernels/attention_bwd_preprocess.cuh"
#include "attention/kernels/mma_common.cuh"
#include "common/launch.cuh"

namespace kernelforge {

template <typename T>
__global__ void __launch_bounds__(kAttnBwdPreThreads)
    attention_bwd_dq_convert(const AttentionGradParams p, const AttnBwdWs ws, const bool pair_dq) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  using namespace attn_mma;
  constexpr int kWarps = kAttnBwdPreThreads / 32;
  const AttentionParams& f = p.f;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int x = blockIdx.x, h = blockIdx.y, b = blockIdx.z;
  pdl_wait();

  if (ws.sinks != nullptr && x == 0 && b == 0 && warp == 0) {
    const int64_t n = int64_t(f.batch) * ws.pre_tiles;
    const float* part = ws.sinks + int64_t(h) * n;
    float s = 0.0f;
    for (int64_t i = lane; i < n; i += 32) s += part[i];
#pragma unroll
    for (int off = 16; off >= 1; off >>= 1) s += __shfl_xor_sync(0xffffffffu, s, off);
    if (lane == 0) p.dsinks[h] = s;
  }
  if (b >= f.batch) return;

  int64_t q_start = 0;
  int Sq = f.seqlen_q;
  if (f.varlen) {
    q_start = f.cu_seqlens_q[b];
    Sq = f.cu_seqlens_q[b + 1] - int(q_start);
  }
  const int64_t qbase = f.varlen ? q_start : int64_t(b) * f.seqlen_q;
  uint16_t* dq = static_cast<uint16_t*>(p.dq) + b * p.dq_sb + q_start * p.dq_ss + h * p.dq_sh;
  const int r0 = x * kAttnBwdPreRows;
  const int r_end = r0 + kAttnBwdPreRows < Sq ? r0 + kAttnBwdPreRows : Sq;
  for (int r = r0 + warp; r < r_end; r += kWarps) {
    const float* acc = ws.dq_acc + (int64_t(h) * f.total_q + qbase + r) * f.head_dim_qk;
    uint16_t* row = dq + r * p.dq_ss;
    for (int c = 2 * lane; c < f.head_dim_qk; c += 64) {
      const float2 a = *reinterpret_cast<const float2*>(acc + c);
      const uint32_t w = pack2<T>(a.x * f.scale, a.y * f.scale);
      if (pair_dq) {
        *reinterpret_cast<uint32_t*>(row + c) = w;
      } else {
        row[c] = uint16_t(w & 0xffffu);
        row[c + 1] = uint16_t(w >> 16);
      }
    }
  }
#else
  (void)p;
  (void)ws;
  (void)pair_dq;
#endif
}

}  // namespace kernelforge
