// The GEMM family's own kernels (the edge cases cuBLASLt does not take), launched for one dtype.
// Included by gemm_<dtype>.cu.
#pragma once

#include <cuda_runtime.h>

#include "common/device.h"
#include "common/launch.cuh"
#include "common/math.h"
#include "gemm/gemm_problem.h"
#include "gemm/kernels/gemm_fill.cuh"
#include "gemm/kernels/gemm_row_sum.cuh"

namespace kernelforge {

// K = 0: out = act(bias or 0), aux = bias or 0, a_sum = 0.
template <typename T>
Status launch_gemm_fill(const GemmParams& p, GemmActivation act, const DeviceInfo& dev, cudaStream_t stream) {
  const int64_t work = p.M * p.N > p.M ? p.M * p.N : p.M;
  const unsigned blocks = unsigned(ceil_div(work, int64_t(256)) < 4096 ? ceil_div(work, int64_t(256)) : 4096);
  Launch launch(dim3(blocks > 0 ? blocks : 1), dim3(256), 0, stream, use_pdl(dev));
  return launched(launch(gemm_fill<T>, p, act), "gemm");
}

// N = 0 with a_sum: the row sums of a alone.
template <typename T>
Status launch_gemm_row_sum(const GemmParams& p, const DeviceInfo& dev, cudaStream_t stream) {
  const int64_t warps = p.M;
  const unsigned blocks = unsigned(ceil_div(warps, int64_t(8)) < 4096 ? ceil_div(warps, int64_t(8)) : 4096);
  Launch launch(dim3(blocks > 0 ? blocks : 1), dim3(256), 0, stream, use_pdl(dev));
  return launched(launch(gemm_row_sum<T>, p), "gemm");
}

}  // namespace kernelforge
