// The wgmma attention kernel's launcher: TMA descriptors (attention_tma_map.h), the compiled head-dim
// configurations, grid and shared memory. Included by attention_fwd_wgmma_<dtype>.cu (one instantiation per dtype)
// and by dev/attention_wgmma_probe.cu.
#pragma once

#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <string>
#include <type_traits>

#include "attention/attention_plan.h"
#include "attention/attention_tma_map.h"
#include "attention/kernels/attention_fwd_wgmma.cuh"
#include "common/launch.cuh"
#include "common/math.h"
#include "common/occupancy.h"

namespace kernelforge {

// The compiled configurations (head dims -> key tile): the table attention_plan_wgmma.cpp mirrors.
// block_n 128 except d256 (80: Q 64 KB + 2 x (K 40 KB + V 40 KB) = 224 KB of shared memory, and 40 + 128
// accumulator registers per thread for S and O).
template <int kDqk, int kDv>
struct WgmmaTile;
template <>
struct WgmmaTile<64, 64> {
  static constexpr int kBlockN = 128;
};
template <>
struct WgmmaTile<128, 128> {
  static constexpr int kBlockN = 128;
};
template <>
struct WgmmaTile<192, 128> {
  static constexpr int kBlockN = 128;
};
template <>
struct WgmmaTile<256, 256> {
  static constexpr int kBlockN = 80;
};

constexpr const char* kWgmmaFwdName = "attention_forward";

template <typename T, int kDqk, int kDv>
Status launch_wgmma_tile(const AttentionPlan& plan, const AttentionParams& p_in, cudaStream_t stream) {
  constexpr int kBlockN = WgmmaTile<kDqk, kDv>::kBlockN;
  using L = WgmmaSmem<kDqk, kDv, kBlockN>;
  if (plan.block_m != kWgmmaBlockM || plan.block_n != kBlockN || plan.warps != kWgmmaThreads / 32 ||
      plan.stages != kWgmmaStages || plan.splits != 1)
    return Status::Invalid("attention_forward: the wgmma kernel has no configuration " + to_string(plan));
  auto kernel = attention_fwd_wgmma<T, kDqk, kDv, kBlockN>;
  if (kernel_binary_version(kernel) != 90)
    return Status::NotSupported("attention_forward: the wgmma kernel needs an sm_90 device and a build with 90a-real");
  // Windows wider than any sequence are unbounded (keeps the kernel's int32 bound arithmetic small).
  AttentionParams p = p_in;
  if (p.window_left >= p.seqlen_k) p.window_left = -1;
  if (p.window_right >= p.seqlen_q) p.window_right = -1;

  if (p.batch == 0 || p.heads_q == 0 || p.seqlen_q == 0) return Status::Ok();

  // kVarlen: one batch of all tokens; a tile's rows start at cu_seqlens[b] (rows past the end read zeros).
  const int64_t batch = p.varlen ? 1 : p.batch;
  const int64_t rows_q = p.varlen ? p.total_q : p.seqlen_q, rows_k = p.varlen ? p.total_k : p.seqlen_k;
  CUtensorMap tq, tk, tv;
  Status st = encode_attention_map<T>(&tq, p.q, kDqk, rows_q, p.heads_q, batch, p.q_ss, p.q_sh, p.q_sb, kWgmmaBlockM,
                                      "q", kWgmmaFwdName);
  if (!st.ok()) return st;
  if (rows_k == 0) {
    // No key: no K/V load is issued (every tile's key range is empty); the maps only need to be valid.
    tk = tq;
    tv = tq;
  } else {
    st = encode_attention_map<T>(&tk, p.k, kDqk, rows_k, p.heads_kv, batch, p.k_ss, p.k_sh, p.k_sb, kBlockN, "k",
                                 kWgmmaFwdName);
    if (!st.ok()) return st;
    st = encode_attention_map<T>(&tv, p.v, kDv, rows_k, p.heads_kv, batch, p.v_ss, p.v_sh, p.v_sb, kBlockN, "v",
                                 kWgmmaFwdName);
    if (!st.ok()) return st;
  }
  auto unaligned = [](int64_t stride, int64_t extent) { return extent > 1 && (stride * int64_t(sizeof(T))) % 16 != 0; };
  if (reinterpret_cast<uintptr_t>(p.out) % 16 != 0 || unaligned(p.o_ss, rows_q) || unaligned(p.o_sh, p.heads_q) ||
      unaligned(p.o_sb, p.batch))
    return Status::NotSupported("attention_forward: the wgmma kernel stores out in 16-byte vectors (aligned rows)");

  const cudaError_t err = ensure_smem_limit(kernel, L::kBytes);
  if (err != cudaSuccess) return cuda_status(err, "attention_forward", "cudaFuncSetAttribute(shared memory)");
  const dim3 grid(unsigned(ceil_div(p.seqlen_q, kWgmmaBlockM)), unsigned(p.heads_q), unsigned(p.batch));
  Launch launch(grid, dim3(kWgmmaThreads), L::kBytes, stream, /*pdl=*/true);
  return launched(launch(kernel, tq, tk, tv, p, plan.order == AttentionOrder::kLongestFirst), "attention_forward");
}

template <typename T>
Status launch_attention_fwd_wgmma(const AttentionPlan& plan, const AttentionParams& p, cudaStream_t stream) {
  const int dqk = plan.head_dim_qk, dv = plan.head_dim_v;
  if (dqk != p.head_dim_qk || dv != p.head_dim_v)
    return Status::Invalid("attention_forward: plan " + to_string(plan) + " does not match the head dims");
  if (dqk == 64 && dv == 64) return launch_wgmma_tile<T, 64, 64>(plan, p, stream);
  if (dqk == 128 && dv == 128) return launch_wgmma_tile<T, 128, 128>(plan, p, stream);
  if (dqk == 192 && dv == 128) return launch_wgmma_tile<T, 192, 128>(plan, p, stream);
  if (dqk == 256 && dv == 256) return launch_wgmma_tile<T, 256, 256>(plan, p, stream);
  return Status::NotSupported("attention_forward: the wgmma kernel has no head dims " + std::to_string(dqk) + "/" +
                              std::to_string(dv));
}

}  // namespace kernelforge
