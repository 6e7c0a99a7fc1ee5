// The attention backward launcher: one switch over plan.kind. Each kernel's own launcher lives
// beside it (attention_bwd_mma_<dtype>.cu, attention_bwd_wgmma_<dtype>.cu) so the kernels compile in parallel.
// check_bwd_plan has accepted the plan before a launch. Included by attention_bwd_<dtype>.cu.
#pragma once

#include <cuda_runtime.h>

#include <string>

#include "attention/attention_bwd_mma_launch.h"
#include "attention/attention_bwd_wgmma_launch.h"
#include "attention/attention_plan.h"
#include "common/plan_record.h"

namespace kernelforge {

template <typename T>
Status launch_attention_bwd(const AttentionPlan& plan, const AttentionGradParams& p, const DeviceInfo& dev,
                            void* workspace, cudaStream_t stream) {
  record_plan(plan);
  switch (plan.kind) {
    case AttentionKernel::kBwdMma:
      return launch_attention_bwd_mma<T>(plan, p, dev, workspace, stream);
    case AttentionKernel::kBwdWgmma:
      return launch_attention_bwd_wgmma<T>(plan, p, dev, workspace, stream);
    default:
      break;
  }
  return Status::Invalid("attention_backward: no backward kernel for plan " + to_string(plan));
}

}  // namespace kernelforge
