// Problem -> plan for the normalization family: the tables and the arithmetic that reads them.
// Measurements behind each row: notes/norm.md (H100 SXM, bf16 unless stated).
#include "norm/norm_plan.h"

#include <algorithm>
#include <climits>
#include <cstdint>

#include "common/math.h"

namespace kernelforge {

using namespace norm_detail;

namespace {

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
int fwd_row_block_cap(const NormProblem& pr) {
  if (pr.op == NormOp::kRms || pr.op == NormOp::kLayer) return kFwdRowBigBlock;
  if (norm_is_ada(pr.op) && !pr.has_weight && !pr.has_bias) return kFwdRowBigBlock;
  return kFwdRowMaxBlock;
}

// norm_fwd_bulk (sm_90, 16-byte rows): rows of at least 32 KB (the row kernel wins up to 16 KB rows
// for every op: AdaLN at 16384x8192 187.6 vs 200.4 us), and at least two rows per SM (decode: the
// pipeline has nothing to overlap, its setup only adds latency).
constexpr int64_t kBulkMinRowBytes = 32 * 1024;
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
bool bulk_params_in_regs_op(NormOp op) { return op == NormOp::kRms || op == NormOp::kLayer; }
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

int max_iters_for(int vec, int max_vec_iters, int max_scalar_iters) {
  return vec == 1 ? max_scalar_iters : max_vec_iters;
}
int bwd_max_iters(int vec) { return std::max(1, kBwdMaxElems / vec); }
int full_vec(const NormProblem& pr) { return 16 / pr.elem_bytes; }
bool is_pow2(int64_t v) { return v > 0 && (v & (v - 1)) == 0; }

// ---- forward -------------------------------------------------------------------------------------
// The register forward for `tpr` threads per row, `iters` vectors each, over `cluster` CTAs: the row
// kernel where it fits (blocks of <= 256 threads, or 512 x 2 over more than one wave of blocks), else
// the persistent kernel.
NormPlan fwd_regs_plan(const NormProblem& pr, const DeviceInfo& dev, int vec, int iters, int tpr, int cluster,
                       bool head) {
  NormPlan pl;
  pl.vec = vec;
  pl.iters = iters;
  pl.scalar_head = head;
  const int block = std::max(tpr, kFwdMinBlock);
  pl.threads = block;
  pl.rows_per_block = block / tpr;
  pl.cluster = cluster;
  const int64_t units = std::min<int64_t>(ceil_div(pr.rows, pl.rows_per_block), INT_MAX);
  const bool plain = norm_is_ada(pr.op) && !pr.has_weight && !pr.has_bias;
  if (cluster == 1 && (block <= kFwdRowMaxBlock || (iters == 2 && block <= kFwdRowBigBlock && units > dev.sm_count))) {
    pl.kind = NormKernel::kFwdRow;
    if (block > kFwdRowMaxBlock) {
      pl.plain_ada = plain;
      return pl;
    }
    const int64_t nvec = pr.n / vec;
    if (!head && (units <= dev.sm_count ||
                  (pr.op == NormOp::kRms && nvec >= kFwdEarlyRmsMinVecs && nvec <= kFwdEarlyRmsMaxVecs))) {
      pl.early_params = true;
      return pl;
    }
    pl.plain_ada = plain;
    return pl;
  }
  pl.kind = NormKernel::kFwdCluster;
  return pl;
}

// norm_fwd_row at two vectors per thread, or nothing when the row needs more than kFwdMaxIters.
bool fwd_row_plan(const NormProblem& pr, const DeviceInfo& dev, int vec, bool head, NormPlan* out) {
  const int64_t nvec = head ? ceil_div(pr.n, vec) : pr.n / vec;
  int tpr =
      int(std::min<int64_t>(fwd_row_block_cap(pr), std::max<int64_t>(32, pow2_ceil(ceil_div(nvec, kFwdRowIters)))));
  int it = pow2_ceil(ceil_div(nvec, tpr));
  // 512-thread blocks take exactly two vectors per thread, and grids of more than one block per SM
  if (tpr > kFwdRowMaxBlock && (it != 2 || pr.rows <= dev.sm_count)) {
    tpr = kFwdRowMaxBlock;
    it = pow2_ceil(ceil_div(nvec, tpr));
  }
  if (it > kFwdMaxIters) return false;
  *out = fwd_regs_plan(pr, dev, vec, it, tpr, 1, head);
  return true;
}

// Rows norm_fwd_row cannot hold (or one-element vectors): kFwdTargetTeam threads per row, up to 512,
// then a cluster of 512-thread CTAs (sm_90), then the streaming kernel.
NormPlan fwd_team_plan(const NormProblem& pr, const DeviceInfo& dev, int vec) {
  const int max_iters = max_iters_for(vec, kFwdMaxIters, kFwdMaxItersScalar);
  const int64_t nvec = pr.n / vec;
  const int iters = std::min(max_iters, pow2_ceil(ceil_div(nvec, kFwdTargetTeam)));
  int tpr = 0, cluster = 1;
  if (nvec <= int64_t(kFwdMaxTeam) * iters) {
    tpr = std::min(kFwdMaxTeam, std::max(32, pow2_ceil(ceil_div(nvec, iters))));
  } else if (dev.capability >= 90 && nvec <= int64_t(kFwdClusterTeam) * iters * kMaxClusterCtas) {
    tpr = kFwdClusterTeam;
    cluster = int(ceil_div(nvec, int64_t(tpr) * iters));
  }
  if (tpr == 0) {
    NormPlan pl;
    pl.kind = NormKernel::kFwdStream;
    pl.vec = vec;
    pl.threads = kFwdStreamThreads;
    return pl;
  }
  return fwd_regs_plan(pr, dev, vec, iters, tpr, cluster, false);
}

// norm_fwd_bulk with a row split over `cluster` CTAs; false when the slices do not fit.
bool fwd_bulk_plan(const NormProblem& pr, int cluster, bool allow_param_regs, NormPlan* out) {
  const int vec = full_vec(pr);
  if (cluster < 1 || cluster > kMaxClusterCtas || pr.n % cluster != 0 || ((pr.n / cluster) * pr.elem_bytes) % 16 != 0)
    return false;
  const int64_t slice_bytes = pr.n * pr.elem_bytes / cluster;
  const int nbuf = pr.op == NormOp::kAddRms ? 2 : 1;
  const bool layer_small = pr.op == NormOp::kLayer && cluster > 1 && cluster < kBulkLayerRegsMinCluster;
  const bool preg = bulk_params_in_regs_op(pr.op) && !layer_small && allow_param_regs;
  const int64_t budget = (preg && pr.op == NormOp::kLayer) ? kBulkStageBudgetLayerRegs : kBulkStageBudget;
  const int stages = int(std::min<int64_t>(kBulkMaxStages, std::max<int64_t>(2, budget / (slice_bytes * nbuf))));
  if (int64_t(stages) * nbuf * slice_bytes > int64_t(kMaxDynamicSmem)) return false;
  const int64_t svec = (pr.n / cluster) / vec;
  const int vpt = layer_small ? 2 : kBulkVecsPerThread;
  NormPlan pl;
  pl.kind = NormKernel::kFwdBulk;
  pl.vec = vec;
  pl.cluster = cluster;
  pl.stages = stages;
  pl.threads = std::min(512, std::max(128, pow2_ceil(ceil_div(svec, vpt))));
  if (preg && svec <= int64_t(512) * kBulkParamVecs) {
    pl.params_in_regs = true;
    pl.threads = std::max(128, pow2_ceil(ceil_div(svec, kBulkParamVecs)));
  }
  pl.params_per_vector = layer_small;
  *out = pl;
  return true;
}

// The default bulk plan: the smallest cluster whose slices are at most kBulkSliceBytes and divide the row.
bool fwd_bulk_default(const NormProblem& pr, const DeviceInfo& dev, NormPlan* out) {
  if (!pr.can_vectorize || dev.capability < 90) return false;
  const int64_t row_bytes = pr.n * pr.elem_bytes;
  if (row_bytes < kBulkMinRowBytes || pr.rows < int64_t(dev.sm_count) * kBulkMinWaves) return false;
  int cluster = int(ceil_div(row_bytes, kBulkSliceBytes));
  while (cluster <= kMaxClusterCtas && (pr.n % cluster != 0 || ((pr.n / cluster) * pr.elem_bytes) % 16 != 0)) ++cluster;
  return cluster <= kMaxClusterCtas && fwd_bulk_plan(pr, cluster, true, out);
}

NormPlan plan_fwd(const NormProblem& pr, const DeviceInfo& dev) {
  const int vec = full_vec(pr);
  NormPlan pl;
  if (pr.can_vectorize) {
    if (fwd_bulk_default(pr, dev, &pl)) return pl;
    if (fwd_row_plan(pr, dev, vec, false, &pl)) return pl;
    return fwd_team_plan(pr, dev, vec);
  }
  // odd N or rows off a 16-byte boundary: a scalar head per row, else one-element vectors
  if (pr.can_align_body && fwd_row_plan(pr, dev, vec, true, &pl)) return pl;
  return fwd_team_plan(pr, dev, 1);
}

// ---- backward ------------------------------------------------------------------------------------
int64_t bwd_nbuf(const NormProblem& pr) { return pr.has_dsum ? 3 : 2; }
int64_t bwd_row_stage_bytes(const NormProblem& pr) { return bwd_nbuf(pr) * pr.n * pr.elem_bytes; }
bool bwd_grouped(const NormProblem& pr) { return norm_is_ada(pr.op) && pr.ada_rpg > 1; }
int64_t bwd_group_rows(const NormProblem& pr) { return bwd_grouped(pr) ? pr.ada_rpg : pr.rows; }
int bwd_regs_threads(int64_t nvec, int iters) {
  return std::min(kBwdMaxTeam, std::max(kBwdMinTeam, pow2_ceil(ceil_div(nvec, iters))));
}
bool bwd_staging_fits(const NormProblem& pr) { return 2 * bwd_row_stage_bytes(pr) <= kBwdBulkSmem; }
int bwd_bulk_stages(const NormProblem& pr) {
  return int(std::min<int64_t>(kBulkMaxStages, kBwdBulkSmem / bwd_row_stage_bytes(pr)));
}
// the scalar-head kernel's blocks per group are a multiple of row_period: the grid must fit int
bool bwd_head_grid_fits(const NormProblem& pr) {
  const int64_t groups = bwd_grouped(pr) ? pr.ada_groups : 1;
  return groups * pr.row_period <= INT_MAX;
}

// norm_bwd_chunk for `iters` vectors per thread and `rows` rows per chunk; false when it cannot run.
bool bwd_chunk_plan(const NormProblem& pr, int iters, int64_t rows, NormPlan* out) {
  const int64_t nvec = pr.n / full_vec(pr);
  const int64_t threads = ceil_div(ceil_div(nvec, iters), 32) * 32;
  if (threads > 512 || rows < 1 || rows > kBwdChunkMaxRows[iters]) return false;
  if (int64_t(kBwdChunkStages) * rows * bwd_row_stage_bytes(pr) > int64_t(kMaxDynamicSmem)) return false;
  NormPlan pl;
  pl.kind = NormKernel::kBwdChunk;
  pl.vec = full_vec(pr);
  pl.iters = iters;
  pl.threads = int(threads);
  pl.chunk_rows = int(rows);
  pl.stages = kBwdChunkStages;
  *out = pl;
  return true;
}

bool plan_bwd_vec(const NormProblem& pr, const DeviceInfo& dev, int vec, bool head, NormPlan* out) {
  const bool ada = norm_is_ada(pr.op);
  const int max_iters_all = bwd_max_iters(vec);
  const bool bulk_ok = vec > 1 && !head && dev.capability >= 90 && bwd_staging_fits(pr);
  const bool halve = ada && !bulk_ok && !head;  // AdaLN's scale and bias in registers too
  const int max_iters = halve ? std::max(1, max_iters_all / 2) : max_iters_all;
  const int64_t nvec = head ? ceil_div(pr.n, vec) : pr.n / vec;
  const int iters = std::min(max_iters, pow2_ceil(ceil_div(nvec, kBwdTargetTeam)));
  const bool regs = nvec <= int64_t(kBwdMaxTeam) * iters;
  NormPlan pl;
  pl.vec = vec;
  pl.iters = iters;
  pl.scalar_head = head;
  if (head) {
    if (!regs || !bwd_head_grid_fits(pr)) return false;
    pl.kind = NormKernel::kBwdRegs;
    pl.threads = bwd_regs_threads(nvec, iters);
    *out = pl;
    return true;
  }
  const bool many_rows = pr.rows >= int64_t(dev.sm_count) * kBwdBulkMinWaves;
  if (vec > 1 && dev.capability >= 90 && (!ada || pr.ada_rpg > 1) && many_rows) {
    const int citers = nvec <= kBwdChunkTeam ? 1 : 2;
    const int64_t cbudget = citers == 1 ? kBwdChunkSmem : 2 * kBwdChunkSmem;
    const int64_t crows = std::min<int64_t>(
        {int64_t(kBwdChunkMaxRows[citers]), bwd_group_rows(pr), cbudget / (bwd_row_stage_bytes(pr) * kBwdChunkStages)});
    if (bwd_chunk_plan(pr, citers, crows, out)) return true;
  }
  if (!regs) {
    pl.kind = vec > 1 ? NormKernel::kBwdSplit : NormKernel::kBwdStream;
    pl.threads = vec > 1 ? kSplitTeam : kBwdStreamTeam;
    pl.iters = vec > 1 ? kSplitIters : 1;
    *out = pl;
    return true;
  }
  pl.threads = bwd_regs_threads(nvec, iters);
  pl.kind = NormKernel::kBwdRegs;
  if (bulk_ok && many_rows) {
    pl.kind = NormKernel::kBwdRegsBulk;
    pl.stages = bwd_bulk_stages(pr);
  }
  *out = pl;
  return true;
}

NormPlan plan_bwd(const NormProblem& pr, const DeviceInfo& dev) {
  NormPlan pl;
  if (pr.can_vectorize) {
    plan_bwd_vec(pr, dev, full_vec(pr), false, &pl);
    return pl;
  }
  if (pr.can_align_body && plan_bwd_vec(pr, dev, full_vec(pr), true, &pl)) return pl;
  plan_bwd_vec(pr, dev, 1, false, &pl);
  return pl;
}

Status plan_error(const NormPlan& plan, const std::string& why) {
  return Status::Invalid("norm plan " + to_string(plan) + ": " + why);
}

}  // namespace

const char* norm_kernel_name(NormKernel k) {
  switch (k) {
    case NormKernel::kFwdRow:
      return "fwd_row";
    case NormKernel::kFwdCluster:
      return "fwd_cluster";
    case NormKernel::kFwdBulk:
      return "fwd_bulk";
    case NormKernel::kFwdStream:
      return "fwd_stream";
    case NormKernel::kBwdRegs:
      return "bwd_regs";
    case NormKernel::kBwdRegsBulk:
      return "bwd_regs_bulk";
    case NormKernel::kBwdChunk:
      return "bwd_chunk";
    case NormKernel::kBwdSplit:
      return "bwd_split";
    case NormKernel::kBwdStream:
      return "bwd_stream";
  }
  return "unknown";
}

std::string to_string(const NormPlan& p) {
  std::string s = norm_kernel_name(p.kind);
  s += " vec=" + std::to_string(p.vec) + " iters=" + std::to_string(p.iters) + " threads=" + std::to_string(p.threads);
  if (p.rows_per_block != 1) s += " rows_per_block=" + std::to_string(p.rows_per_block);
  if (p.cluster != 1) s += " cluster=" + std::to_string(p.cluster);
  if (p.stages != 0) s += " stages=" + std::to_string(p.stages);
  if (p.chunk_rows != 0) s += " chunk_rows=" + std::to_string(p.chunk_rows);
  if (p.scalar_head) s += " scalar_head";
  if (p.early_params) s += " early_params";
  if (p.plain_ada) s += " plain_ada";
  if (p.params_in_regs) s += " params_in_regs";
  if (p.params_per_vector) s += " params_per_vector";
  return s;
}

int row_misalignment_period(const NormParams& p, int elem_bytes) {
  const int64_t sb = p.rows > 1 ? (p.x_stride * elem_bytes) % 16 : 0;
  int period = 1;
  while (period < 16 && (sb * period) % 16 != 0) period *= 2;
  return period;
}

namespace {
bool aligned_to(const void* ptr, int64_t stride_elems, int64_t elem, int64_t bytes) {
  return reinterpret_cast<uintptr_t>(ptr) % uintptr_t(bytes) == 0 && (stride_elems * elem) % bytes == 0;
}
// Rows of a and b share their misalignment: base pointers and row strides differ by multiples of 16 B.
bool shares_misalignment(const void* a, const void* b, int64_t stride_diff_bytes) {
  const uintptr_t bits =
      (reinterpret_cast<uintptr_t>(a) - reinterpret_cast<uintptr_t>(b)) | static_cast<uintptr_t>(stride_diff_bytes);
  return bits % 16 == 0;
}
}  // namespace

NormProblem make_norm_problem(NormOp op, bool backward, const NormParams& p, DType dtype) {
  NormProblem pr;
  pr.op = op;
  pr.backward = backward;
  const int64_t e = int64_t(dtype_size(dtype));
  pr.elem_bytes = int(e);
  pr.rows = p.rows;
  pr.n = p.n;
  pr.has_weight = p.weight != nullptr;
  pr.has_bias = p.bias != nullptr;
  pr.has_dsum = p.dsum != nullptr;
  pr.has_dweight = p.dweight != nullptr;
  pr.has_dbias = p.dbias != nullptr;
  pr.has_dscale = p.dscale != nullptr;
  pr.has_dshift = p.dshift != nullptr;
  pr.ada_rpg = p.ada_rpg;
  pr.ada_groups = p.ada_groups;
  pr.row_period = row_misalignment_period(p, int(e));

  // 16-byte vectors: every pointer, row stride and N
  const int64_t vec = 16 / e;
  bool v = p.n % vec == 0;
  const void* rows[] = {p.x, p.residual, p.y, p.sum, p.dy, p.dsum, p.dx};
  const int64_t strides[] = {p.x_stride,  p.res_stride,  p.y_stride, p.sum_stride,
                             p.dy_stride, p.dsum_stride, p.dx_stride};
  for (int i = 0; i < 7; ++i)
    if (rows[i] && !aligned_to(rows[i], p.rows > 1 ? strides[i] : 0, e, 16)) v = false;
  for (const void* q : {p.weight, p.bias, static_cast<const void*>(p.dscale), static_cast<const void*>(p.dshift)})
    if (q && !aligned_to(q, 0, e, 16)) v = false;
  if (p.scale && !aligned_to(p.scale, p.ada_groups > 1 ? p.scale_stride : 0, e, 16)) v = false;
  if (p.shift && !aligned_to(p.shift, p.ada_groups > 1 ? p.shift_stride : 0, e, 16)) v = false;
  pr.can_vectorize = v;

  // one scalar head per row aligns every row tensor (the parameters may sit anywhere)
  bool body = reinterpret_cast<uintptr_t>(p.x) % uintptr_t(e) == 0;
  if (!backward) {
    const void* r[] = {p.y, p.residual, p.sum};
    const int64_t s[] = {p.y_stride, p.res_stride, p.sum_stride};
    for (int i = 0; i < 3; ++i) {
      const int64_t diff = p.rows > 1 ? (s[i] - p.x_stride) * e : 0;
      if (r[i] && !shares_misalignment(p.x, r[i], diff)) body = false;
    }
  } else {
    const void* r[] = {p.dy, p.dx, p.dsum, p.dscale, p.dshift};
    const int64_t s[] = {p.dy_stride, p.dx_stride, p.dsum_stride, p.n, p.n};
    const bool per_row = p.ada_rpg == 1;  // dscale/dshift are [rows, N] only with a scale row per x row
    for (int i = 0; i < 5; ++i) {
      if (i >= 3 && !per_row) continue;
      const int64_t diff = p.rows > 1 ? (s[i] - p.x_stride) * e : 0;
      if (r[i] && !shares_misalignment(p.x, r[i], diff)) body = false;
    }
  }
  pr.can_align_body = body;
  return pr;
}

NormPlan plan_norm(const NormProblem& pr, const DeviceInfo& dev) {
  return pr.backward ? plan_bwd(pr, dev) : plan_fwd(pr, dev);
}

// ---- candidates ----------------------------------------------------------------------------------
namespace {

bool same_plan(const NormPlan& a, const NormPlan& b) {
  return a.kind == b.kind && a.vec == b.vec && a.iters == b.iters && a.threads == b.threads &&
         a.rows_per_block == b.rows_per_block && a.cluster == b.cluster && a.stages == b.stages &&
         a.chunk_rows == b.chunk_rows && a.scalar_head == b.scalar_head && a.early_params == b.early_params &&
         a.plain_ada == b.plain_ada && a.params_in_regs == b.params_in_regs &&
         a.params_per_vector == b.params_per_vector;
}

void add_plan(std::vector<NormPlan>* out, const NormPlan& p) {
  for (const NormPlan& q : *out)
    if (same_plan(p, q)) return;
  out->push_back(p);
}

struct VecChoice {
  int vec;
  bool head;
};
// The vector widths a problem can take: 16-byte vectors (aligned rows), 16-byte vectors after a
// scalar head (rows sharing a misalignment), one element.
std::vector<VecChoice> vec_choices(const NormProblem& pr, bool head_ok) {
  std::vector<VecChoice> v;
  if (pr.can_vectorize) v.push_back({full_vec(pr), false});
  if (!pr.can_vectorize && pr.can_align_body && head_ok) v.push_back({full_vec(pr), true});
  if (full_vec(pr) > 1) v.push_back({1, false});
  return v;
}

int64_t row_vecs(const NormProblem& pr, int vec, bool head) { return head ? ceil_div(pr.n, vec) : pr.n / vec; }

void fwd_candidates(const NormProblem& pr, const DeviceInfo& dev, std::vector<NormPlan>* out) {
  const bool plain_ok = norm_is_ada(pr.op) && !pr.has_weight && !pr.has_bias;
  for (const VecChoice& vc : vec_choices(pr, true)) {
    const int64_t nvec = row_vecs(pr, vc.vec, vc.head);
    const int max_iters = max_iters_for(vc.vec, kFwdMaxIters, kFwdMaxItersScalar);
    // norm_fwd_row and the one-CTA persistent kernel: every team size from 32 threads up to the one
    // that leaves half its threads idle
    for (int tpr = 32; tpr <= kFwdMaxTeam; tpr *= 2) {
      if (tpr > 32 && tpr / 2 >= nvec) break;
      int iters = pow2_ceil(ceil_div(nvec, tpr));
      if (iters > max_iters) continue;
      NormPlan pl;
      pl.kind = NormKernel::kFwdRow;
      pl.vec = vc.vec;
      pl.scalar_head = vc.head;
      pl.threads = std::max(tpr, kFwdMinBlock);
      pl.rows_per_block = pl.threads / tpr;
      pl.iters = iters;
      if (tpr > kFwdRowMaxBlock) pl.iters = 2;  // the 512-thread row kernel takes two vectors per thread
      if (tpr <= kFwdRowMaxBlock || iters <= 2) {
        add_plan(out, pl);
        if (plain_ok) {
          pl.plain_ada = true;
          add_plan(out, pl);
          pl.plain_ada = false;
        }
        if (!vc.head && tpr <= kFwdRowMaxBlock) {
          pl.early_params = true;
          add_plan(out, pl);
          pl.early_params = false;
        }
      }
      if (!vc.head) {
        pl.kind = NormKernel::kFwdCluster;
        pl.iters = iters;
        add_plan(out, pl);
      }
    }
    // a row over a cluster of 512-thread CTAs (sm_90)
    if (!vc.head && dev.capability >= 90) {
      for (int iters = 1; iters <= max_iters; iters *= 2) {
        const int64_t cluster = ceil_div(nvec, int64_t(kFwdClusterTeam) * iters);
        if (cluster < 2 || cluster > kMaxClusterCtas) continue;
        NormPlan pl;
        pl.kind = NormKernel::kFwdCluster;
        pl.vec = vc.vec;
        pl.iters = iters;
        pl.threads = kFwdClusterTeam;
        pl.cluster = int(cluster);
        add_plan(out, pl);
      }
    }
    if (!vc.head) {
      NormPlan pl;
      pl.kind = NormKernel::kFwdStream;
      pl.vec = vc.vec;
      pl.threads = kFwdStreamThreads;
      add_plan(out, pl);
    }
  }
  // the bulk-copy pipeline at any row length and row count, every cluster size that divides the row
  if (pr.can_vectorize && dev.capability >= 90) {
    for (int cluster = 1; cluster <= kMaxClusterCtas; ++cluster)
      for (bool regs : {true, false}) {
        NormPlan pl;
        if (fwd_bulk_plan(pr, cluster, regs, &pl)) add_plan(out, pl);
      }
  }
}

void bwd_candidates(const NormProblem& pr, const DeviceInfo& dev, std::vector<NormPlan>* out) {
  for (const VecChoice& vc : vec_choices(pr, bwd_head_grid_fits(pr))) {
    const int64_t nvec = row_vecs(pr, vc.vec, vc.head);
    const int max_iters = vc.head ? std::min(4, bwd_max_iters(vc.vec)) : bwd_max_iters(vc.vec);
    const bool staged = vc.vec > 1 && !vc.head && dev.capability >= 90 && bwd_staging_fits(pr);
    // norm_bwd_regs: every vector count from the fewest that fit 512 threads to the most that keep 128
    const int most = std::max(1, pow2_ceil(ceil_div(nvec, kBwdMinTeam)));
    for (int iters = 1; iters <= max_iters && iters <= most; iters *= 2) {
      if (nvec > int64_t(kBwdMaxTeam) * iters) continue;
      NormPlan pl;
      pl.kind = NormKernel::kBwdRegs;
      pl.vec = vc.vec;
      pl.scalar_head = vc.head;
      pl.iters = iters;
      pl.threads = bwd_regs_threads(nvec, iters);
      add_plan(out, pl);
      if (staged) {
        pl.kind = NormKernel::kBwdRegsBulk;
        pl.stages = bwd_bulk_stages(pr);
        add_plan(out, pl);
      }
    }
    if (vc.head) continue;
    NormPlan pl;
    pl.kind = NormKernel::kBwdStream;
    pl.vec = vc.vec;
    pl.threads = kBwdStreamTeam;
    add_plan(out, pl);
    if (vc.vec > 1) {
      pl.kind = NormKernel::kBwdSplit;
      pl.threads = kSplitTeam;
      pl.iters = kSplitIters;
      add_plan(out, pl);
    }
  }
  // chunks of 1 to 8 rows (sm_90), one or two vectors per thread
  if (pr.can_vectorize && dev.capability >= 90 && !(norm_is_ada(pr.op) && pr.ada_rpg == 1)) {
    for (int iters = 1; iters <= 2; ++iters)
      for (int rows = 1; rows <= kBwdChunkMaxRows[iters]; rows *= 2) {
        NormPlan pl;
        if (rows <= bwd_group_rows(pr) && bwd_chunk_plan(pr, iters, rows, &pl)) add_plan(out, pl);
      }
  }
}

bool vec_iters_ok(int iters, int max_iters) { return is_pow2(iters) && iters <= max_iters; }

}  // namespace

std::vector<NormPlan> candidate_plans(const NormProblem& pr, const DeviceInfo& dev) {
  std::vector<NormPlan> out;
  out.push_back(plan_norm(pr, dev));
  if (pr.backward)
    bwd_candidates(pr, dev, &out);
  else
    fwd_candidates(pr, dev, &out);
  return out;
}

Status check_plan(const NormPlan& pl, const NormProblem& pr, const DeviceInfo& dev) {
  const bool fwd_kind = pl.kind == NormKernel::kFwdRow || pl.kind == NormKernel::kFwdCluster ||
                        pl.kind == NormKernel::kFwdBulk || pl.kind == NormKernel::kFwdStream;
  const bool bwd_kind = pl.kind == NormKernel::kBwdRegs || pl.kind == NormKernel::kBwdRegsBulk ||
                        pl.kind == NormKernel::kBwdChunk || pl.kind == NormKernel::kBwdSplit ||
                        pl.kind == NormKernel::kBwdStream;
  if (!fwd_kind && !bwd_kind) return plan_error(pl, "unknown kernel kind " + std::to_string(int(pl.kind)));
  if (fwd_kind == pr.backward)
    return plan_error(pl,
                      pr.backward ? "a forward kernel for a backward call" : "a backward kernel for a forward call");
  const int full = full_vec(pr);
  if (pl.vec != 1 && pl.vec != full)
    return plan_error(pl, "vec must be 1 or " + std::to_string(full) + " (16-byte vectors of this dtype)");
  if (pl.scalar_head) {
    if (pl.kind != NormKernel::kFwdRow && pl.kind != NormKernel::kBwdRegs)
      return plan_error(pl, "only fwd_row and bwd_regs take a scalar head");
    if (pl.vec == 1 || !pr.can_align_body)
      return plan_error(pl, "a scalar head needs 16-byte vectors and row tensors sharing their misalignment");
    if (pr.backward && !bwd_head_grid_fits(pr)) return plan_error(pl, "too many groups for the scalar-head grid");
  } else if (pl.vec > 1 && !pr.can_vectorize) {
    return plan_error(pl, "16-byte vectors need N, every row stride and every pointer 16-byte aligned");
  }
  if (pl.threads < 32 || pl.threads % 32 != 0) return plan_error(pl, "threads must be a positive multiple of 32");
  const bool sm90 = dev.capability >= 90;
  const int64_t nvec = row_vecs(pr, pl.vec, pl.scalar_head);
  const bool plain_ok = norm_is_ada(pr.op) && !pr.has_weight && !pr.has_bias;
  if (!(pl.kind == NormKernel::kFwdRow) && (pl.early_params || pl.plain_ada))
    return plan_error(pl, "early_params and plain_ada are fwd_row variants");
  if (pl.kind != NormKernel::kFwdBulk && (pl.params_in_regs || pl.params_per_vector))
    return plan_error(pl, "params_in_regs and params_per_vector are fwd_bulk variants");
  if (pl.cluster != 1 && pl.kind != NormKernel::kFwdCluster && pl.kind != NormKernel::kFwdBulk)
    return plan_error(pl, "only fwd_cluster and fwd_bulk split a row over a cluster");
  switch (pl.kind) {
    case NormKernel::kFwdRow:
    case NormKernel::kFwdCluster: {
      const int max_iters = max_iters_for(pl.vec, kFwdMaxIters, kFwdMaxItersScalar);
      if (!vec_iters_ok(pl.iters, max_iters))
        return plan_error(pl, "iters must be a power of two up to " + std::to_string(max_iters));
      if (pl.rows_per_block < 1 || pl.threads % pl.rows_per_block != 0)
        return plan_error(pl, "rows_per_block must divide threads");
      const int tpr = pl.threads / pl.rows_per_block;
      if (!is_pow2(tpr) || tpr < 32 || tpr > kFwdMaxTeam)
        return plan_error(pl, "threads per row must be a power of two from 32 to 512");
      if (int64_t(tpr) * pl.iters * pl.cluster < nvec) return plan_error(pl, "threads x iters do not cover the row");
      if (pl.kind == NormKernel::kFwdRow) {
        if (pl.threads > kFwdRowMaxBlock && !(pl.threads == kFwdRowBigBlock && pl.iters == 2))
          return plan_error(pl, "fwd_row blocks over 256 threads are 512 threads with iters=2");
        if (pl.early_params && (pl.scalar_head || pl.plain_ada || pl.threads > kFwdRowMaxBlock))
          return plan_error(pl, "early_params: blocks of up to 256 threads, no scalar head, not plain_ada");
        if (pl.plain_ada && !plain_ok) return plan_error(pl, "plain_ada needs AdaLN without weight and bias");
      } else {
        if (pl.cluster < 1 || pl.cluster > kMaxClusterCtas) return plan_error(pl, "cluster must be 1 to 8");
        if (pl.cluster > 1 && (!sm90 || pl.rows_per_block != 1))
          return plan_error(pl, "clusters need sm_90 and one row per CTA");
      }
      return Status::Ok();
    }
    case NormKernel::kFwdBulk: {
      if (!sm90 || pl.vec == 1) return plan_error(pl, "fwd_bulk needs sm_90 and 16-byte vectors");
      if (pl.cluster < 1 || pl.cluster > kMaxClusterCtas || pr.n % pl.cluster != 0 ||
          ((pr.n / pl.cluster) * pr.elem_bytes) % 16 != 0)
        return plan_error(pl, "cluster must be 1 to 8 and divide the row into 16-byte slices");
      const int64_t slice = pr.n * pr.elem_bytes / pl.cluster, nbuf = pr.op == NormOp::kAddRms ? 2 : 1;
      if (pl.stages < 1 || pl.stages > kBulkMaxStages) return plan_error(pl, "stages must be 1 to 4");
      if (pl.stages * nbuf * slice > int64_t(kMaxDynamicSmem)) return plan_error(pl, "stages exceed 200 KB");
      if (!is_pow2(pl.threads) || pl.threads > 512) return plan_error(pl, "threads must be a power of two <= 512");
      if ((pl.params_in_regs || pl.params_per_vector) && !bulk_params_in_regs_op(pr.op))
        return plan_error(pl, "parameter variants exist for rms_norm and layer_norm only");
      if (pl.params_in_regs && pl.params_per_vector)
        return plan_error(pl, "params_in_regs and params_per_vector exclude each other");
      if (pl.params_in_regs && (pr.n / pl.cluster) / pl.vec > int64_t(pl.threads) * kBulkParamVecs)
        return plan_error(pl, "params_in_regs holds 8 vectors per thread: the slice is longer");
      return Status::Ok();
    }
    case NormKernel::kFwdStream:
      if (pl.threads != kFwdStreamThreads || pl.scalar_head) return plan_error(pl, "fwd_stream runs 1024 threads");
      return Status::Ok();
    case NormKernel::kBwdRegs:
    case NormKernel::kBwdRegsBulk: {
      const int max_iters = pl.scalar_head ? std::min(4, bwd_max_iters(pl.vec)) : bwd_max_iters(pl.vec);
      if (!vec_iters_ok(pl.iters, max_iters))
        return plan_error(pl, "iters must be a power of two up to " + std::to_string(max_iters));
      if (pl.threads > kBwdMaxTeam) return plan_error(pl, "threads must be at most 512");
      if (int64_t(pl.threads) * pl.iters < nvec) return plan_error(pl, "threads x iters do not cover the row");
      if (pl.kind == NormKernel::kBwdRegsBulk) {
        if (!sm90 || pl.vec == 1 || pl.scalar_head) return plan_error(pl, "staged rows need sm_90 and 16-byte rows");
        if (pl.stages < 1 || pl.stages > kBulkMaxStages ||
            pl.stages * bwd_row_stage_bytes(pr) > int64_t(kMaxDynamicSmem))
          return plan_error(pl, "stages must be 1 to 4 and fit 200 KB");
      }
      return Status::Ok();
    }
    case NormKernel::kBwdChunk: {
      if (!sm90 || pl.vec == 1) return plan_error(pl, "bwd_chunk needs sm_90 and 16-byte vectors");
      if (norm_is_ada(pr.op) && pr.ada_rpg == 1)
        return plan_error(pl, "bwd_chunk does not write per-row AdaLN dscale/dshift");
      if (pl.iters < 1 || pl.iters > 2 || pl.chunk_rows < 1 || pl.chunk_rows > kBwdChunkMaxRows[pl.iters])
        return plan_error(pl, "bwd_chunk takes iters 1 (up to 8 rows per chunk) or 2 (up to 2)");
      if (pl.threads > 512 || int64_t(pl.threads) * pl.iters < nvec)
        return plan_error(pl, "threads (<= 512) x iters do not cover the row");
      if (pl.stages < 1 || pl.stages > kBulkMaxStages ||
          int64_t(pl.stages) * pl.chunk_rows * bwd_row_stage_bytes(pr) > int64_t(kMaxDynamicSmem))
        return plan_error(pl, "stages must be 1 to 4 and fit 200 KB");
      return Status::Ok();
    }
    case NormKernel::kBwdSplit:
      if (pl.vec == 1 || pl.threads != kSplitTeam || pl.iters != kSplitIters)
        return plan_error(pl, "bwd_split runs 16-byte vectors, 256 threads, iters=2");
      return Status::Ok();
    case NormKernel::kBwdStream:
      if (pl.threads != kBwdStreamTeam) return plan_error(pl, "bwd_stream runs 512 threads");
      return Status::Ok();
  }
  return plan_error(pl, "unknown kernel kind");
}

}  // namespace kernelforge
