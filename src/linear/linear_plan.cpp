// The skinny linear planner: the one compiled tile and the K split. Each CTA owns 128 output
// columns, so N = 4096 gives 32 CTAs for 132 SMs unless K is split. For each split count s the
// model counts CTA waves (over two resident CTAs per SM) times the K tiles per CTA plus a fixed cost
// per CTA (the ring's fill and the epilogue, about kCtaOverheadTiles tiles) and the reduction when
// s > 1; the smallest cost wins, the smaller s on ties. A split covers at least kMinSplitTiles tiles.
#include "linear/linear_plan.h"

#include <cstdint>
#include <string>

#include "common/device.h"
#include "common/math.h"
#include "linear/linear_config.h"

namespace kernelforge {

namespace {

constexpr int64_t kMinSplitTiles = 4;  // 256 columns of K
constexpr int64_t kCtaOverheadTiles = 2;
constexpr int64_t kReduceTiles = 1;
constexpr int64_t kMaxSplits = 64;
constexpr int64_t kResident = 2;  // CTAs per SM (83 KB of shared memory each)

}  // namespace

std::string to_string(const LinearPlan& plan) {
  return "linear_skinny tile=" + std::to_string(plan.block_n) + "x" + std::to_string(plan.block_k) +
         " warps=" + std::to_string(plan.warps) + " stages=" + std::to_string(plan.stages) +
         " splits=" + std::to_string(plan.splits);
}

LinearPlan plan_linear(const LinearParams& p, const DeviceInfo& dev) {
  LinearPlan plan;
  plan.block_n = kLinearTile.block_n;
  plan.block_k = kLinearTile.block_k;
  plan.warps = kLinearTile.warps;
  plan.stages = kLinearTile.stages;
  const int64_t tiles_n = ceil_div(p.N > 0 ? p.N : 1, int64_t(plan.block_n));
  const int64_t tiles_k = ceil_div(p.K > 0 ? p.K : 1, int64_t(plan.block_k));
  const int64_t slots = int64_t(dev.sm_count > 0 ? dev.sm_count : 1) * kResident;
  int64_t max_s = tiles_k / kMinSplitTiles;
  max_s = max_s < 1 ? 1 : (max_s > kMaxSplits ? kMaxSplits : max_s);
  int64_t best_s = 1, best = -1;
  for (int64_t s = 1; s <= max_s; ++s) {
    const int64_t cost =
        ceil_div(tiles_n * s, slots) * (ceil_div(tiles_k, s) + kCtaOverheadTiles) + (s > 1 ? kReduceTiles : 0);
    if (best < 0 || cost < best) best = cost, best_s = s;
  }
  plan.splits = int(best_s);
  return plan;
}

Status check_linear_plan(const LinearPlan& plan, const LinearParams& p) {
  const LinearTile c = kLinearTile;
  if (plan.block_n != c.block_n || plan.block_k != c.block_k || plan.warps != c.warps || plan.stages != c.stages)
    return Status::Invalid("linear: plan " + to_string(plan) + ": no such kernel is built");
  if (plan.splits < 1 || plan.splits > 65535)
    return Status::Invalid("linear: plan " + to_string(plan) + ": splits must be 1 to 65535");
  if (ceil_div(p.N, int64_t(c.block_n)) > INT32_MAX) return Status::Invalid("linear: N is too large for the grid");
  return Status::Ok();
}

size_t linear_workspace_bytes(const LinearPlan& plan, const LinearParams& p) {
  if (plan.splits <= 1) return 0;
  return (size_t(plan.splits) * size_t(p.M) * size_t(p.N) * sizeof(float) + 255) / 256 * 256;
}

}  // namespace kernelforge
