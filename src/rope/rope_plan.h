// The RoPE planner: RopeProblem -> RopePlan, pure host code over the small tables in rope_plan.cpp
// (no CUDA code: unit-tested on machines without a GPU).
//
// A call rotates every head (q's, then k's) of every token (b, s). The work of one head is `units`
// work units: `units_rot` rotation units (kVec pairs each) and the passthrough vectors of columns
// R..D-1 (none when every tensor is rotated in place). Two kernels run it:
//   token (kernels/rope_token.cuh): block (units, head slots, tokens), a thread walks several heads
//     of a token, loading a unit's cos/sin once; the grid loops over tokens. Prefill and training.
//   flat (kernels/rope_flat.cuh): block per (token, group of heads), a thread per (unit, head), every
//     load issued before the first use: one memory round trip. Decode steps.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/device.h"
#include "kernelforge/status.h"
#include "rope/rope_problem.h"

namespace kernelforge {

constexpr int kRopeThreads = 256;  // threads per block at most: the kernels' __launch_bounds__

enum class RopeKernel : int {
  kToken = 0,  // rope_token: grid over tokens, a thread takes several heads of a token
  kFlat = 1,   // rope_flat: a block per (token, head group), a thread per (unit, head)
};

struct RopePlan {
  RopeKernel kind = RopeKernel::kToken;
  int vec = 1;        // elements per access: 16 / sizeof(T) or 1
  int units_rot = 0;  // rotation units of one head
  int units = 0;      // rotation + passthrough units of one head
  int block_x = 1;    // threads over a head's units
  int block_y = 1;    // token: head slots (a thread takes heads y, y + block_y, ...); flat: heads per group
  int block_z = 1;    // token: tokens per block; flat: 1
  int grid_x = 1;     // token: blocks (more tokens loop); flat: tokens
  int grid_y = 1;     // token: 1; flat: head groups
};

std::string to_string(const RopePlan& plan);  // e.g. "rope_token vec=8 units=8+0 block=8x5x6 grid=2731x1"

struct RopeProblem {
  int elem_bytes = 2;  // sizeof(T) of q / k
  int64_t tokens = 0;  // B * S
  int heads = 0;       // Hq + Hk
  int head_dim = 0;    // D
  int rot_dim = 0;     // R
  bool interleaved = false;
  bool all_inplace = false;  // every tensor rotated in place: no passthrough units
  bool vec_ok = false;       // 16-byte vectors fit every pointer, stride and the pairing
};

RopeProblem make_rope_problem(const RopeParams& p, int elem_bytes);

// The plan production runs. Requires tokens > 0 and heads > 0 (the entry launches nothing otherwise).
RopePlan plan_rope(const RopeProblem& problem, const DeviceInfo& dev);

// Every plan that can run the problem: both kernels (flat while its grid fits), the token kernel at
// one head per thread and at the prefill heads per thread, each at every vector width that fits.
std::vector<RopePlan> candidate_plans(const RopeProblem& problem, const DeviceInfo& dev);

// Ok when `plan` can run `problem` on `dev`; otherwise an error naming what does not fit.
Status check_plan(const RopePlan& plan, const RopeProblem& problem, const DeviceInfo& dev);

// Test-only entries: run one call with a given plan (validate, check the device, check_plan, launch),
// and list a call's candidate plans on the current device.
Status launch_with_plan(const RopePlan& plan, const RopeCall& call, cudaStream_t stream);
Status rope_candidate_plans(const RopeCall& call, std::vector<RopePlan>* plans);

// The launcher (rope_launch.cuh), one instantiation per q/k dtype (rope_<dtype>.cu); cs_float: cos/sin
// are float32 (otherwise T's dtype).
template <typename T>
Status launch_rope(const RopePlan& plan, const RopeParams& p, bool cs_float, const DeviceInfo& dev,
                   cudaStream_t stream);

}  // namespace kernelforge
