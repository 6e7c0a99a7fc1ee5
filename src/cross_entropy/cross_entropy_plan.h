// The cross-entropy planner: CeProblem -> CePlan, pure host code (no CUDA code: unit-tested on
// machines without a GPU).
//
// Forward: a fixed sequence of three kernels (kernels/ce_fwd_partial.cuh -> ce_fwd_finalize.cuh ->
// ce_reduce.cuh): one 256-thread CTA per (row, segment of the row) writes the segment's (max, sum of
// exponentials, sum of logits), one thread per row combines them into the row's loss, one block sums
// the row losses in a fixed order. Backward: one kernel (kernels/ce_bwd.cuh), one CTA per (row, tile).
// The plan picks how a row is read: 16-byte vectors (aligned rows), a scalar head up to the first
// 16-byte boundary then 16-byte vectors (misaligned rows, e.g. an odd vocabulary), or one element per
// access; and the grid.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/device.h"
#include "cross_entropy/cross_entropy_problem.h"
#include "kernelforge/status.h"

namespace kernelforge {

constexpr int kCeThreads = 256;  // threads of the partial and backward CTAs
constexpr int kCeIters = 4;      // 16-byte vectors in flight per thread in the forward: 64 B x 256
                                 // threads x 4 CTAs = 64 KB per SM, ~3x what hides DRAM latency
constexpr int kCeSegVecs = 8;    // 16-byte vectors per thread per forward segment (2 chunks of kCeIters)
constexpr int kCeBwdIters = 4;   // vectors per thread in the backward: a tile of 256 x 4 x vec elements

// Logits per forward segment: kCeThreads * kCeSegVecs 16-byte vectors (16384 bf16/fp16, 8192 fp32),
// on every read path (the one-element path reads the same segments element by element).
constexpr int ce_segment_elems(int elem_bytes) { return kCeThreads * kCeSegVecs * (16 / elem_bytes); }

enum class CeKernel : int {
  kForward = 0,   // ce_fwd_partial -> ce_fwd_finalize -> ce_reduce
  kBackward = 1,  // ce_bwd
};

struct CePlan {
  CeKernel kind = CeKernel::kForward;
  int vec = 1;                  // elements per access: 16 / sizeof(T) or 1
  bool scalar_head = false;     // each row starts with a scalar head up to its first 16-byte boundary
  int segments = 1;             // forward: segments per row; backward: tiles per row
  int64_t grid = 0;             // CTAs of the partial (forward) or backward kernel: rows * segments
  int64_t finalize_blocks = 0;  // forward: blocks of kCeFinalizeBlock rows of the finalize kernel
};

std::string to_string(const CePlan& plan);  // e.g. "ce_fwd vec=8 head=0 segments=8 grid=131072 finalize=64"

struct CeProblem {
  bool backward = false;
  int elem_bytes = 2;  // sizeof(T) of the logits
  int64_t rows = 0;
  int64_t vocab = 0;
  bool aligned = false;  // every row of the logits (and of dlogits) starts 16-byte aligned
  bool head_ok = false;  // a scalar head brings every row to a 16-byte boundary (the backward: of
                         // both tensors, which then share their misalignment)
};

CeProblem make_ce_problem(const CeParams& p, bool backward, int elem_bytes);

// The plan production runs. The forward runs for rows == 0 too (the reduction writes loss and valid).
CePlan plan_cross_entropy(const CeProblem& problem, const DeviceInfo& dev);

// Every plan that can run the problem: each read path the layout allows (16-byte vectors, scalar
// head + vectors, one element). Empty for a backward without rows.
std::vector<CePlan> candidate_plans(const CeProblem& problem, const DeviceInfo& dev);

// Ok when `plan` can run `problem` on `dev`; otherwise an error naming what does not fit.
Status check_plan(const CePlan& plan, const CeProblem& problem, const DeviceInfo& dev);

// Test-only entries: run one call with a given plan (validate, check the device and the workspace,
// check_plan, launch), and list a call's candidate plans on the current device.
Status launch_with_plan(const CePlan& plan, const CeCall& call, void* workspace, size_t workspace_bytes,
                        cudaStream_t stream);
Status ce_candidate_plans(const CeCall& call, std::vector<CePlan>* plans);

// The launcher (cross_entropy_launch.cuh), one instantiation per dtype (cross_entropy_<dtype>.cu).
// `workspace`: the forward's partials (ce_workspace_bytes); unused by the backward.
template <typename T>
Status launch_cross_entropy(const CePlan& plan, const CeParams& p, const DeviceInfo& dev, void* workspace,
                            cudaStream_t stream);

}  // namespace kernelforge
