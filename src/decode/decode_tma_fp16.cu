// The TMA decode attention kernels (every kDecodeTiles kTma row, the split merge fused) instantiated for
// __half.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "decode/decode_tma_launch.cuh"

namespace kernelforge {
template Status launch_decode_tma<__half>(const DecodePlan&, const DecodeParams&, void*, cudaStream_t);
}  // namespace kernelforge
