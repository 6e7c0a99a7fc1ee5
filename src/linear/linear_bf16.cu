// The skinny linear kernels (cp.async with its split-K reduction, TMA) instantiated for __nv_bfloat16,
// and linear_tma_built() (both dtypes are built for the same architectures).
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "linear/linear_launch.cuh"

namespace kernelforge {
template Status launch_linear<__nv_bfloat16>(const LinearPlan&, const LinearParams&, void*, cudaStream_t);

bool linear_tma_built() { return kernel_binary_version(linear_tma_kernel<__nv_bfloat16>()) == 90; }
}  // namespace kernelforge
