// The MLA decode launcher: the kMlaTiles row the plan names, then the split merge (decode_merge.cuh at
// 512 columns) when the plan splits the keys. Included by mla_<dtype>.cu.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "common/launch.cuh"
#include "common/occupancy.h"
#include "decode/kernels/decode_merge.cuh"
#include "decode/kernels/mla_decode.cuh"
#include "decode/mla_config.h"
#include "decode/mla_plan.h"

namespace kernelforge {

template <typename T>
Status launch_mla_decode(const MlaDecodePlan& plan, const DecodeParams& p, void* workspace, cudaStream_t stream);

namespace decode {

// Workspace layout of a split plan: partial outputs [rows][splits][512] float32, then their
// log2-sum-exp [rows][splits] (rows = B * Lq * H), each 256-byte aligned (mla_decode_workspace_bytes).
template <typename T, int kStages>
Status launch_mla_tile(const MlaDecodePlan& plan, const DecodeParams& p, void* workspace, cudaStream_t stream) {
  constexpr int64_t smem = mla_smem_bytes(kStages);
  void (*kernel)(DecodeParams, int, float*, float*) = mla_decode_kernel<T, kStages>;
  int device = 0;
  const DeviceInfo* dev = nullptr;
  Status st = current_device_info(&device, &dev);
  if (!st.ok()) return st;
  st = cuda_status(ensure_smem_limit(kernel, size_t(smem)), "mla_decode",
                   "cudaFuncSetAttribute(MaxDynamicSharedMemorySize)");
  if (!st.ok()) return st;
  float* ws_o = nullptr;
  float* ws_lse = nullptr;
  if (plan.splits > 1) {
    const size_t rows = size_t(p.batch) * p.q_len * p.heads_q * plan.splits;
    ws_o = static_cast<float*>(workspace);
    ws_lse = reinterpret_cast<float*>(static_cast<char*>(workspace) +
                                      (rows * kMlaHeadDimV * sizeof(float) + 255) / 256 * 256);
  }
  {  // row tiles fastest: the CTAs reading the same keys run side by side and share them through L2
    Launch l(dim3(unsigned(mla_row_tiles(plan, p)), unsigned(plan.splits), unsigned(p.batch)), dim3(32u * kMlaWarps),
             size_t(smem), stream, use_pdl(*dev));
    st = launched(l(kernel, p, plan.splits, ws_o, ws_lse), "mla_decode");
    if (!st.ok() || plan.splits == 1) return st;
  }
  void (*merge)(DecodeParams, int, const float*, const float*) = decode_merge_kernel<T, kMlaHeadDimV>;
  const int64_t rows = int64_t(p.batch) * p.q_len * p.heads_q;
  Launch l(dim3(unsigned(ceil_div(rows, int64_t(kMergeWarps)))), dim3(32u * kMergeWarps), 0, stream, use_pdl(*dev));
  return launched(l(merge, p, plan.splits, static_cast<const float*>(ws_o), static_cast<const float*>(ws_lse)),
                  "mla_decode (split merge)");
}

}  // namespace decode

template <typename T>
Status launch_mla_decode(const MlaDecodePlan& plan, const DecodeParams& p, void* workspace, cudaStream_t stream) {
  static_assert(kMlaTiles[0].stages == 4 && kMlaTiles[1].stages == 2 && kMlaTileCount == 2,
                "one case per kMlaTiles row");
  switch (plan.stages) {
    case 4:
      return decode::launch_mla_tile<T, 4>(plan, p, workspace, stream);
    case 2:
      return decode::launch_mla_tile<T, 2>(plan, p, workspace, stream);
    default:
      return Status::Invalid("mla_decode: no kernel is built for " + to_string(plan));
  }
}

}  // namespace kernelforge
