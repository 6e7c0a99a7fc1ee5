// SCAFFOLD (replaced by the mma kernel's launcher before landing).
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "attention/attention_plan.h"

namespace kernelforge {
template <typename T>
Status launch_attention_fwd_mma(const AttentionPlan& plan, const AttentionParams&, cudaStream_t) {
  return Status::NotSupported("attention_forward: " + to_string(plan) + " is not built");
}
template Status launch_attention_fwd_mma<__nv_bfloat16>(const AttentionPlan&, const AttentionParams&, cudaStream_t);
template Status launch_attention_fwd_mma<__half>(const AttentionPlan&, const AttentionParams&, cudaStream_t);
}  // namespace kernelforge
