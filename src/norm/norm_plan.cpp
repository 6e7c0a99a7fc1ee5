// Problem -> plan for the normalization family: the arithmetic that reads the tables of
// norm_plan_tables.h. candidate_plans and check_plan: norm_plan_candidates.cpp.
#include "norm/norm_plan.h"

#include <algorithm>
#include <climits>
#include <cstdint>

#include "common/align.h"
#include "common/math.h"
#include "norm/norm_plan_tables.h"

namespace kernelforge {
namespace norm_plan {

namespace {

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

}  // namespace

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

namespace {

// The default bulk plan: the smallest cluster whose slices are at most kBulkSliceBytes and divide the row.
bool fwd_bulk_default(const NormProblem& pr, const DeviceInfo& dev, NormPlan* out) {
  if (!pr.can_vectorize || dev.capability < 90) return false;
  const int64_t row_bytes = pr.n * pr.elem_bytes;
  if (row_bytes < bulk_min_row_bytes(pr.op) || pr.rows < int64_t(dev.sm_count) * kBulkMinWaves) return false;
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
// ---- backward ------------------------------------------------------------------------------------
}  // namespace

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

namespace {

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

}  // namespace
}  // namespace norm_plan

using namespace norm_plan;

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

}  // namespace kernelforge
