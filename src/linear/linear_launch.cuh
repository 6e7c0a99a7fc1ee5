// The skinny linear launchers, one per LinearKernel: kCpAsync (kLinearTile, then the split-K
// reduction kernel when the plan splits K), kTma (kLinearTmaTile: the tensor maps of w and x, a
// cluster of the K splits) and kGemv (kLinearGemvTile, the M bucket's instantiation). Included by linear_<dtype>.cu.
#pragma once

#include <cuda.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "common/launch.cuh"
#include "common/occupancy.h"
#include "common/tma_map.h"
#include "linear/kernels/linear_gemv.cuh"
#include "linear/kernels/linear_reduce.cuh"
#include "linear/kernels/linear_skinny.cuh"
#include "linear/kernels/linear_skinny_tma.cuh"
#include "linear/linear_config.h"
#include "linear/linear_plan.h"

namespace kernelforge {

template <typename T>
constexpr auto linear_tma_kernel() {
  constexpr LinearTile c = kLinearTmaTile;
  return skinny::linear_skinny_tma_kernel<T, c.block_n, c.block_k, c.warps, c.stages>;
}

template <typename T>
Status launch_linear_cp_async(const LinearPlan& plan, const LinearParams& p, void* workspace, const DeviceInfo& dev,
                              cudaStream_t stream) {
  constexpr LinearTile c = kLinearTile;
  constexpr int64_t smem = linear_smem_bytes(c);
  void (*kernel)(LinearParams, int, float*) = skinny::linear_skinny_kernel<T, c.block_n, c.block_k, c.warps, c.stages>;
  Status st = cuda_status(ensure_smem_limit(kernel, size_t(smem)), "linear",
                          "cudaFuncSetAttribute(MaxDynamicSharedMemorySize)");
  if (!st.ok()) return st;
  float* ws = plan.splits > 1 ? static_cast<float*>(workspace) : nullptr;
  {
    Launch l(dim3(unsigned(ceil_div(p.N, int64_t(c.block_n))), unsigned(plan.splits)), dim3(32u * c.warps),
             size_t(smem), stream, use_pdl(dev));
    st = launched(l(kernel, p, plan.splits, ws), "linear");
    if (!st.ok() || plan.splits == 1) return st;
  }
  void (*reduce)(LinearParams, int, const float*) = skinny::linear_reduce_kernel<T>;
  Launch l(dim3(unsigned(ceil_div(int64_t(p.M) * p.N, int64_t(skinny::kReduceThreads)))), dim3(skinny::kReduceThreads),
           0, stream, use_pdl(dev));
  return launched(l(reduce, p, plan.splits, static_cast<const float*>(ws)), "linear (split-K reduction)");
}

template <typename T>
Status launch_linear_tma(const LinearPlan& plan, const LinearParams& p, const DeviceInfo& dev, cudaStream_t stream) {
  constexpr LinearTile c = kLinearTmaTile;
  constexpr int64_t smem = linear_tma_smem_bytes();
  auto kernel = linear_tma_kernel<T>();
  if (kernel_binary_version(kernel) != 90)
    return Status::NotSupported("linear: the TMA kernel needs an sm_90 device and a build with 90a-real");
  CUtensorMap tw, tx;
  Status st = encode_tensor_map_2d<T>(&tw, p.w, p.K, p.N, p.ldw, c.block_k, c.block_n, CU_TENSOR_MAP_SWIZZLE_128B, "w",
                                      "linear");
  if (!st.ok()) return st;
  st = encode_tensor_map_2d<T>(&tx, p.x, p.K, p.M, p.ldx, c.block_k, 16, CU_TENSOR_MAP_SWIZZLE_128B, "x", "linear");
  if (!st.ok()) return st;
  st = cuda_status(ensure_smem_limit(kernel, size_t(smem)), "linear",
                   "cudaFuncSetAttribute(MaxDynamicSharedMemorySize)");
  if (!st.ok()) return st;
  const int64_t tiles_n = ceil_div(p.N, int64_t(c.block_n));
  Launch l(dim3(unsigned(tiles_n * plan.splits)), dim3(32u * (c.warps + 1)), size_t(smem), stream, use_pdl(dev),
           plan.splits);
  return launched(l(kernel, tw, tx, p, plan.splits), "linear (TMA)");
}

// kGemv: the instantiation for M rows (1, 2, or 4 for 3 and 4), one CTA per kLinearGemvTile.rows columns.
template <typename T>
Status launch_linear_gemv(const LinearParams& p, const DeviceInfo& dev, cudaStream_t stream) {
  constexpr LinearGemvTile c = kLinearGemvTile;
  void (*kernel)(LinearParams) = p.M == 1   ? skinny::linear_gemv_kernel<T, 1, c.rows, c.warps, c.unroll>
                                 : p.M == 2 ? skinny::linear_gemv_kernel<T, 2, c.rows, c.warps, c.unroll>
                                            : skinny::linear_gemv_kernel<T, 4, c.rows, c.warps, c.unroll>;
  Launch l(dim3(unsigned(ceil_div(p.N, int64_t(c.rows)))), dim3(32u * c.warps), 0, stream, use_pdl(dev));
  return launched(l(kernel, p), "linear (GEMV)");
}

template <typename T>
Status launch_linear(const LinearPlan& plan, const LinearParams& p, void* workspace, cudaStream_t stream) {
  int device = 0;
  const DeviceInfo* dev = nullptr;
  Status st = current_device_info(&device, &dev);
  if (!st.ok()) return st;
  switch (plan.kernel) {
    case LinearKernel::kTma:
      return launch_linear_tma<T>(plan, p, *dev, stream);
    case LinearKernel::kGemv:
      return launch_linear_gemv<T>(p, *dev, stream);
    case LinearKernel::kCpAsync:
      break;
  }
  return launch_linear_cp_async<T>(plan, p, workspace, *dev, stream);
}

}  // namespace kernelforge
