// The skinny linear planner: the kernel, its compiled tile and the K split. Each CTA owns 128 output
// columns, so N = 4096 gives 32 CTAs for 132 SMs unless K is split. For each split count s the
// model counts CTA waves (over two resident CTAs per SM) times the K tiles per CTA plus a fixed cost
// per CTA (the ring's fill and the epilogue, about kCtaOverheadTiles tiles) and, for the cp.async
// kernel, the separate reduction when s > 1; the smallest cost wins, the smaller s on ties. A split
// covers at least kMinSplitTiles tiles.
// Kernel: the TMA kernel whenever it can run the call (sm_90, a 90a build, TMA-aligned x and w) and
// its best cost with at most 8 splits (one cluster per column block) is no worse than the cp.async
// kernel's with up to 64: the TMA copies are the faster path per tile, the cluster size caps its
// splits, so narrow outputs (N <= 2048: at most 16 column blocks x 8 splits for 264 CTA slots) stay on
// the cp.async kernel's deeper split.
// The GEMV kernel takes calls of M <= kLinearGemvPlanRows (1) when the caller's `gemv` switch is on and
// LinearParams::gemv holds; it has one tile and no K split. M = 2 to 4 are its candidates only.
#include "linear/linear_plan.h"

#include <cstdint>
#include <string>
#include <vector>

#include "common/device.h"
#include "common/math.h"
#include "linear/linear_config.h"

