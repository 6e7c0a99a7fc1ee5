// SCAFFOLD (owner: the backward kernel): the backward launcher, one switch over plan.kind.
#pragma once

#include <cuda_runtime.h>

#include "attention/attention_plan.h"
#include "common/plan_record.h"

namespace kernelforge {

template <typename T>
Status launch_attention_bwd(const AttentionPlan& plan, const AttentionGradParams& p, const DeviceInfo& dev,
                            void* workspace, cudaStream_t stream) {
  (void)p;
  (void)dev;
  (void)workspace;
  (void)stream;
  record_plan(plan);
  return Status::NotSupported("attention_backward: no backward kernel is built yet");
}

}  // namespace kernelforge
