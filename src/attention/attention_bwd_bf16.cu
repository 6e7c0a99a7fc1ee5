// The attention backward launcher instantiated for __nv_bfloat16 (one file per dtype).
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "attention/attention_bwd_launch.cuh"

namespace kernelforge {
template Status launch_attention_bwd<__nv_bfloat16>(const AttentionPlan&, const AttentionGradParams&, const DeviceInfo&,
                                                    void*, cudaStream_t);
}  // namespace kernelforge
