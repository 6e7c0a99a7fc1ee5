// The MLA decode launchers: the kernel the plan names (the mma.sync kernel at the kMlaTiles depth the
// plan names, the sm_90a wgmma kernel or its seesaw schedule), then the split merge (decode_merge.cuh
// at 512 columns) when the plan splits the keys. Included by mla_<dtype>.cu.
#pragma once

#include <cuda.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "attention/attention_tma_map.h"
#include "common/launch.cuh"
#include "common/occupancy.h"
#include "decode/kernels/decode_merge.cuh"
#include "decode/kernels/mla_decode.cuh"
#include "decode/kernels/mla_decode_wgmma.cuh"
#include "decode/kernels/mla_decode_wgmma_seesaw.cuh"
#include "decode/mla_config.h"
#include "decode/mla_plan.h"

namespace kernelforge {

template <typename T>
Status launch_mla_decode(const MlaDecodePlan& plan, const DecodeParams& p, void* workspace, cudaStream_t stream);
template <typename T>
bool mla_wgmma_image();

namespace decode {

// Workspace layout of a split plan: partial outputs [rows][splits][512] float32, then their
// log2-sum-exp [rows][splits] (rows = B * Lq * H), each 256-byte aligned (mla_decode_workspace_bytes).
struct MlaWorkspace {
  float* o = nullptr;
  float* lse = nullptr;
};
inline MlaWorkspace mla_workspace(const MlaDecodePlan& plan, const DecodeParams& p, void* workspace) {
  MlaWorkspace w;
  if (plan.splits > 1) {
    const size_t rows = size_t(p.batch) * p.q_len * p.heads_q * plan.splits;
    w.o = static_cast<float*>(workspace);
    w.lse = reinterpret_cast<float*>(static_cast<char*>(workspace) +
                                     (rows * kMlaHeadDimV * sizeof(float) + 255) / 256 * 256);
  }
  return w;
}

// The split merge after a split plan's kernel (nothing when splits == 1).
template <typename T>
Status launch_mla_merge(const MlaDecodePlan& plan, const DecodeParams& p, const MlaWorkspace& w, const DeviceInfo& dev,
                        cudaStream_t stream) {
  if (plan.splits == 1) return Status::Ok();
  void (*merge)(DecodeParams, int, const float*, const float*) = decode_merge_kernel<T, kMlaHeadDimV>;
  const int64_t rows = int64_t(p.batch) * p.q_len * p.heads_q;
  Launch l(dim3(unsigned(ceil_div(rows, int64_t(kMergeWarps)))), dim3(32u * kMergeWarps), 0, stream, use_pdl(dev));
  return launched(l(merge, p, plan.splits, static_cast<const float*>(w.o), static_cast<const float*>(w.lse)),
                  "mla_decode (split merge)");
}

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
  const MlaWorkspace w = mla_workspace(plan, p, workspace);
  {  // row tiles fastest: the CTAs reading the same keys run side by side and share them through L2
    Launch l(dim3(unsigned(mla_row_tiles(plan, p)), unsigned(plan.splits), unsigned(p.batch)), dim3(32u * kMlaWarps),
             size_t(smem), stream, use_pdl(*dev));
    st = launched(l(kernel, p, plan.splits, w.o, w.lse), "mla_decode");
    if (!st.ok()) return st;
  }
  return launch_mla_merge<T>(plan, p, w, *dev, stream);
}

// The wgmma kernels (both schedules): the cache's TMA map (column, row in page, page, 1) with boxes of
// 64 columns x min(page_size, 64) rows (64 when contiguous), the same grid as the mma.sync kernel.
template <typename T>
Status launch_mla_wgmma(const MlaDecodePlan& plan, const DecodeParams& p, void* workspace, cudaStream_t stream) {
  const bool seesaw = plan.kernel == MlaKernel::kWgmmaSeesaw;
  void (*kernel)(const CUtensorMap, const DecodeParams, int, int, float*, float*) =
      seesaw ? mla_decode_wgmma_seesaw_kernel<T> : mla_decode_wgmma_kernel<T>;
  const size_t smem = size_t(seesaw ? MlaSeesawSmem::kBytes : MlaWgmmaSmem::kBytes);
  if (kernel_binary_version(kernel) != 90)
    return Status::NotSupported("mla_decode: plan " + to_string(plan) +
                                ": the wgmma kernel needs an sm_90 device and a build with 90a-real");
  const bool paged = p.block_table != nullptr;
  if (paged && p.page_size < kMlaWgmmaMinPage)
    return Status::Invalid("mla_decode: plan " + to_string(plan) + ": the wgmma kernel needs pages of at least " +
                           std::to_string(kMlaWgmmaMinPage) + " rows, the cache has " + std::to_string(p.page_size));
  int device = 0;
  const DeviceInfo* dev = nullptr;
  Status st = current_device_info(&device, &dev);
  if (!st.ok()) return st;
  const int box_rows = paged ? std::min(p.page_size, kMlaWgmmaBlockN) : kMlaWgmmaBlockN;
  CUtensorMap tm;
  st = encode_attention_map<T>(&tm, p.k_cache, kMlaHeadDimK, p.page_size, p.pages, 1, p.k_st, p.k_sp, 0, box_rows,
                               "kv_cache", "mla_decode");
  if (!st.ok()) return st;
  st = cuda_status(ensure_smem_limit(kernel, smem), "mla_decode", "cudaFuncSetAttribute(MaxDynamicSharedMemorySize)");
  if (!st.ok()) return st;
  const MlaWorkspace w = mla_workspace(plan, p, workspace);
  {
    Launch l(dim3(unsigned(mla_row_tiles(plan, p)), unsigned(plan.splits), unsigned(p.batch)),
             dim3(32u * kMlaWgmmaWarps), smem, stream, use_pdl(*dev));
    st = launched(l(kernel, tm, p, box_rows, plan.splits, w.o, w.lse), "mla_decode");
    if (!st.ok()) return st;
  }
  return launch_mla_merge<T>(plan, p, w, *dev, stream);
}

}  // namespace decode

template <typename T>
Status launch_mla_decode(const MlaDecodePlan& plan, const DecodeParams& p, void* workspace, cudaStream_t stream) {
  static_assert(kMlaTiles[0].stages == 4 && kMlaTiles[1].stages == 2 && kMlaTileCount == 2,
                "one case per kMlaTiles row");
  if (plan.kernel == MlaKernel::kWgmma || plan.kernel == MlaKernel::kWgmmaSeesaw)
    return decode::launch_mla_wgmma<T>(plan, p, workspace, stream);
  switch (plan.stages) {
    case 4:
      return decode::launch_mla_tile<T, 4>(plan, p, workspace, stream);
    case 2:
      return decode::launch_mla_tile<T, 2>(plan, p, workspace, stream);
    default:
      return Status::Invalid("mla_decode: no kernel is built for " + to_string(plan));
  }
}

// Whether this build holds the wgmma kernels' sm_90a images (both schedules, one TU) for the current
// device (binary version 90).
template <typename T>
bool mla_wgmma_image() {
  return kernel_binary_version(decode::mla_decode_wgmma_kernel<T>) == 90 &&
         kernel_binary_version(decode::mla_decode_wgmma_seesaw_kernel<T>) == 90;
}

}  // namespace kernelforge
