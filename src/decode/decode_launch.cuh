// The decode family's launchers: decode attention (the kDecodeTiles row the plan names, then the
// split merge when the plan splits the keys) and kv_append. Included by decode_<dtype>.cu.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "common/launch.cuh"
#include "common/occupancy.h"
#include "decode/decode_config.h"
#include "decode/decode_plan.h"
#include "decode/kernels/decode_attention.cuh"
#include "decode/kernels/decode_merge.cuh"

namespace kernelforge {

template <typename T>
Status launch_decode_attention(const DecodePlan& plan, const DecodeParams& p, void* workspace, cudaStream_t stream);

namespace decode {

// Workspace layout of a split plan: partial outputs [rows][splits][D] float32, then their log2-sum-exp
// [rows][splits] (rows = B * Lq * Hq), each 256-byte aligned.
inline size_t partial_o_bytes(const DecodePlan& plan, const DecodeParams& p) {
  const size_t n = size_t(p.batch) * p.q_len * p.heads_q * plan.splits * plan.head_dim * sizeof(float);
  return (n + 255) / 256 * 256;
}

template <typename T, int kTile>
Status launch_tile(const DecodePlan& plan, const DecodeParams& p, void* workspace, cudaStream_t stream) {
  constexpr DecodeTile c = kDecodeTiles[kTile];
  constexpr int64_t smem = decode_smem_bytes(c.head_dim, c.rows, c.warps, c.stages);
  void (*kernel)(DecodeParams, int, float*, float*) =
      decode_attention_kernel<T, c.head_dim, c.rows / 16, c.warps, c.stages>;
  int device = 0;
  const DeviceInfo* dev = nullptr;
  Status st = current_device_info(&device, &dev);
  if (!st.ok()) return st;
  st = cuda_status(ensure_smem_limit(kernel, size_t(smem)), "decode_attention",
                   "cudaFuncSetAttribute(MaxDynamicSharedMemorySize)");
  if (!st.ok()) return st;
  float* ws_o = nullptr;
  float* ws_lse = nullptr;
  if (plan.splits > 1) {
    ws_o = static_cast<float*>(workspace);
    ws_lse = reinterpret_cast<float*>(static_cast<char*>(workspace) + partial_o_bytes(plan, p));
  }
  const unsigned row_tiles = unsigned(decode_row_tiles(plan, p));
  {
    Launch l(dim3(unsigned(plan.splits), row_tiles * unsigned(p.heads_kv), unsigned(p.batch)), dim3(32u * c.warps),
             size_t(smem), stream, use_pdl(*dev));
    st = launched(l(kernel, p, plan.splits, ws_o, ws_lse), "decode_attention");
    if (!st.ok() || plan.splits == 1) return st;
  }
  void (*merge)(DecodeParams, int, const float*, const float*) = decode_merge_kernel<T, c.head_dim>;
  const int64_t rows = int64_t(p.batch) * p.q_len * p.heads_q;
  Launch l(dim3(unsigned(ceil_div(rows, int64_t(kMergeWarps)))), dim3(32u * kMergeWarps), 0, stream, use_pdl(*dev));
  return launched(l(merge, p, plan.splits, static_cast<const float*>(ws_o), static_cast<const float*>(ws_lse)),
                  "decode_attention (split merge)");
}

template <typename T, int kTile = 0>
Status launch_matching(const DecodePlan& plan, const DecodeParams& p, void* workspace, cudaStream_t stream) {
  if constexpr (kTile == kDecodeTileCount) {
    return Status::Invalid("decode_attention: no kernel is built for " + to_string(plan));
  } else {
    constexpr DecodeTile c = kDecodeTiles[kTile];
    if (plan.head_dim == c.head_dim && plan.rows == c.rows && plan.warps == c.warps && plan.stages == c.stages &&
        plan.block_n == 16 * c.warps)
      return launch_tile<T, kTile>(plan, p, workspace, stream);
    return launch_matching<T, kTile + 1>(plan, p, workspace, stream);
  }
}

}  // namespace decode

template <typename T>
Status launch_decode_attention(const DecodePlan& plan, const DecodeParams& p, void* workspace, cudaStream_t stream) {
  return decode::launch_matching<T>(plan, p, workspace, stream);
}

}  // namespace kernelforge
