// Attention backward, pass 1 of 3 (include/kernelforge/attention.h has the formula): per query row
// i of every (b, h)
//   D_i    = dout_i . out_i                  (float32, workspace dsum)
//   lse2_i = lse_i * log2(e), +inf where lse_i = -inf (the main kernel's p = 2^(s2 - lse2) is then 0)
//   the row's float32 dQ accumulator zeroed (Dqk floats)
//   dsinks partial: -sum over the block's rows of exp(sink_h - lse_i) D_i, one float per block,
//   summed in a fixed order by pass 3 (attention_bwd_dq_convert.cuh): deterministic in both modes
// and, in deterministic mode, the main kernel's per-(b, h, query tile) semaphores zeroed.
// Workspace layout: attention_bwd_workspace.h. Traffic: dout and out read once (2 * Dv * 2 bytes a
// row), 8 + 4 * Dqk bytes written a row: a few percent of the main kernel's.
//
// Grid (pre_tiles, Hq, B), kAttnBwdPreThreads threads; block x owns rows [64 x, 64 x + 64) of its
// sequence, a warp one row at a time (lanes over the columns, a shuffle tree for the dot product).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "attention/attention_bwd_workspace.h"
#include "attention/attention_problem.h"
#include "attention/kernels/mma_common.cuh"
#include "common/launch.cuh"

namespace kernelforge {

constexpr int kAttnBwdPreThreads = 256;

// block_m: the main kernel's query tile (the semaphores are per tile of block_m rows).
template <typename T>
__global__ void __launch_bounds__(kAttnBwdPreThreads)
    attention_bwd_preprocess(const AttentionGradParams p, const AttnBwdWs ws, const int block_m) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  using namespace attn_mma;
  constexpr int kWarps = kAttnBwdPreThreads / 32;
  const AttentionParams& f = p.f;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int x = blockIdx.x, h = blockIdx.y, b = blockIdx.z;
  pdl_wait();

  // The semaphores of the main kernel's query tiles that start in this block's rows (every tile
  // m < q_tiles starts in exactly one block: m in [ceil(64 x / block_m), ceil(64 (x + 1) / block_m))).
  if (ws.sem != nullptr) {
    const int64_t m_lo = (int64_t(x) * kAttnBwdPreRows + block_m - 1) / block_m;
    int64_t m_hi = (int64_t(x + 1) * kAttnBwdPreRows + block_m - 1) / block_m;
    if (m_hi > ws.q_tiles) m_hi = ws.q_tiles;
    for (int64_t m = m_lo + tid; m < m_hi; m += kAttnBwdPreThreads)
      ws.sem[(int64_t(b) * f.heads_q + h) * ws.q_tiles + m] = 0;
  }

  int64_t q_start = 0;
  int Sq = f.seqlen_q;
  if (f.varlen) {
    q_start = f.cu_seqlens_q[b];
    Sq = f.cu_seqlens_q[b + 1] - int(q_start);
  }
  const int64_t qbase = f.varlen ? q_start : int64_t(b) * f.seqlen_q;  // row numbering of the workspace
  float sink = -INFINITY;
  if (f.sinks != nullptr)
    sink = f.sinks_float ? static_cast<const float*>(f.sinks)[h] : to_float(static_cast<const T*>(f.sinks)[h]);

  const T* dout = static_cast<const T*>(p.dout) + b * p.do_sb + q_start * p.do_ss + h * p.do_sh;
  const T* out = static_cast<const T*>(f.out) + b * f.o_sb + q_start * f.o_ss + h * f.o_sh;
  const int r0 = x * kAttnBwdPreRows;
  const int r_end = r0 + kAttnBwdPreRows < Sq ? r0 + kAttnBwdPreRows : Sq;
  float part = 0.0f;  // lane 0's share of the block's dsinks partial
  for (int r = r0 + warp; r < r_end; r += kWarps) {
    const T* dr = dout + r * p.do_ss;
    const T* orow = out + r * f.o_ss;
    float d = 0.0f;
    for (int c = lane; c < f.head_dim_v; c += 32) d += to_float(dr[c]) * to_float(orow[c]);
#pragma unroll
    for (int off = 16; off >= 1; off >>= 1) d += __shfl_xor_sync(0xffffffffu, d, off);
    const int64_t row = int64_t(h) * f.total_q + qbase + r;
    if (lane == 0) {
      const float lse = f.lse[b * f.lse_sb + h * f.lse_sh + q_start + r];
      ws.dsum[row] = d;
      ws.lse2[row] = lse == -INFINITY ? INFINITY : lse * kLog2e;
      if (lse != -INFINITY) part -= expf(sink - lse) * d;  // 0 without sinks (exp(-inf) = 0)
    }
    float4* acc = reinterpret_cast<float4*>(ws.dq_acc + row * f.head_dim_qk);
    for (int c = lane; c < f.head_dim_qk / 4; c += 32) acc[c] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  }

  if (ws.sinks != nullptr) {
    __shared__ float warp_part[kWarps];
    if (lane == 0) warp_part[warp] = part;
    __syncthreads();
    if (tid == 0) {
      float s = 0.0f;
      for (int w = 0; w < kWarps; ++w) s += warp_part[w];  // fixed order
      ws.sinks[int64_t(h) * f.batch * ws.pre_tiles + int64_t(b) * ws.pre_tiles + x] = s;
    }
  }
#else
  (void)p;
  (void)ws;
  (void)block_m;
#endif
}

}  // namespace kernelforge
