// The MLA decode kernels (every kMlaTiles row of the mma.sync kernel, the sm_90a wgmma kernel) and the
// 512-column split merge instantiated for __half.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "decode/mla_launch.cuh"

namespace kernelforge {
template Status launch_mla_decode<__half>(const MlaDecodePlan&, const DecodeParams&, void*, cudaStream_t);
template bool mla_wgmma_image<__half>();
}  // namespace kernelforge
