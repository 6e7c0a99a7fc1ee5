// The GEMM family's own kernels (K = 0, N = 0 row sums) instantiated for float.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "gemm/gemm_launch.cuh"

namespace kernelforge {
template Status launch_gemm_fill<float>(const GemmParams&, GemmActivation, const DeviceInfo&, cudaStream_t);
template Status launch_gemm_row_sum<float>(const GemmParams&, const DeviceInfo&, cudaStream_t);
}  // namespace kernelforge
