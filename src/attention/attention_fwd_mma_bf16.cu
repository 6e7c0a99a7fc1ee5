// The mma attention kernel and its launcher instantiated for __nv_bfloat16: every head dim's tiles
// (kAttnMmaTiles) and the switch over the head dim.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "attention/attention_fwd_mma_launch.cuh"

namespace kernelforge {
template Status launch_attention_fwd_mma_hd<__nv_bfloat16, 64>(const AttentionPlan&, const AttentionParams&,
                                                               cudaStream_t);
template Status launch_attention_fwd_mma_hd<__nv_bfloat16, 96>(const AttentionPlan&, const AttentionParams&,
                                                               cudaStream_t);
template Status launch_attention_fwd_mma_hd<__nv_bfloat16, 128>(const AttentionPlan&, const AttentionParams&,
                                                                cudaStream_t);
template Status launch_attention_fwd_mma_hd<__nv_bfloat16, 192>(const AttentionPlan&, const AttentionParams&,
                                                                cudaStream_t);
template Status launch_attention_fwd_mma_hd<__nv_bfloat16, 256>(const AttentionPlan&, const AttentionParams&,
                                                                cudaStream_t);
template Status launch_attention_fwd_mma<__nv_bfloat16>(const AttentionPlan&, const AttentionParams&, cudaStream_t);
}  // namespace kernelforge
