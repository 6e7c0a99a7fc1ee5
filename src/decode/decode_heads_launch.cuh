// The head-group decode attention launcher (kernels/decode_attention_heads.cuh): the kDecodeTiles
// kHeadGroup row the plan names, one launch over (splits, kv head groups, sequences). Included by
// decode_heads_<dtype>.cu.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "common/launch.cuh"
#include "common/occupancy.h"
#include "decode/decode_config.h"
#include "decode/decode_launch.cuh"
#include "decode/decode_plan.h"
#include "decode/kernels/decode_attention_heads.cuh"

namespace kernelforge {
namespace decode {

template <typename T, int kTile>
Status launch_heads_tile(const DecodePlan& plan, const DecodeParams& p, void* workspace, cudaStream_t stream) {
  constexpr DecodeTile c = kDecodeTiles[kTile];
  static_assert(c.kernel == DecodeKernel::kHeadGroup && c.rows == 16, "a head-group row");
  constexpr int64_t smem = decode_heads_smem_bytes(c.head_dim, c.warps, c.stages);
  void (*kernel)(DecodeParams, int, float*, float*, int32_t*) =
      decode_attention_heads_kernel<T, c.head_dim, c.warps, c.stages>;
  const DeviceInfo* dev = nullptr;
  DecodeWorkspace ws;
  const Status st = launch_setup(kernel, smem, plan, p, workspace, &dev, &ws);
  if (!st.ok()) return st;
  const unsigned groups = unsigned((p.heads_kv + c.warps - 1) / c.warps);
  // One launch: with splits > 1 the last warp of each (sequence, kv head) merges the splits.
  Launch l(dim3(unsigned(plan.splits), groups, unsigned(p.batch)), dim3(32u * c.warps), size_t(smem), stream,
           use_pdl(*dev));
  return launched(l(kernel, p, plan.splits, ws.o, ws.lse, ws.counters), "decode_attention (head group)");
}

}  // namespace decode

template <typename T>
Status launch_decode_heads(const DecodePlan& plan, const DecodeParams& p, void* workspace, cudaStream_t stream) {
  return decode::match_tile<DecodeKernel::kHeadGroup>(
      plan, [&](auto tile) { return decode::launch_heads_tile<T, decltype(tile)::value>(plan, p, workspace, stream); });
}

}  // namespace kernelforge
