// The mma attention kernel's launcher for one head dim: picks the compiled tile (kAttnMmaTiles row)
// that the plan names, raises the kernel's shared-memory limit (once per device), and launches the grid
// (query tiles, Hq, B). Included by attention_fwd_mma_<dtype>.cu.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "attention/attention_fwd_mma_config.h"
#include "attention/attention_fwd_mma_launch.h"
#include "attention/kernels/attention_fwd_mma.cuh"
#include "common/launch.cuh"
#include "common/occupancy.h"

namespace kernelforge {
namespace attn_mma {

// Every q/k/v base 16-byte aligned and every q/k/v stride a multiple of 8 elements: 16-byte cp.async.
inline bool loads_vec16(const AttentionParams& p) {
  const uintptr_t bases =
      reinterpret_cast<uintptr_t>(p.q) | reinterpret_cast<uintptr_t>(p.k) | reinterpret_cast<uintptr_t>(p.v);
  const int64_t strides = p.q_sb | p.q_ss | p.q_sh | p.k_sb | p.k_ss | p.k_sh | p.v_sb | p.v_ss | p.v_sh;
  return bases % 16 == 0 && strides % 8 == 0;
}

// out base 4-byte aligned and every out stride even: 2-element stores.
inline bool stores_pairs(const AttentionParams& p) {
  return reinterpret_cast<uintptr_t>(p.out) % 4 == 0 && (p.o_sb | p.o_ss | p.o_sh) % 2 == 0;
}

template <typename T, int kTile>
Status launch_tile(const AttentionParams& p, bool longest_first, cudaStream_t stream) {
  constexpr AttnMmaTile c = kAttnMmaTiles[kTile];
  constexpr int block_m = kAttnMmaWarpRows * c.warps;
  constexpr int64_t smem = attention_mma_smem_bytes(c.head_dim_qk, c.head_dim_v, block_m, c.block_n);
  void (*kernel)(const AttentionParams, const bool, const bool, const bool) =
      attention_fwd_mma<T, c.head_dim_qk, c.head_dim_v, c.block_n, c.warps>;
  int device = 0;
  const DeviceInfo* dev = nullptr;
  Status st = current_device_info(&device, &dev);
  if (!st.ok()) return st;
  st = cuda_status(ensure_smem_limit(kernel, size_t(smem)), "attention_forward",
                   "cudaFuncSetAttribute(MaxDynamicSharedMemorySize)");
  if (!st.ok()) return st;
  const int64_t q_tiles = ceil_div(p.seqlen_q, block_m);
  if (q_tiles == 0 || p.heads_q == 0 || p.batch == 0) return Status::Ok();
  Launch l(dim3(unsigned(q_tiles), unsigned(p.heads_q), unsigned(p.batch)), dim3(32u * c.warps), size_t(smem), stream,
           use_pdl(*dev));
  return launched(l(kernel, p, longest_first, loads_vec16(p), stores_pairs(p)), "attention_forward");
}

// The kAttnMmaTiles row of head dim kDqk that matches the plan, from row kTile on.
template <typename T, int kDqk, int kTile = 0>
Status launch_matching(const AttentionPlan& plan, const AttentionParams& p, cudaStream_t stream) {
  if constexpr (kTile == kAttnMmaTileCount) {
    return Status::Invalid("attention_forward: no mma kernel is built for " + to_string(plan));
  } else {
    constexpr AttnMmaTile c = kAttnMmaTiles[kTile];
    if constexpr (c.head_dim_qk == kDqk) {
      if (plan.head_dim_v == c.head_dim_v && plan.block_n == c.block_n && plan.warps == c.warps &&
          plan.block_m == kAttnMmaWarpRows * c.warps)
        return launch_tile<T, kTile>(p, plan.order == AttentionOrder::kLongestFirst, stream);
    }
    return launch_matching<T, kDqk, kTile + 1>(plan, p, stream);
  }
}

}  // namespace attn_mma

template <typename T, int kDqk>
Status launch_attention_fwd_mma_hd(const AttentionPlan& plan, const AttentionParams& p, cudaStream_t stream) {
  return attn_mma::launch_matching<T, kDqk>(plan, p, stream);
}

}  // namespace kernelforge