namespace kernelforge {

namespace {

constexpr int64_t kMinSplitTiles = 4;  // 256 columns of K
constexpr int64_t kCtaOverheadTiles = 2;
constexpr int64_t kReduceTiles = 1;
constexpr int64_t kMaxSplits = 64;
constexpr int64_t kResident = 2;  // CTAs per SM (83 KB of shared memory each, 109 KB for the TMA kernel)

struct Split {
  int splits;
  int64_t cost;
};

Split best_split(const LinearParams& p, const DeviceInfo& dev, const LinearTile& c, int64_t max_splits,
                 int64_t reduce_tiles) {
  const int64_t tiles_n = ceil_div(p.N > 0 ? p.N : 1, int64_t(c.block_n));
  const int64_t tiles_k = ceil_div(p.K > 0 ? p.K : 1, int64_t(c.block_k));
  const int64_t slots = int64_t(dev.sm_count > 0 ? dev.sm_count : 1) * kResident;
  int64_t max_s = tiles_k / kMinSplitTiles;
  max_s = max_s < 1 ? 1 : (max_s > max_splits ? max_splits : max_s);
  int64_t best_s = 1, best = -1;
  for (int64_t s = 1; s <= max_s; ++s) {
    const int64_t cost =
        ceil_div(tiles_n * s, slots) * (ceil_div(tiles_k, s) + kCtaOverheadTiles) + (s > 1 ? reduce_tiles : 0);
    if (best < 0 || cost < best) best = cost, best_s = s;
  }
  return {int(best_s), best};
}

LinearPlan tile_plan(LinearKernel kernel, const LinearTile& c, int splits) {
  LinearPlan plan;
  plan.kernel = kernel;
  plan.block_n = c.block_n;
  plan.block_k = c.block_k;
  plan.warps = c.warps;
  plan.stages = c.stages;
  plan.splits = splits;
  return plan;
}

// Why the TMA kernel cannot run the call, or an empty string.
std::string tma_unsupported(const LinearParams& p, const DeviceInfo& dev, bool tma_built) {
  if (dev.capability != 90) return "needs an sm_90 device";
  if (!tma_built) return "is not in this build (KF_CUDA_ARCHS without 90a-real)";
  if (!p.tma) return "needs x and w 16-byte aligned, row strides of 16-byte multiples and K >= 8";
  return "";
}

}  // namespace

LinearPlan gemv_plan() {
  constexpr LinearGemvTile c = kLinearGemvTile;
  LinearPlan plan;
  plan.kernel = LinearKernel::kGemv;
  plan.block_n = c.rows;
  plan.block_k = linear_gemv_k_round(c);
  plan.warps = c.warps;
  plan.stages = 1;
  plan.splits = 1;
  return plan;
}

std::string to_string(const LinearPlan& plan) {
  if (plan.kernel == LinearKernel::kGemv)
    return "linear_gemv rows=" + std::to_string(plan.block_n) + " k_round=" + std::to_string(plan.block_k) +
           " warps=" + std::to_string(plan.warps);
  const bool tma = plan.kernel == LinearKernel::kTma;
  return std::string(tma ? "linear_skinny_tma" : "linear_skinny") + " tile=" + std::to_string(plan.block_n) + "x" +
         std::to_string(plan.block_k) + " warps=" + std::to_string(plan.warps) + (tma ? "+1" : "") +
         " stages=" + std::to_string(plan.stages) + " splits=" + std::to_string(plan.splits);
}

std::vector<LinearPlan> linear_candidate_plans(const LinearParams& p, const DeviceInfo& dev, bool tma_built) {
  std::vector<LinearPlan> plans;
  plans.push_back(
      tile_plan(LinearKernel::kCpAsync, kLinearTile, best_split(p, dev, kLinearTile, kMaxSplits, kReduceTiles).splits));
  if (tma_unsupported(p, dev, tma_built).empty())
    plans.push_back(tile_plan(LinearKernel::kTma, kLinearTmaTile,
                              best_split(p, dev, kLinearTmaTile, kLinearTmaMaxSplits, 0).splits));
  if (p.gemv) plans.push_back(gemv_plan());
  return plans;
}

LinearPlan plan_linear(const LinearParams& p, const DeviceInfo& dev, bool tma_built, bool gemv) {
  if (gemv && p.gemv && p.M <= kLinearGemvPlanRows) return gemv_plan();
  const Split cp = best_split(p, dev, kLinearTile, kMaxSplits, kReduceTiles);
  if (tma_unsupported(p, dev, tma_built).empty()) {
    const Split tma = best_split(p, dev, kLinearTmaTile, kLinearTmaMaxSplits, 0);
    if (tma.cost <= cp.cost) return tile_plan(LinearKernel::kTma, kLinearTmaTile, tma.splits);
  }
  return tile_plan(LinearKernel::kCpAsync, kLinearTile, cp.splits);
}

Status check_linear_plan(const LinearPlan& plan, const LinearParams& p, const DeviceInfo& dev) {
  if (plan.kernel == LinearKernel::kGemv) {
    const LinearPlan g = gemv_plan();
    if (plan.block_n != g.block_n || plan.block_k != g.block_k || plan.warps != g.warps || plan.stages != g.stages ||
        plan.splits != 1)
      return Status::Invalid("linear: plan " + to_string(plan) + ": no such kernel is built (" + to_string(g) +
                             ", splits 1)");
    if (!p.gemv)
      return Status::NotSupported("linear: plan " + to_string(plan) +
                                  ": the GEMV kernel needs M <= 4, K a multiple of 8, x and w 16-byte aligned and "
                                  "row strides of 8-element multiples");
    if (ceil_div(p.N, int64_t(g.block_n)) > INT32_MAX) return Status::Invalid("linear: N is too large for the grid");
    return Status::Ok();
  }
  const bool tma = plan.kernel == LinearKernel::kTma;
  if (!tma && plan.kernel != LinearKernel::kCpAsync)
    return Status::Invalid("linear: plan " + to_string(plan) + ": unknown kernel");
  const LinearTile c = tma ? kLinearTmaTile : kLinearTile;
  if (plan.block_n != c.block_n || plan.block_k != c.block_k || plan.warps != c.warps || plan.stages != c.stages)
    return Status::Invalid("linear: plan " + to_string(plan) + ": no such kernel is built");
  const int max_splits = tma ? kLinearTmaMaxSplits : 65535;
  if (plan.splits < 1 || plan.splits > max_splits)
    return Status::Invalid("linear: plan " + to_string(plan) + ": splits must be 1 to " + std::to_string(max_splits));
  const int64_t tiles_n = ceil_div(p.N, int64_t(c.block_n));
  if ((tma ? tiles_n * plan.splits : tiles_n) > INT32_MAX)
    return Status::Invalid("linear: N is too large for the grid");
  if (tma) {  // tma_built is checked by the launcher (the kernel's binary version)
    const std::string why = tma_unsupported(p, dev, true);
    if (!why.empty()) return Status::NotSupported("linear: plan " + to_string(plan) + ": the TMA kernel " + why);
  }
  return Status::Ok();
}

size_t linear_workspace_bytes(const LinearPlan& plan, const LinearParams& p) {
  if (plan.splits <= 1 || plan.kernel != LinearKernel::kCpAsync) return 0;
  return (size_t(plan.splits) * size_t(p.M) * size_t(p.N) * sizeof(float) + 255) / 256 * 256;
}

}  // namespace kernelforge
