// The grouped_mm planner: GmmProblem -> GroupedMmPlan, host code only.
//
// Two kernels: wgmma (sm_90a, CUTLASS's TMA + wgmma grouped GEMM, src/grouped_mm/sm90/) for every
// TMA-aligned call on an sm_90 GPU of a build that has it, and mma (kernels/gmm_mma.cuh) for the rest.
// The wgmma kernel has one tile, 128 x 256 x 64 with clusters of two CTAs (gmm_wgmma.cuh says why);
// its grid is persistent (CUTLASS sizes it from the SM count).
#include <string>

#include "grouped_mm/grouped_mm_problem.h"
#include "grouped_mm/kernels/gmm_tiles.h"

namespace kernelforge {

namespace {

const char* op_name(GroupedMmOp op) {
  switch (op) {
    case GroupedMmOp::kRowsWRow:
      return "rows/w-row";
    case GroupedMmOp::kRowsWCol:
      return "rows/w-col";
    case GroupedMmOp::kWgrad:
      return "wgrad";
  }
  return "?";
}

int64_t cdiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

GroupedMmPlan mma_plan(const GmmProblem& pr) {
  GroupedMmPlan p;
  p.kernel = GroupedMmKernel::kMma;
  p.op = pr.op;
  p.tile_m = kGmmMmaBM, p.tile_n = kGmmMmaBN, p.tile_k = kGmmMmaBK;
  if (pr.op == GroupedMmOp::kWgrad)
    p.grid = int64_t(pr.groups) * cdiv(pr.n, kGmmMmaBM) * cdiv(pr.k, kGmmMmaBN);
  else
    p.grid = (cdiv(pr.t, kGmmMmaBM) + pr.groups) * cdiv(pr.n, kGmmMmaBN);
  return p;
}

GroupedMmPlan wgmma_plan(const GmmProblem& pr, const DeviceInfo& dev) {
  GroupedMmPlan p;
  p.kernel = GroupedMmKernel::kWgmma;
  p.op = pr.op;
  p.tile_m = kGmmWgmmaTileM, p.tile_n = kGmmWgmmaTileN, p.tile_k = kGmmWgmmaTileK;
  p.cluster_m = kGmmWgmmaClusterM;
  p.grid = dev.sm_count;
  return p;
}

// Whether the call writes anything: rows ops need rows and columns; wgrad needs N and K (T = 0 still
// writes dw = 0).
bool has_work(const GmmProblem& pr) {
  return pr.op == GroupedMmOp::kWgrad ? pr.n > 0 && pr.k > 0 : pr.t > 0 && pr.n > 0;
}

// The wgmma kernel takes non-empty reductions only (K = 0 and an all-empty wgrad go to mma, which
// writes the zeros).
bool wgmma_fits(const GmmProblem& pr, const DeviceInfo& dev, bool built) {
  return built && dev.capability == 90 && pr.tma_aligned && has_work(pr) &&
         (pr.op == GroupedMmOp::kWgrad ? pr.t > 0 : pr.k > 0);
}

}  // namespace

std::string to_string(const GroupedMmPlan& p) {
  std::string s = p.kernel == GroupedMmKernel::kWgmma ? "grouped_mm_wgmma " : "grouped_mm_mma ";
  s += op_name(p.op);
  s += " tile=" + std::to_string(p.tile_m) + "x" + std::to_string(p.tile_n) + "x" + std::to_string(p.tile_k);
  if (p.kernel == GroupedMmKernel::kWgmma) s += " cluster=" + std::to_string(p.cluster_m);
  s += " grid=" + std::to_string(p.grid);
  if (p.workspace > 0) s += " ws=" + std::to_string(p.workspace);
  return s;
}

GroupedMmPlan plan_grouped_mm(const GmmProblem& pr, const DeviceInfo& dev, bool wgmma_built) {
  if (!has_work(pr)) {
    GroupedMmPlan p = mma_plan(pr);
    p.grid = 0;  // nothing to launch
    return p;
  }
  return wgmma_fits(pr, dev, wgmma_built) ? wgmma_plan(pr, dev) : mma_plan(pr);
}

std::vector<GroupedMmPlan> candidate_plans(const GmmProblem& pr, const DeviceInfo& dev, bool wgmma_built) {
  std::vector<GroupedMmPlan> v;
  if (!has_work(pr)) return v;
  if (wgmma_fits(pr, dev, wgmma_built)) v.push_back(wgmma_plan(pr, dev));
  v.push_back(mma_plan(pr));
  return v;
}

Status check_plan(const GroupedMmPlan& plan, const GmmProblem& pr, const DeviceInfo& dev, bool wgmma_built) {
  if (plan.op != pr.op) return Status::Invalid("grouped_mm: plan " + to_string(plan) + " is for another product");
  if (plan.kernel == GroupedMmKernel::kWgmma) {
    if (!wgmma_fits(pr, dev, wgmma_built))
      return Status::NotSupported("grouped_mm: plan " + to_string(plan) +
                                  " needs a build with CUTLASS, an sm_90 GPU, a non-empty reduction and "
                                  "16-byte aligned operands (N, K and strides multiples of 8)");
    return Status::Ok();
  }
  if (plan.tile_m != kGmmMmaBM || plan.tile_n != kGmmMmaBN || plan.tile_k != kGmmMmaBK)
    return Status::Invalid("grouped_mm: no mma kernel built for " + to_string(plan));
  if (pr.op != GroupedMmOp::kWgrad && cdiv(pr.n, kGmmMmaBN) > 65535)
    return Status::NotSupported("grouped_mm: N = " + std::to_string(pr.n) + " exceeds the mma kernel's " +
                                std::to_string(int64_t(65535) * kGmmMmaBN) + " columns");
  if (plan.grid > (int64_t(1) << 31) - 1) return Status::NotSupported("grouped_mm: too many tiles for one grid");
  return Status::Ok();
}

}  // namespace kernelforge
