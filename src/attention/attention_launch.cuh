// The attention launcher: one switch over plan.kind. Each kernel's own launcher (tile shapes from
// the plan, grid, shared memory) lives beside its kernel in attention_fwd_<kernel>_<dtype>.cu so the
// kernels compile in parallel. check_plan has accepted the plan before a launch.
// Included by attention_<dtype>.cu.
#pragma once

#include <cuda_runtime.h>

#include <string>

#include "attention/attention_plan.h"
#include "common/plan_record.h"

namespace kernelforge {

template <typename T>
Status launch_attention_fwd(const AttentionPlan& plan, const AttentionParams& p, const DeviceInfo& dev, void* workspace,
                            cudaStream_t stream) {
  (void)dev;
  (void)workspace;  // no plan splits over keys yet
  record_plan(plan);
  switch (plan.kind) {
    case AttentionKernel::kMma:
      return launch_attention_fwd_mma<T>(plan, p, stream);
    case AttentionKernel::kWgmma:
      return launch_attention_fwd_wgmma<T>(plan, p, stream);
    case AttentionKernel::kBwdMma:
    case AttentionKernel::kBwdWgmma:
      break;  // a backward plan (launch_attention_bwd)
  }
  return Status::Invalid("attention_forward: unknown kernel in plan " + to_string(plan));
}

}  // namespace kernelforge
