// The wgmma attention backward's launcher (attention_bwd_wgmma_launch.cuh): its three passes
// (preprocess, main kernel, dq conversion) for a plan of kind kBwdWgmma; instantiated per dtype in
// attention_bwd_wgmma_<dtype>.cu.
#pragma once

#include <cuda_runtime_api.h>

#include "attention/attention_plan.h"

namespace kernelforge {

// Runs `plan` (kind kBwdWgmma, head dims 64/64, 128/128, 256/256 or 192/128): pass 1, the main kernel, pass 3.
// `workspace`: at least bwd_workspace_bytes(plan, problem) bytes, 256-byte aligned.
template <typename T>
Status launch_attention_bwd_wgmma(const AttentionPlan& plan, const AttentionGradParams& p, const DeviceInfo& dev,
                                  void* workspace, cudaStream_t stream);

}  // namespace kernelforge
