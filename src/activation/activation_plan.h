// The activation planner: ActProblem -> ActPlan, pure host code over the small tables in
// activation_plan.cpp (no CUDA code: unit-tested on machines without a GPU).
//
// Every activation call is y = act(a) * b (or act(a)) over rows of n columns, forward or backward
// (activation_problem.h). Two kernels run them (kernels/act_fwd.cuh, kernels/act_bwd.cuh), each on a
// 2-D grid: block (tx, ty) = tx threads along a row, ty rows; grid (column chunks, row groups). A
// thread handles `vecs` vectors of `vec` elements of its row. The plan picks the vector width (the
// widest the alignment allows), the vectors per thread (a table per kernel and width) and the grid.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "activation/activation_problem.h"
#include "common/device.h"
#include "kernelforge/status.h"

namespace kernelforge {

constexpr int kActThreads = 256;     // threads per block (tx * ty), the kernels' __launch_bounds__
constexpr int kActMaxGridY = 65535;  // CUDA's limit for gridDim.y: more row groups loop over rows

enum class ActKernel : int {
  kFwd = 0,  // act_fwd: y = act(a) * b
  kBwd = 1,  // act_bwd: da = g * b * act'(a), db = g * act(a)
};

struct ActPlan {
  ActKernel kind = ActKernel::kFwd;
  int vec = 1;     // elements per vector (16 / 4 bytes or one element)
  int vecs = 1;    // vectors per thread per input, all loaded before the first use
  int tx = 32;     // threads along a row (a power of two, 32..256)
  int ty = 1;      // rows per block
  int grid_x = 1;  // column chunks of tx * vecs vectors
  int grid_y = 1;  // row groups of ty rows (at most kActMaxGridY; more rows loop)
};

std::string to_string(const ActPlan& plan);  // e.g. "act_fwd vec=8 vecs=1 block=128x2 grid=1x8192"

struct ActProblem {
  bool backward = false;
  int elem_bytes = 2;  // sizeof(T)
  int64_t rows = 0;
  int64_t n = 0;  // columns of y (I for the gated ops)
  // Widest access (bytes) every base pointer and (with more than one row) every row stride allows:
  // 16, 4 (16-bit types only) or elem_bytes.
  int align_bytes = 16;
};

// The problem of a validated call (pointers and strides of `p` give the alignment).
ActProblem make_act_problem(const ActParams& p, bool backward, int elem_bytes);

// The plan production runs. Requires rows > 0 and n > 0 (the entries launch nothing otherwise).
ActPlan plan_activation(const ActProblem& problem, const DeviceInfo& dev);

// Every plan that can run the problem: each vector width the alignment allows with each number of
// vectors per thread the kernels are built for (kActBuilds in activation_plan.cpp). Empty for an
// empty problem.
std::vector<ActPlan> candidate_plans(const ActProblem& problem, const DeviceInfo& dev);

// Ok when `plan` can run `problem` on `dev`; otherwise an error naming what does not fit.
Status check_plan(const ActPlan& plan, const ActProblem& problem, const DeviceInfo& dev);

// Test-only entries: run one call with a given plan (validate, check the device, check_plan, launch),
// and list a call's candidate plans on the current device.
Status launch_with_plan(const ActPlan& plan, const ActCall& call, cudaStream_t stream);
Status act_candidate_plans(const ActCall& call, std::vector<ActPlan>* plans);

// The launcher (activation_launch.cuh), one instantiation per dtype (activation_<dtype>.cu).
template <typename T>
Status launch_activation(const ActPlan& plan, ActFn fn, bool gated, const ActParams& p, const DeviceInfo& dev,
                         cudaStream_t stream);

}  // namespace kernelforge
