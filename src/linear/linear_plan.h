// The skinny linear planner's interface (linear_plan.cpp): host code only, unit-tested without a GPU.
// plan_linear picks the kernel and the K split for the compiled tiles; linear_candidate_plans lists
// every kernel that can run the call (tests and dev/ sweeps run each); check_linear_plan refuses
// plans no kernel is built for; linear_workspace_bytes sizes the split partial sums.
#pragma once

#include <cstddef>
#include <vector>

#include "linear/linear_problem.h"

namespace kernelforge {

struct DeviceInfo;
// `tma_built`: the build holds an sm_90a image of the TMA kernel (linear_tma_built()).
LinearPlan plan_linear(const LinearParams& p, const DeviceInfo& dev, bool tma_built);
std::vector<LinearPlan> linear_candidate_plans(const LinearParams& p, const DeviceInfo& dev, bool tma_built);
Status check_linear_plan(const LinearPlan& plan, const LinearParams& p, const DeviceInfo& dev);
size_t linear_workspace_bytes(const LinearPlan& plan, const LinearParams& p);

// Whether the current device runs an image of the TMA kernel (an sm_90 device and a 90a-real build);
// defined with the kernels (linear_bf16.cu), needs the CUDA runtime.
bool linear_tma_built();

}  // namespace kernelforge
