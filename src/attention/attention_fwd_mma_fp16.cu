// The mma attention kernel and its launcher instantiated for __half: every head dim's tiles
// (kAttnMmaTiles) and the switch over the head dim.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "attention/attention_fwd_mma_launch.cuh"

namespace kernelforge {
template Status launch_attention_fwd_mma_hd<__half, 64>(const AttentionPlan&, const AttentionParams&, cudaStream_t);
template Status launch_attention_fwd_mma_hd<__half, 96>(const AttentionPlan&, const AttentionParams&, cudaStream_t);
template Status launch_attention_fwd_mma_hd<__half, 128>(const AttentionPlan&, const AttentionParams&, cudaStream_t);
template Status launch_attention_fwd_mma_hd<__half, 192>(const AttentionPlan&, const AttentionParams&, cudaStream_t);
template Status launch_attention_fwd_mma_hd<__half, 256>(const AttentionPlan&, const AttentionParams&, cudaStream_t);
template Status launch_attention_fwd_mma<__half>(const AttentionPlan&, const AttentionParams&, cudaStream_t);
}  // namespace kernelforge
