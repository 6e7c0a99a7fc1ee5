// SCAFFOLD (replaced by the wgmma kernel's launcher and table before landing).
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "attention/attention_plan.h"

namespace kernelforge {
template <typename T>
Status launch_attention_fwd_wgmma(const AttentionPlan& plan, const AttentionParams&, cudaStream_t) {
  return Status::NotSupported("attention_forward: " + to_string(plan) + " is not built");
}
template Status launch_attention_fwd_wgmma<__nv_bfloat16>(const AttentionPlan&, const AttentionParams&, cudaStream_t);
template Status launch_attention_fwd_wgmma<__half>(const AttentionPlan&, const AttentionParams&, cudaStream_t);

std::vector<AttentionPlan> wgmma_plans(const AttentionProblem&, const DeviceInfo&) { return {}; }
Status check_wgmma_plan(const AttentionPlan& plan, const AttentionProblem&, const DeviceInfo&) {
  return Status::NotSupported("attention_forward: " + to_string(plan) + " is not built");
}
}  // namespace kernelforge
