// The cp.async decode attention kernels (every kDecodeTiles kCpAsync row, the split merge fused) and the
// launcher's switch to the TMA ones (decode_tma_<dtype>.cu), instantiated for __half.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "decode/decode_launch.cuh"

namespace kernelforge {
template Status launch_decode_attention<__half>(const DecodePlan&, const DecodeParams&, void*, cudaStream_t);
}  // namespace kernelforge
