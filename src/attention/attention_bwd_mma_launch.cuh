// The mma attention backward's launcher: pass 1, the main kernel of the kAttnBwdTiles row that the
// plan names (kernels/attention_bwd_mma.cuh; its shared-memory limit set once per device) and pass 3
// (attention_bwd_passes.cuh), all on `stream` with programmatic dependent launch on sm_90 (every
// kernel waits for its predecessor before touching memory). Included by attention_bwd_mma_<dtype>.cu.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "attention/attention_bwd_mma_config.h"
#include "attention/attention_bwd_mma_launch.h"
#include "attention/attention_bwd_passes.cuh"
#include "attention/kernels/attention_bwd_mma.cuh"
#include "common/launch.cuh"
#include "common/occupancy.h"

namespace kernelforge {
namespace attn_bwd {

// q, k, v, dout bases 16-byte aligned and all their strides multiples of 8 elements: 16-byte cp.async.
inline bool loads_vec16(const AttentionGradParams& p) {
  const AttentionParams& f = p.f;
  const uintptr_t bases = reinterpret_cast<uintptr_t>(f.q) | reinterpret_cast<uintptr_t>(f.k) |
                          reinterpret_cast<uintptr_t>(f.v) | reinterpret_cast<uintptr_t>(p.dout);
  const int64_t strides =
      f.q_sb | f.q_ss | f.q_sh | f.k_sb | f.k_ss | f.k_sh | f.v_sb | f.v_ss | f.v_sh | p.do_sb | p.do_ss | p.do_sh;
  return bases % 16 == 0 && strides % 8 == 0;
}

template <typename T, int kTile>
Status launch_tile(const AttentionGradParams& p, const AttnBwdWs& ws, const DeviceInfo& dev, cudaStream_t stream) {
  constexpr AttnBwdTile c = kAttnBwdTiles[kTile];
  constexpr int64_t smem = attention_bwd_mma_smem_bytes(c.head_dim_qk, c.head_dim_v, c.block_m, c.block_n, c.stages);
  void (*kernel)(const AttentionGradParams, const AttnBwdWs, const bool, const bool, const bool) =
      attention_bwd_mma<T, c.head_dim_qk, c.head_dim_v, c.block_m, c.block_n, c.warps, c.stages>;
  int device = 0;
  const DeviceInfo* cur = nullptr;
  Status st = current_device_info(&device, &cur);
  if (!st.ok()) return st;
  st = cuda_status(ensure_smem_limit(kernel, size_t(smem)), kName, "cudaFuncSetAttribute(MaxDynamicSharedMemorySize)");
  if (!st.ok()) return st;
  const int64_t k_tiles = ceil_div(p.f.seqlen_k, c.block_n);
  if (k_tiles == 0 || p.f.heads_kv == 0 || p.f.batch == 0) return Status::Ok();
  Launch l(dim3(unsigned(k_tiles), unsigned(p.f.heads_kv), unsigned(p.f.batch)), dim3(32u * c.warps), size_t(smem),
           stream, use_pdl(dev));
  return launched(l(kernel, p, ws, loads_vec16(p), stores_pairs(p.dk, p.dk_sb, p.dk_ss, p.dk_sh),
                    stores_pairs(p.dv, p.dv_sb, p.dv_ss, p.dv_sh)),
                  kName);
}

// The kAttnBwdTiles row that matches the plan, from row kTile on.
template <typename T, int kTile = 0>
Status launch_matching(const AttentionPlan& plan, const AttentionGradParams& p, const AttnBwdWs& ws,
                       const DeviceInfo& dev, cudaStream_t stream) {
  if constexpr (kTile == kAttnBwdTileCount) {
    return Status::Invalid(std::string(kName) + ": no backward kernel is built for " + to_string(plan));
  } else {
    constexpr AttnBwdTile c = kAttnBwdTiles[kTile];
    if (plan.head_dim_qk == c.head_dim_qk && plan.head_dim_v == c.head_dim_v && plan.block_m == c.block_m &&
        plan.block_n == c.block_n && plan.warps == c.warps && plan.stages == c.stages)
      return launch_tile<T, kTile>(p, ws, dev, stream);
    return launch_matching<T, kTile + 1>(plan, p, ws, dev, stream);
  }
}

}  // namespace attn_bwd

template <typename T>
Status launch_attention_bwd_mma(const AttentionPlan& plan, const AttentionGradParams& p, const DeviceInfo& dev,
                                void* workspace, cudaStream_t stream) {
  using namespace attn_bwd;
  const AttnBwdWs ws = workspace_regions(plan, p, workspace);
  Status st = launch_preprocess<T>(p, ws, plan.block_m, dev, stream);
  if (!st.ok()) return st;
  st = launch_matching<T>(plan, p, ws, dev, stream);  // dk, dv written; dQ accumulated
  if (!st.ok()) return st;
  return launch_dq_convert<T>(p, ws, dev, stream);
}

}  // namespace kernelforge
