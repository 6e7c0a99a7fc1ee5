// The head-group decode attention kernels (every kDecodeTiles kHeadGroup row, the split merge fused)
// instantiated for __half.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "decode/decode_heads_launch.cuh"

namespace kernelforge {
template Status launch_decode_heads<__half>(const DecodePlan&, const DecodeParams&, void*, cudaStream_t);
}  // namespace kernelforge
