// The skinny linear planner's interface (linear_plan.cpp): host code only, unit-tested without a GPU.
// plan_linear picks the K split for the compiled tile; check_linear_plan refuses plans no kernel is
// built for; linear_workspace_bytes sizes the split partial sums.
#pragma once

#include <cstddef>

#include "linear/linear_problem.h"

namespace kernelforge {

struct DeviceInfo;
LinearPlan plan_linear(const LinearParams& p, const DeviceInfo& dev);
Status check_linear_plan(const LinearPlan& plan, const LinearParams& p);
size_t linear_workspace_bytes(const LinearPlan& plan, const LinearParams& p);

}  // namespace kernelforge
