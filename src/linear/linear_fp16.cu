// The skinny linear kernels (cp.async with its split-K reduction, TMA) instantiated for __half.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "linear/linear_launch.cuh"

namespace kernelforge {
template Status launch_linear<__half>(const LinearPlan&, const LinearParams&, void*, cudaStream_t);
}  // namespace kernelforge
