// The decode attention launchers: the kDecodeTiles row the plan names, one launch (the split merge
// runs in the kernel's last CTA of each (sequence, kv head)). launch_decode_attention switches on the
// plan's kernel: the cp.async tiles here (decode_<dtype>.cu), the TMA tiles in decode_tma_launch.cuh
// (decode_tma_<dtype>.cu) and the head-group tiles in decode_heads_launch.cuh (decode_heads_<dtype>.cu),
// compiled apart.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>
#include <utility>

#include "common/launch.cuh"
#include "common/occupancy.h"
#include "decode/decode_config.h"
#include "decode/decode_plan.h"
#include "decode/kernels/decode_attention.cuh"

namespace kernelforge {

template <typename T>
Status launch_decode_attention(const DecodePlan& plan, const DecodeParams& p, void* workspace, cudaStream_t stream);
template <typename T>
Status launch_decode_tma(const DecodePlan& plan, const DecodeParams& p, void* workspace, cudaStream_t stream);
template <typename T>
Status launch_decode_heads(const DecodePlan& plan, const DecodeParams& p, void* workspace, cudaStream_t stream);

namespace decode {

// What every decode launcher does before its launch: the device, the kernel's dynamic shared memory
// limit raised to `smem`, and the parts of the split workspace (splits > 1).
template <class Kernel>
Status launch_setup(Kernel kernel, int64_t smem, const DecodePlan& plan, const DecodeParams& p, void* workspace,
                    const DeviceInfo** dev, DecodeWorkspace* ws) {
  int device = 0;
  Status st = current_device_info(&device, dev);
  if (!st.ok()) return st;
  st = cuda_status(ensure_smem_limit(kernel, size_t(smem)), "decode_attention",
                   "cudaFuncSetAttribute(MaxDynamicSharedMemorySize)");
  if (!st.ok()) return st;
  if (plan.splits > 1) *ws = decode_workspace(plan, p, workspace);
  return Status::Ok();
}

template <typename T, int kTile>
Status launch_tile(const DecodePlan& plan, const DecodeParams& p, void* workspace, cudaStream_t stream) {
  constexpr DecodeTile c = kDecodeTiles[kTile];
  constexpr int64_t smem = decode_smem_bytes(c.head_dim, c.rows, c.warps, c.stages);
  void (*kernel)(DecodeParams, int, float*, float*, int32_t*) =
      decode_attention_kernel<T, c.head_dim, c.rows / 16, c.warps, c.stages, c.ctas_per_sm>;
  const DeviceInfo* dev = nullptr;
  DecodeWorkspace ws;
  const Status st = launch_setup(kernel, smem, plan, p, workspace, &dev, &ws);
  if (!st.ok()) return st;
  const unsigned row_tiles = unsigned(decode_row_tiles(plan, p));
  // One launch: with splits > 1 the last CTA of each (sequence, kv head) merges the splits.
  Launch l(dim3(unsigned(plan.splits), row_tiles * unsigned(p.heads_kv), unsigned(p.batch)), dim3(32u * c.warps),
           size_t(smem), stream, use_pdl(*dev));
  return launched(l(kernel, p, plan.splits, ws.o, ws.lse, ws.counters), "decode_attention");
}

// The kDecodeTiles row of `kernel` that `plan` names, from row kTile on.
constexpr bool decode_tile_matches(const DecodeTile& c, const DecodePlan& plan, DecodeKernel kernel) {
  return c.kernel == kernel && plan.kernel == kernel && plan.head_dim == c.head_dim && plan.rows == c.rows &&
         plan.warps == c.warps && plan.stages == c.stages && plan.block_n == decode_tile_block_n(c);
}

// launch(std::integral_constant<int, i>{}) for the kDecodeTiles row i of kind kKind that `plan` names
// (instantiated for the rows of that kind only), or Invalid when no such row is built.
template <DecodeKernel kKind, int kTile = 0, class Launch_>
Status match_tile(const DecodePlan& plan, Launch_&& launch) {
  if constexpr (kTile == kDecodeTileCount) {
    return Status::Invalid("decode_attention: no kernel is built for " + to_string(plan));
  } else {
    constexpr DecodeTile c = kDecodeTiles[kTile];
    if constexpr (c.kernel == kKind) {
      if (decode_tile_matches(c, plan, kKind)) return launch(std::integral_constant<int, kTile>{});
    }
    return match_tile<kKind, kTile + 1>(plan, std::forward<Launch_>(launch));
  }
}

}  // namespace decode

template <typename T>
Status launch_decode_attention(const DecodePlan& plan, const DecodeParams& p, void* workspace, cudaStream_t stream) {
  switch (plan.kernel) {
    case DecodeKernel::kTma:
      return launch_decode_tma<T>(plan, p, workspace, stream);
    case DecodeKernel::kHeadGroup:
      return launch_decode_heads<T>(plan, p, workspace, stream);
    case DecodeKernel::kCpAsync:
      break;
  }
  return decode::match_tile<DecodeKernel::kCpAsync>(
      plan, [&](auto tile) { return decode::launch_tile<T, decltype(tile)::value>(plan, p, workspace, stream); });
}

}  // namespace kernelforge
