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
// `tma_built`: the build holds an sm_90a image of the TMA kernel (linear_tma_built()). `gemv`: calls of
// M <= kLinearGemvPlanRows rows that meet LinearParams::gemv take the GEMV kernel.
LinearPlan plan_linear(const LinearParams& p, const DeviceInfo& dev, bool tma_built, bool gemv = false);
// linear_plan / linear pass gemv = kLinearGemvByDefault (KF_LINEAR_GEMV=0 or 1 overrides it for the
// process, read once).
inline constexpr bool kLinearGemvByDefault = true;
// The GEMV kernel runs M <= 4, the plan gives it M = 1. H200, bf16, L2 flushed: M = 1, 4096 x 4096
// 14.8 us against the TMA kernel's 21.3 and cuBLAS's 19.6; M = 4, 4096 x 4096 22.2 us against 21.9
// and 18.5 (4 FMAs a weight element: the CUDA cores, not the copies, set its pace).
inline constexpr int kLinearGemvPlanRows = 1;
std::vector<LinearPlan> linear_candidate_plans(const LinearParams& p, const DeviceInfo& dev, bool tma_built);
Status check_linear_plan(const LinearPlan& plan, const LinearParams& p, const DeviceInfo& dev);
size_t linear_workspace_bytes(const LinearPlan& plan, const LinearParams& p);

// Whether the current device runs an image of the TMA kernel (an sm_90 device and a 90a-real build);
// defined with the kernels (linear_bf16.cu), needs the CUDA runtime.
bool linear_tma_built();

}  // namespace kernelforge
