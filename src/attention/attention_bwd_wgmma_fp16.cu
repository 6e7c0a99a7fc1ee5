// The wgmma attention backward (its three passes) instantiated for __half.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "attention/attention_bwd_wgmma_launch.cuh"

namespace kernelforge {
template Status launch_attention_bwd_wgmma<__half>(const AttentionPlan&, const AttentionGradParams&, const DeviceInfo&,
                                                   void*, cudaStream_t);
}  // namespace kernelforge
