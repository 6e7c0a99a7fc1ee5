// The dropout planner: DropProblem -> DropPlan, pure host code over the small table in
// dropout_plan.cpp (no CUDA code: unit-tested on machines without a GPU).
//
// Every call is one flat elementwise pass over numel elements (dropout_problem.h). Two kernels run
// it: kVec (kernels/dropout_vec.cuh) moves 16-byte vectors of kVec = 16 / sizeof(T) elements (a
// Philox call per 8 elements: 16 random bits each) when every pointer is 16-byte aligned (and the
// mask kVec-byte aligned); kScalar (kernels/dropout_scalar.cuh) moves one element per access and
// takes any alignment. A thread handles `unroll` items (vectors, or Philox groups of 8 elements) per
// pass of a grid-stride loop; the grid covers the problem in one pass unless the plan caps it.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/device.h"
#include "dropout/dropout_problem.h"
#include "kernelforge/status.h"

namespace kernelforge {

constexpr int kDropThreads = 256;  // threads per block, the kernels' __launch_bounds__

enum class DropKernel : int {
  kVec = 0,     // dropout_vec: 16-byte vectors, the row's last partial vector element by element
  kScalar = 1,  // dropout_scalar: groups of 4 elements, element accesses (any alignment)
};

struct DropPlan {
  DropKernel kind = DropKernel::kVec;
  int vec = 8;     // elements per item: 16 / sizeof(T) (kVec) or 8 (kScalar, one Philox group)
  int unroll = 2;  // items per thread per pass, all loaded before the first use
  int grid = 1;    // blocks of kDropThreads threads; fewer than the items need: the grid strides
};

std::string to_string(const DropPlan& plan);  // e.g. "dropout_vec vec=8 unroll=2 grid=16384"

struct DropProblem {
  int elem_bytes = 2;  // sizeof(T)
  int64_t numel = 0;
  bool vec_ok = true;  // every pointer allows 16-byte vectors (the mask kVec-byte ones)
};

// The problem of a validated call (its pointers give the alignment).
DropProblem make_drop_problem(const DropParams& p, int elem_bytes);

// The plan production runs. Requires numel > 0 (the entries launch nothing otherwise).
DropPlan plan_dropout(const DropProblem& problem, const DeviceInfo& dev);

// Every plan that can run the problem: each kernel the alignment allows with each unroll it is built
// for (kDropBuilds in dropout_plan.cpp), one grid that covers the problem and two that take the
// grid-stride loop: one resident wave (sm_count x max_threads_per_sm / 256 blocks) and one block per
// SM. Empty for an empty problem.
std::vector<DropPlan> candidate_plans(const DropProblem& problem, const DeviceInfo& dev);

// Ok when `plan` can run `problem`; otherwise an error naming what does not fit.
Status check_plan(const DropPlan& plan, const DropProblem& problem, const DeviceInfo& dev);

// Test-only entries: run one call with a given plan (validate, check the device, check_plan, launch),
// and list a call's candidate plans on the current device.
Status launch_with_plan(const DropPlan& plan, const DropCall& call, cudaStream_t stream);
Status drop_candidate_plans(const DropCall& call, std::vector<DropPlan>* plans);

// The launcher (dropout_launch.cuh), one instantiation per dtype (dropout_<dtype>.cu).
template <typename T>
Status launch_dropout(const DropPlan& plan, const DropParams& p, const DeviceInfo& dev, cudaStream_t stream);

}  // namespace kernelforge
