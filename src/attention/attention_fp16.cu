// The attention launcher instantiated for __half (one file per dtype).
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "attention/attention_launch.cuh"

namespace kernelforge {
template Status launch_attention_fwd<__half>(const AttentionPlan&, const AttentionParams&, const DeviceInfo&, void*,
                                             cudaStream_t);
}  // namespace kernelforge
