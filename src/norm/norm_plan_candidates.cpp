// Every plan that can run a normalization problem (candidate_plans: the tests run them all, dev/
// sweeps time them) and the check that a given plan can (check_plan: unknown or impossible plans are
// errors naming what does not fit).
#include <string>
#include <vector>

#include "norm/norm_plan.h"
#include "norm/norm_plan_tables.h"

namespace kernelforge {

using namespace norm_plan;

namespace {
Status plan_error(const NormPlan& plan, const std::string& why) {
  return Status::Invalid("norm plan " + to_string(plan) + ": " + why);
}
}  // namespace

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
