// The TMA decode attention kernels (every kDecodeTiles kTma row, the split merge fused) instantiated for
// __nv_bfloat16, and decode_tma_built() (both dtypes are built for the same architectures).
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "decode/decode_tma_launch.cuh"

namespace kernelforge {
template Status launch_decode_tma<__nv_bfloat16>(const DecodePlan&, const DecodeParams&, void*, cudaStream_t);

bool decode_tma_built() {
  return kernel_binary_version(decode::tma_kernel<__nv_bfloat16, decode::first_tma_tile()>()) == 90;
}
}  // namespace kernelforge
