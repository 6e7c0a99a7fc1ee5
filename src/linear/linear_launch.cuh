// The skinny linear launcher: the compiled tile (kLinearTile), then the split-K reduction when the
// plan splits K. Included by linear_<dtype>.cu.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "common/launch.cuh"
#include "common/occupancy.h"
#include "linear/kernels/linear_reduce.cuh"
#include "linear/kernels/linear_skinny.cuh"
#include "linear/linear_config.h"
#include "linear/linear_plan.h"

namespace kernelforge {

template <typename T>
Status launch_linear(const LinearPlan& plan, const LinearParams& p, void* workspace, cudaStream_t stream) {
  constexpr LinearTile c = kLinearTile;
  constexpr int64_t smem = linear_smem_bytes(c);
  void (*kernel)(LinearParams, int, float*) = skinny::linear_skinny_kernel<T, c.block_n, c.block_k, c.warps, c.stages>;
  int device = 0;
  const DeviceInfo* dev = nullptr;
  Status st = current_device_info(&device, &dev);
  if (!st.ok()) return st;
  st = cuda_status(ensure_smem_limit(kernel, size_t(smem)), "linear",
                   "cudaFuncSetAttribute(MaxDynamicSharedMemorySize)");
  if (!st.ok()) return st;
  float* ws = plan.splits > 1 ? static_cast<float*>(workspace) : nullptr;
  {
    Launch l(dim3(unsigned(ceil_div(p.N, int64_t(c.block_n))), unsigned(plan.splits)), dim3(32u * c.warps),
             size_t(smem), stream, use_pdl(*dev));
    st = launched(l(kernel, p, plan.splits, ws), "linear");
    if (!st.ok() || plan.splits == 1) return st;
  }
  void (*reduce)(LinearParams, int, const float*) = skinny::linear_reduce_kernel<T>;
  Launch l(dim3(unsigned(ceil_div(int64_t(p.M) * p.N, int64_t(skinny::kReduceThreads)))), dim3(skinny::kReduceThreads),
           0, stream, use_pdl(*dev));
  return launched(l(reduce, p, plan.splits, static_cast<const float*>(ws)), "linear (split-K reduction)");
}

}  // namespace kernelforge
