// The normalization planner's tables (constexpr rows, each with the reason it is there) and the
// helpers norm_plan.cpp (plan_norm) and norm_plan_candidates.cpp (candidate_plans, check_plan) share.
// Internal to src/norm; host code only. Measurements: H100 SXM, bf16 unless stated (notes/norm.md).
#pragma once

#include <algorithm>
#include <climits>
#include <cstdint>

#include "common/math.h"
#include "norm/norm_plan.h"

namespace kernelforge {
namespace norm_plan {

using namespace norm_detail;

// ---- forward tables ------------------------------------------------------------------------------
// norm_fwd_row: 16-byte vectors of x per thread aimed for. Two is best or level for every op at
// N = 2048-8192 (more threads per row, fewer registers per thread, more bytes in flight per SM).
constexpr int kFwdRowIters = 2;
// Register-resident x per thread: 8 16-byte vectors (64 bf16/fp16 or 32 fp32 elements, 32 registers);
// one-element vectors (unaligned rows) up to 16 per thread.
constexpr int kFwdMaxIters = 8;
constexpr int kFwdMaxItersScalar = 16;
// Rows of small N are packed into blocks of at least 128 threads (4 warps: one block per row of 32
// threads would cap residency at 32 blocks per SM).
constexpr int kFwdMinBlock = 128;
// Threads per row aimed for once rows exceed norm_fwd_row (norm_fwd_cluster, scalar rows), and per CTA
// once a row is split over a cluster.
constexpr int kFwdTargetTeam = 256;
constexpr int kFwdClusterTeam = 512;
// RMSNorm rows of 129-256 16-byte vectors (2048 bf16) take the early-parameter kernel on every grid:
// 16384x2048 49.0 vs 50.0 us (2741 vs 2687 GB/s); LayerNorm at 2048 is level (weight and bias: twice
// the registers), RMSNorm at 4096 slower (97.1 vs 93.6 us).
constexpr int64_t kFwdEarlyRmsMinVecs = 129, kFwdEarlyRmsMaxVecs = 256;

// Largest norm_fwd_row block by op: 512 threads x 2 vectors (40 registers, 3 blocks per SM) beat
// 256 x 4 (64 registers, 4 blocks per SM) at 8192-element rows: RMSNorm 181.9 vs 183.4 us, LayerNorm
// 181.8 vs 183.5 us (16384x8192). AdaLN without weight and bias too (its kernel holds 4 blocks of 512
// per SM: 184.5 vs 187.1 us); with weight or bias AdaLN keeps 256 (189.7 us at 512).
inline int fwd_row_block_cap(const NormProblem& pr) {
  if (pr.op == NormOp::kRms || pr.op == NormOp::kLayer) return kFwdRowBigBlock;
  if (norm_is_ada(pr.op) && !pr.has_weight && !pr.has_bias) return kFwdRowBigBlock;
  return kFwdRowMaxBlock;
}

// norm_fwd_bulk (sm_90, 16-byte rows) takes rows longer than 16 KB, and at least two rows per SM
// (decode: the pipeline has nothing to overlap, its setup only adds latency). Above 16 KB the row
// kernel needs 256 threads x 8 vectors with up to half the lanes idle: at 16384 rows x 8704..15872
// bf16 it reaches 58-66 % of copy@size (RMSNorm, LayerNorm) and 71-88 % (AdaLN), the bulk pipeline
// 87-94 %. At 16 KB rows the row kernel wins (16384x8192 RMSNorm 98 % vs 92 %). Residual-add
// RMSNorm keeps the row kernel up to 32 KB: its two stage buffers halve the pipeline's depth
// (16384x8704..15360: 97-98 % vs 93-95 %).
constexpr int64_t bulk_min_row_bytes(NormOp op) { return op == NormOp::kAddRms ? 32 * 1024 : 16 * 1024 + 1; }
constexpr int kBulkMinWaves = 2;
// Largest row slice per CTA before the row is split over a cluster: 32 KB slices beat 64 KB at
// 4096x65536 / 2048x131072 (RMSNorm 2735 / 2623 vs 2581 / 2482 GB/s: more CTAs share a row, so more
// of them are resident and streaming).
constexpr int64_t kBulkSliceBytes = 32 * 1024;
// Shared memory for the stages of one CTA: 64 KB; 96 KB for LayerNorm with its parameters in
// registers (98 registers: two CTAs per SM, so a third stage costs no occupancy; 4096x65536 2613 vs
// 2592 GB/s).
constexpr int64_t kBulkStageBudget = 64 * 1024;
constexpr int64_t kBulkStageBudgetLayerRegs = 96 * 1024;
// Vectors per thread of a row slice (threads = slice vectors / 8, 128 to 512): 8 beat 2 (4096x65536 /
// 2048x131072: RMSNorm 2701 / 2690 vs 2661 / 2577 GB/s, LayerNorm 2575 / 2516 vs 2428 / 2193).
constexpr int kBulkVecsPerThread = 8;
constexpr int kBulkParamVecs = 8;  // params_in_regs: the thread's weight/bias vectors (kParamVecs)
// Parameters in registers for RMSNorm and LayerNorm (no per-row L2 reads of weight and bias): RMSNorm
// 2743 / 2789 vs 2693 / 2686 GB/s, LayerNorm 2592 / 2649 vs 2585 / 2550. Not add_rms_norm (two stage
// buffers: 2596 / 2517 vs 2667 / 2627). LayerNorm in clusters of 2 to 7 CTAs keeps 512 threads with
// per-vector parameter loads (4096x65536, cluster 4: 2641 vs 2584 GB/s).
inline bool bulk_params_in_regs_op(NormOp op) { return op == NormOp::kRms || op == NormOp::kLayer; }
constexpr int kBulkLayerRegsMinCluster = 8;

// ---- backward tables -----------------------------------------------------------------------------
// norm_bwd_regs: threads per row aimed for (2 vectors per thread from N = 2048 bf16), 128 to 512.
constexpr int kBwdTargetTeam = 128;
constexpr int kBwdMinTeam = 128;
// Register-resident elements per thread: x, dy and up to four column accumulators per element.
// AdaLN without staging also holds scale and bias: half of them.
constexpr int kBwdMaxElems = 16;
// Staged rows (norm_bwd_regs bulk, sm_90): shared memory for the stages; two stages at least.
constexpr int64_t kBwdBulkSmem = 96 * 1024;
constexpr int kBwdBulkMinWaves = 2;
// norm_bwd_chunk (sm_90): one 16-byte vector per thread up to 256 vectors (two above, at most 512
// threads); chunks of up to 8 rows (2 with two vectors per thread); 96 KB of stages per block (two
// blocks per SM), 192 KB with two vectors per thread (one block per SM, so that 2-row chunks fit at
// N = 8192 bf16). Not for AdaLN with a scale row per x row (its dscale/dshift are row tensors).
constexpr int kBwdChunkTeam = 256;
constexpr int kBwdChunkMaxRows[3] = {0, 8, 2};  // by vectors per thread
constexpr int64_t kBwdChunkSmem = 96 * 1024;

inline int max_iters_for(int vec, int max_vec_iters, int max_scalar_iters) {
  return vec == 1 ? max_scalar_iters : max_vec_iters;
}
inline int bwd_max_iters(int vec) { return std::max(1, kBwdMaxElems / vec); }
inline int full_vec(const NormProblem& pr) { return 16 / pr.elem_bytes; }
inline bool is_pow2(int64_t v) { return v > 0 && (v & (v - 1)) == 0; }

// ---- backward helpers ----------------------------------------------------------------------------
inline int64_t bwd_nbuf(const NormProblem& pr) { return pr.has_dsum ? 3 : 2; }
inline int64_t bwd_row_stage_bytes(const NormProblem& pr) { return bwd_nbuf(pr) * pr.n * pr.elem_bytes; }
inline bool bwd_grouped(const NormProblem& pr) { return norm_is_ada(pr.op) && pr.ada_rpg > 1; }
inline int64_t bwd_group_rows(const NormProblem& pr) { return bwd_grouped(pr) ? pr.ada_rpg : pr.rows; }
inline int bwd_regs_threads(int64_t nvec, int iters) {
  return std::min(kBwdMaxTeam, std::max(kBwdMinTeam, pow2_ceil(ceil_div(nvec, iters))));
}
inline bool bwd_staging_fits(const NormProblem& pr) { return 2 * bwd_row_stage_bytes(pr) <= kBwdBulkSmem; }
inline int bwd_bulk_stages(const NormProblem& pr) {
  return int(std::min<int64_t>(kBulkMaxStages, kBwdBulkSmem / bwd_row_stage_bytes(pr)));
}
// the scalar-head kernel's blocks per group are a multiple of row_period: the grid must fit int
inline bool bwd_head_grid_fits(const NormProblem& pr) {
  const int64_t groups = bwd_grouped(pr) ? pr.ada_groups : 1;
  return groups * pr.row_period <= INT_MAX;
}

// norm_bwd_chunk for `iters` vectors per thread and `rows` rows per chunk; false when it cannot run.
// norm_fwd_bulk with a row split over `cluster` CTAs; false when the slices do not fit.
bool fwd_bulk_plan(const NormProblem& pr, int cluster, bool allow_param_regs, NormPlan* out);
// norm_bwd_chunk for `iters` vectors per thread and `rows` rows per chunk; false when it cannot run.
bool bwd_chunk_plan(const NormProblem& pr, int iters, int64_t rows, NormPlan* out);

}  // namespace norm_plan
}  // namespace kernelforge
