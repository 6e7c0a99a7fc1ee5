// The fused_linear_rowsum planner: FlrsProblem -> FlrsPlan, pure host code over the constants below
// (no CUDA code: unit-tested on machines without a GPU).
//
// A call is a fixed sequence of launches (fused_linear_rowsum_launch.cuh):
//   forward      column_partials(W, bias) -> column_reduce -> w_sum, b_sum -> row_dot(x) -> y
//   backward     column_partials(x, dy; writes dx) -> column_reduce -> g, sum dy -> broadcast_rows -> dW, db
//   backward_dx  column_partials(x, dy) writing dx only (neither dweight nor dbias asked)
// The plan picks the access width (16 bytes unless a forward w_sum is off a 16-byte boundary, else one
// element), the column pass's grid (column tiles x row chunks) and the final kernel's blocks. The row
// chunking is a function of the sizes only (never of the device), so the workspace size is too and the
// summation order, hence every bit of the result, is the same on every GPU.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/device.h"
#include "fused_linear_rowsum/fused_linear_rowsum_problem.h"
#include "kernelforge/status.h"

namespace kernelforge {

// column_partials: blocks of 32 x 8 threads; a warp row covers 32 vectors of a row (512 contiguous
// bytes at 16-byte vectors), the 8 warps take interleaved rows of the chunk and are summed in shared
// memory in a fixed order. Each thread has plan.col_rows rows' vectors loaded before it adds them:
// kFlrsRowsInFlight in production; the kernels are built for kFlrsColRowsBuilt (the others are
// candidates to measure, dev/sweep_fused_linear_rowsum.cu).
constexpr int kFlrsColTx = 32;
constexpr int kFlrsColTy = 8;
constexpr int kFlrsRowsInFlight = 4;
constexpr int kFlrsColRowsBuilt[] = {4, 8};
// Row chunks: enough blocks to fill a GPU several times over (1024: ~8 per SM on an H100), counted
// for a nominal tile of 256 columns (16 bytes x 32 threads at 2-byte types), at most kFlrsMaxChunks
// (the reduction reads every chunk's partial: 128 x 4 bytes per column) and at least
// kFlrsMinChunkRows rows per chunk (4 rows per warp row: the partial row written per chunk stays small
// next to the rows read).
constexpr int kFlrsTargetBlocks = 1024;
constexpr int kFlrsNominalTile = 256;
constexpr int kFlrsMaxChunks = 128;
constexpr int kFlrsMinChunkRows = 32;
// column_reduce: 32 columns x 8 chunk lanes per block (<= 16 partials per thread), combined in shared
// memory in a fixed order.
constexpr int kFlrsReduceTx = 32;
constexpr int kFlrsReduceTy = 8;
// row_dot: 8 warps per block, each on plan.dot_rows rows at once (kFlrsDotRows in production: one
// w_sum load serves 4 rows; 4 x 16 bytes of x in flight per lane per step). Built for
// kFlrsDotRowsBuilt: 2 rows per warp doubles the blocks (T = 16384: 1024 instead of 512, a better
// spread over 132 SMs) for half the bytes in flight per lane.
// Before waiting for the reduction, row_dot asks L2 for the first max(kFlrsPrefetchMinRowBytes,
// kFlrsPrefetchBytes / T) bytes of each of its rows (at most the row): 16 MB in all at T = 16384
// (~5 us of DRAM time, a third of L2), the whole row at small T.
constexpr int64_t kFlrsPrefetchBytes = int64_t(16) << 20;
constexpr int64_t kFlrsPrefetchMinRowBytes = 512;
constexpr int kFlrsDotWarps = 8;
constexpr int kFlrsDotRows = 4;
constexpr int kFlrsDotRowsBuilt[] = {2, 4};
// broadcast_rows: 32 x 8 threads, each writing its vector of g into kFlrsBcastRows rows.
constexpr int kFlrsBcastTx = 32;
constexpr int kFlrsBcastTy = 8;
constexpr int kFlrsBcastRows = 8;
constexpr int kFlrsMaxGridY = 65535;  // CUDA's gridDim.y limit: more row groups loop

enum class FlrsKernel : int {
  kForward = 0,     // column_partials(W) -> column_reduce -> row_dot
  kBackward = 1,    // column_partials(x, writes dx) -> column_reduce -> broadcast_rows
  kBackwardDx = 2,  // column_partials writing dx only
};

struct FlrsPlan {
  FlrsKernel kind = FlrsKernel::kForward;
  int vec = 1;                       // elements per access in every kernel (16 bytes, or 1)
  int grid_x = 1;                    // column pass: column tiles of kFlrsColTx * vec columns
  int chunks = 1;                    // column pass: row chunks (rows of the partials)
  int64_t chunk_rows = 1;            // rows per chunk
  int col_rows = kFlrsRowsInFlight;  // column pass: rows loaded per thread before use (kFlrsColRowsBuilt)
  int reduce_blocks = 0;             // column_reduce: blocks of kFlrsReduceTx columns (of K + 1)
  int64_t final_blocks = 0;          // row_dot blocks (forward) / broadcast_rows row groups (backward)
  int dot_rows = kFlrsDotRows;       // row_dot: rows per warp (kFlrsDotRowsBuilt; forward only)
};

// e.g. "flrs_fwd vec=8 cols=16 chunks=64x64 inflight=4 reduce=129 dot=512x4"
std::string to_string(const FlrsPlan& plan);

struct FlrsProblem {
  FlrsKernel kind = FlrsKernel::kForward;
  int elem_bytes = 2;  // sizeof(T)
  int64_t tokens = 0, k = 0, o = 0;
  // Widest access (bytes) the call allows: 16 or elem_bytes (make_flrs_problem: rows at any alignment
  // take 16-byte vectors; only a forward w_sum off a 16-byte boundary forces one element).
  int align_bytes = 16;
};

// Row chunks of a column pass over `rows` rows of `k` columns, and the rows per chunk (>= 1 each).
void flrs_chunking(int64_t rows, int64_t k, int* chunks, int64_t* chunk_rows);
// Workspace floats: partials [chunks, K + 1] of the larger pass, then the reduced [K + 1], each padded
// to 16 bytes.
int64_t flrs_workspace_floats(int64_t tokens, int64_t k, int64_t o);
inline int64_t flrs_partial_floats(int64_t chunks, int64_t k) { return (chunks * (k + 1) + 3) / 4 * 4; }

// The problem of a validated call; `backward` with neither dW nor dB (p.o == 0 or both null) is
// kBackwardDx.
FlrsProblem make_flrs_problem(const FlrsParams& p, bool backward, int elem_bytes);

// Whether the problem launches anything (forward: T > 0; backward: dweight / dbias asked, or dx with
// T > 0 and K > 0).
bool flrs_has_work(const FlrsProblem& problem, const FlrsParams& p);

// The plan production runs.
FlrsPlan plan_fused_linear_rowsum(const FlrsProblem& problem, const DeviceInfo& dev);

// Every plan that can run the problem, the production plan first: each access width the alignment
// allows with the planned row chunks and every built col_rows (and, forward, every built dot_rows),
// and with one chunk (the longest serial sums, the reduction of one partial) at the production
// col_rows and dot_rows.
std::vector<FlrsPlan> candidate_plans(const FlrsProblem& problem, const DeviceInfo& dev);

// Ok when `plan` can run `problem`; otherwise an error naming what does not fit.
Status check_plan(const FlrsPlan& plan, const FlrsProblem& problem, const DeviceInfo& dev);

// Test-only entries: run one call with a given plan (validate, check the device and workspace,
// check_plan, launch), and list a call's candidate plans on the current device.
Status launch_with_plan(const FlrsPlan& plan, const FlrsCall& call, void* workspace, size_t workspace_bytes,
                        cudaStream_t stream);
Status flrs_candidate_plans(const FlrsCall& call, std::vector<FlrsPlan>* plans);

// The launcher (fused_linear_rowsum_launch.cuh), one instantiation per dtype (fused_linear_rowsum_<dtype>.cu).
// `workspace` holds flrs_workspace_floats(T, K, O) floats.
template <typename T>
Status launch_fused_linear_rowsum(const FlrsPlan& plan, const FlrsParams& p, const DeviceInfo& dev, float* workspace,
                                  cudaStream_t stream);

}  // namespace kernelforge
