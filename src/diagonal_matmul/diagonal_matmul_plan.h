// The diagonal_matmul planner: DmProblem -> DmPlan, pure host code over the small tables in
// diagonal_matmul_plan.cpp (no CUDA code: unit-tested on machines without a GPU).
//
// Three kernels (kernels/): dm_fwd (y = a·b; also the backward's db when da is not wanted: db = a·dy),
// dm_bwd (db = a·dy and the row dot products Σ dy·b, one team of threads per row) and dm_reduce (da of a
// broadcast a: the float32 row sums of the B batches added in a fixed order). Every access to a row
// tensor is a vector of `vec` elements, except a scalar head (the elements before the first
// vec-aligned column of the row: rows of odd length keep 16-byte vectors when all tensors share
// their misalignment) and a scalar tail.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/device.h"
#include "diagonal_matmul/diagonal_matmul_problem.h"
#include "kernelforge/status.h"

namespace kernelforge {

constexpr int kDmThreads = 256;                         // most threads per block, the kernels' __launch_bounds__
constexpr int kDmMaxGridY = 65535;                      // CUDA's limit for gridDim.y: dm_fwd loops over more row groups
constexpr int kDmMaxGrid = 1 << 20;                     // dm_bwd / dm_reduce blocks at most (they loop over more rows)
constexpr int kDmReduceRowsPerBlock = kDmThreads / 32;  // dm_reduce: one warp per row of a

enum class DmKernel : int {
  kFwd = 0,  // dm_fwd: y = T(a · b)
  kBwd = 1,  // dm_bwd: db = T(a · dy), da = T(Σ dy · b) (or float32 row sums + dm_reduce)
};

struct DmPlan {
  DmKernel kind = DmKernel::kFwd;
  int vec = 1;          // elements per vector (16 / 4 bytes or one element)
  int vecs = 1;         // vectors per thread per input and pass, all loaded before the first use
  int tx = 32;          // threads along a row (a power of two, 1..256)
  int ty = 1;           // rows per block (tx · ty a multiple of 32, at most 256)
  int grid_x = 1;       // dm_fwd: column chunks of tx · vecs vectors; dm_bwd: row groups (0: no rows)
  int grid_y = 1;       // dm_fwd: row groups of ty rows (at most kDmMaxGridY; more rows loop)
  bool db = false;      // dm_bwd writes db
  int reduce_grid = 0;  // dm_reduce blocks after dm_bwd (0: da written by dm_bwd itself, or not wanted)
};

std::string to_string(const DmPlan& plan);  // e.g. "dm_bwd vec=8 vecs=2 block=256x1 grid=16384 db"

struct DmProblem {
  bool backward = false;  // dm_bwd (a call with da); a backward with db only is a forward on dy
  bool db = false;        // backward: db wanted
  bool reduce = false;    // backward: da of a broadcast a (row sums + dm_reduce)
  int elem_bytes = 2;     // sizeof(T)
  int64_t rows = 0;
  int64_t n = 0;
  int64_t a_rows = 0;  // rows of a (dm_reduce's outputs)
  // Widest access (bytes: 16, 4 (16-bit types only) or elem_bytes) at which every row tensor the
  // kernel touches shares its misalignment with the others (base pointers, and with more than one
  // row the row strides, differ by multiples of it): one scalar head per row then aligns them all.
  int align_bytes = 16;
};

// The problem of a validated call (pointers and strides of `p` give the alignment). `backward`: the
// dm_bwd form (da wanted); a db-only backward passes the forward form of its params (b = dy, y = db).
DmProblem make_dm_problem(const DmParams& p, bool backward, int elem_bytes);

// The plan production runs. An empty problem (nothing to write) gets a plan that launches nothing
// (grid_x == 0 and reduce_grid == 0); the entries return before planning then.
DmPlan plan_diagonal_matmul(const DmProblem& problem, const DeviceInfo& dev);

// Every plan that can run the problem, the production plan first: each access width the alignment
// allows with each vectors-per-thread count built for it (kDmBuilds in diagonal_matmul_plan.cpp), and
// for the forward each of these also with a grid of a quarter of the row groups (4 rows per thread).
// Empty for a problem with nothing to launch.
std::vector<DmPlan> candidate_plans(const DmProblem& problem, const DeviceInfo& dev);

// Ok when `plan` can run `problem` on `dev`; otherwise an error naming what does not fit.
Status check_plan(const DmPlan& plan, const DmProblem& problem, const DeviceInfo& dev);

// Whether the problem writes anything (y / db elements, or da elements).
bool dm_has_work(const DmProblem& problem);

// Test-only entries: run one call with a given plan (validate, check the device, check_plan, launch),
// and list a call's candidate plans on the current device. The backward's workspace follows the public
// convention (workspace == nullptr: *workspace_bytes receives the size, nothing runs).
Status dm_launch_with_plan(const DmPlan& plan, const DmCall& call, void* workspace, size_t* workspace_bytes,
                           cudaStream_t stream);
Status dm_candidate_plans(const DmCall& call, std::vector<DmPlan>* plans);

// The launcher (diagonal_matmul_launch.cuh), one instantiation per dtype (diagonal_matmul_<dtype>.cu).
template <typename T>
Status launch_diagonal_matmul(const DmPlan& plan, const DmParams& p, const DeviceInfo& dev, cudaStream_t stream);

}  // namespace kernelforge
