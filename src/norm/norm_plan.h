// The normalization family's launch decision as a value: Problem -> Plan, pure host code (no CUDA
// code; unit-tested without a GPU in tests/cpp/test_norm_plan.cpp).
//
// A NormProblem says what the decision depends on (op, direction, element size, rows, row length,
// which 16-byte alignments hold, which optional tensors exist, AdaLN rows per scale row). plan_norm
// reads the small tables of norm_plan.cpp and returns the plan the library runs; candidate_plans
// lists every plan that can run the problem (the tests run them all, dev/sweep_norm.cu times them).
// Grid sizes that depend on occupancy (persistent grids, the backward's blocks per group and with
// them its workspace) are computed by the launcher (norm_launch_fwd.cuh, norm_launch_bwd.cuh).
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "common/device.h"
#include "kernelforge/status.h"
#include "norm/norm_problem.h"

namespace kernelforge {

// ---- kernel limits, shared by the planner and the kernels' launch bounds --------------------------
namespace norm_detail {
constexpr int kFwdRowMaxBlock = 256;  // norm_fwd_row: blocks of up to 256 threads ...
constexpr int kFwdRowBigBlock = 512;  // ... or 512 threads with exactly two vectors each
constexpr int kFwdMaxTeam = 512;      // norm_fwd_cluster: threads per CTA (128 registers each)
constexpr int kFwdStreamThreads = 1024;
constexpr int kBwdMaxTeam = 512;     // norm_bwd_regs: threads per block (128 registers each)
constexpr int kBwdStreamTeam = 512;  // norm_bwd_stream, norm_bwd_rowstats
constexpr int kBulkMaxStages = 4;    // bulk-copy pipelines: mbarriers per CTA
constexpr int kMaxClusterCtas = 8;   // the portable cluster size (common/cluster.cuh kMaxCluster)
constexpr int kSplitTeam = 256;      // split backward: column tiles of 256 threads x 2 vectors
constexpr int kSplitIters = 2;
constexpr int kBwdChunkStages = 3;
constexpr size_t kMaxDynamicSmem = 200 * 1024;  // the limit common/occupancy.h raises kernels to
}  // namespace norm_detail

// One enumerator per kernel (or fixed kernel sequence) that production can launch.
enum class NormKernel : int {
  // forward
  kFwdRow,      // norm_fwd_row: rows_per_block rows per block, row in registers, one row group per block
  kFwdCluster,  // norm_fwd_cluster: persistent grid, a row over `cluster` CTAs of up to 512 threads (sm_90
                // for cluster > 1; cluster = 1: 512-thread rows too long for norm_fwd_row)
  kFwdBulk,     // norm_fwd_bulk (sm_90): rows (or 1/cluster slices) streamed into shared memory by bulk copies
  kFwdStream,   // norm_fwd_stream: one 1024-thread block per row, the row re-read from memory
  // backward; each is followed by reduce_columns (and ada_group_grads for grouped AdaLN)
  kBwdRegs,      // norm_bwd_regs: row in registers, plain loads (optionally a scalar head per row)
  kBwdRegsBulk,  // norm_bwd_regs (sm_90): x, dy (dsum) rows staged in shared memory by bulk copies
  kBwdChunk,     // norm_bwd_chunk (sm_90): chunks of chunk_rows rows staged, one barrier per chunk
  kBwdSplit,     // norm_bwd_rowstats, then norm_bwd_regs over column tiles (rows too long for one block)
  kBwdStream,    // norm_bwd_stream: two passes over the row in memory
};

const char* norm_kernel_name(NormKernel k);

struct NormPlan {
  NormKernel kind = NormKernel::kFwdRow;
  int vec = 1;                     // elements per access: 16 / sizeof(T) (16-byte vectors) or 1
  int iters = 1;                   // vectors per thread per row (per row slice of a cluster CTA)
  int threads = 0;                 // threads per block
  int rows_per_block = 1;          // norm_fwd_row / norm_fwd_cluster: teams of threads / rows_per_block threads
  int cluster = 1;                 // CTAs per row (thread-block cluster, sm_90)
  int stages = 0;                  // bulk-copy pipeline stages (kFwdBulk, kBwdRegsBulk, kBwdChunk)
  int chunk_rows = 0;              // kBwdChunk: rows per chunk
  bool scalar_head = false;        // kFwdRow / kBwdRegs: rows off a 16-byte boundary (or odd N): a scalar head
                                   // of < vec elements per row, 16-byte vectors after it
  bool early_params = false;       // kFwdRow: weight, bias, scale/shift loaded with x, before the reduction
                                   // (decode grids of at most one block per SM; no register cap)
  bool plain_ada = false;          // kFwdRow: AdaLN without weight and bias, its output loop compiled alone
  bool params_in_regs = false;     // kFwdBulk: weight/bias of the thread's columns held in registers
  bool params_per_vector = false;  // kFwdBulk: output parameters loaded per vector, not per chunk of 4
};

std::string to_string(const NormPlan& plan);

struct NormProblem {
  NormOp op = NormOp::kRms;
  bool backward = false;
  int elem_bytes = 2;
  int64_t rows = 0, n = 0;
  // every row tensor (x, y, residual, sum, dy, dsum, dx), row stride, parameter and N allow 16-byte
  // vectors
  bool can_vectorize = false;
  // the row tensors start every row at the same offset from a 16-byte boundary: a scalar head per
  // row aligns them all (forward: x, y, residual, sum; backward: x, dy, dx, dsum, per-row dscale/dshift)
  bool can_align_body = false;
  int row_period = 1;  // rows after which x's row misalignment repeats (16 / gcd(16, row stride bytes))
  bool has_weight = false, has_bias = false, has_dsum = false;
  bool has_dweight = false, has_dbias = false, has_dscale = false, has_dshift = false;
  int64_t ada_rpg = 1;     // AdaLN rows per scale/shift row
  int64_t ada_groups = 1;  // AdaLN scale/shift rows (rows / ada_rpg)
};

NormProblem make_norm_problem(NormOp op, bool backward, const NormParams& p, DType dtype);
// x's row misalignment period (NormProblem::row_period) of validated params.
int row_misalignment_period(const NormParams& p, int elem_bytes);

NormPlan plan_norm(const NormProblem& problem, const DeviceInfo& dev);
std::vector<NormPlan> candidate_plans(const NormProblem& problem, const DeviceInfo& dev);
Status check_plan(const NormPlan& plan, const NormProblem& problem, const DeviceInfo& dev);

// Test-only entries. launch_with_plan runs `call` (a CUDA call, validated like the public entries)
// with `plan` after check_plan; backward calls take the CUB workspace convention of the public API.
Status launch_with_plan(const NormPlan& plan, const NormCall& call, void* workspace, size_t* workspace_bytes,
                        cudaStream_t stream);
// Every candidate plan of `call` on the current device.
Status candidate_plans_for(const NormCall& call, std::vector<NormPlan>* plans);

// The launcher, one instantiation per dtype (norm_launch.cuh). With backward and workspace ==
// nullptr it only sets *workspace_bytes.
template <typename T>
Status launch_norm(const NormPlan& plan, NormOp op, const NormParams& p, const DeviceInfo& dev, void* workspace,
                   size_t* workspace_bytes, cudaStream_t stream);

}  // namespace kernelforge
