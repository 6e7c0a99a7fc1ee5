// The mma attention kernel's launchers by head dim (attention_fwd_mma_launch.cuh) and
// launch_attention_fwd_mma, one switch over plan.head_dim_qk to them; both instantiated per dtype in
// attention_fwd_mma_<dtype>.cu.
#pragma once

#include <cuda_runtime_api.h>

#include "attention/attention_plan.h"

namespace kernelforge {

// Runs `plan` (kind kMma, head_dim_qk == kDqk) with the compiled tile it names.
template <typename T, int kDqk>
Status launch_attention_fwd_mma_hd(const AttentionPlan& plan, const AttentionParams& p, cudaStream_t stream);

template <typename T>
Status launch_attention_fwd_mma(const AttentionPlan& plan, const AttentionParams& p, cudaStream_t stream) {
  switch (plan.head_dim_qk) {
    case 64:
      return launch_attention_fwd_mma_hd<T, 64>(plan, p, stream);
    case 96:
      return launch_attention_fwd_mma_hd<T, 96>(plan, p, stream);
    case 128:
      return launch_attention_fwd_mma_hd<T, 128>(plan, p, stream);
    case 192:
      return launch_attention_fwd_mma_hd<T, 192>(plan, p, stream);
    case 256:
      return launch_attention_fwd_mma_hd<T, 256>(plan, p, stream);
  }
  return Status::Invalid("attention_forward: no mma kernel is built for " + to_string(plan));
}

}  // namespace kernelforge
