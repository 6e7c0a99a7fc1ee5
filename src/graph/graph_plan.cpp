// The graph planner (see graph_plan.h): vector width from F and the alignment, tile size from
// kGraphTiles, block shape from the vector count.
#include "graph/graph_plan.h"

#include <algorithm>
#include <cstdint>

#include "common/math.h"

namespace kernelforge {

namespace {

// Positions per tile of the gather-reduce by the amount of work (positions x 16-byte vectors of a
// bf16 row). A thread walks its tile's positions in order (4 loads in flight), so a tile must be
// long enough to amortize the binary search that finds its first segment (~log2(N) dependent L2
// loads) and short enough to leave several waves of threads: 20M edges x 128 bf16 features is
// 78k tiles of 256 x 16 threads = 1.25M threads, ~4.6 waves of 270k resident threads on an H100.
struct GraphTileRow {
  int64_t min_work;
  int64_t tile_rows;
};
constexpr GraphTileRow kGraphTiles[] = {
    {int64_t(1) << 24, 256},
    {int64_t(1) << 20, 64},
    {0, 16},
};

// The smallest tile a test plan may take: many segments then span several tiles (the combine path).
constexpr int64_t kGraphMinTile = 4;

int vec_of(const GraphProblem& pr, bool wide) { return wide ? 16 / pr.elem_bytes : 1; }

int64_t items_of(const GraphProblem& pr, int64_t tile_rows) {
  if (pr.kind == GraphKernel::kEdgeDot) return pr.nnz;
  return ceil_div(pr.nnz, tile_rows);
}

GraphPlan with_shape(const GraphProblem& pr, int vec, int64_t tile_rows) {
  GraphPlan plan;
  plan.kind = pr.kind;
  plan.vec = vec;
  plan.tile_rows = pr.kind == GraphKernel::kEdgeDot ? 0 : tile_rows;
  const int64_t nv = ceil_div(pr.features, vec);
  const int cap = pr.kind == GraphKernel::kEdgeDot ? 32 : kGraphThreads;  // edge_dot: a group within a warp
  plan.tx = std::min(pow2_ceil(nv), cap);
  plan.ty = kGraphThreads / plan.tx;
  plan.grid_y = pr.kind == GraphKernel::kEdgeDot ? 1 : int(ceil_div(nv, plan.tx));
  plan.grid_x = std::max<int64_t>(1, ceil_div(items_of(pr, tile_rows), plan.ty));
  return plan;
}

bool same_plan(const GraphPlan& a, const GraphPlan& b) {
  return a.kind == b.kind && a.vec == b.vec && a.tx == b.tx && a.ty == b.ty && a.grid_y == b.grid_y &&
         a.tile_rows == b.tile_rows && a.grid_x == b.grid_x;
}

}  // namespace

std::string to_string(const GraphPlan& plan) {
  const char* k = plan.kind == GraphKernel::kTile      ? "seg_tile"
                  : plan.kind == GraphKernel::kExpand  ? "seg_expand"
                  : plan.kind == GraphKernel::kEdgeDot ? "edge_dot"
                                                       : "graph_unknown";
  std::string s = std::string(k) + " vec=" + std::to_string(plan.vec);
  if (plan.kind != GraphKernel::kEdgeDot) s += " tile=" + std::to_string(plan.tile_rows);
  return s + " block=" + std::to_string(plan.tx) + "x" + std::to_string(plan.ty) +
         " grid=" + std::to_string(plan.grid_x) + "x" + std::to_string(plan.grid_y);
}

int64_t graph_tile_rows(int64_t nnz, int64_t features) {
  const int64_t work = nnz * ceil_div(features, 8);
  for (const GraphTileRow& r : kGraphTiles)
    if (work >= r.min_work) return r.tile_rows;
  return kGraphTiles[sizeof(kGraphTiles) / sizeof(kGraphTiles[0]) - 1].tile_rows;
}

size_t graph_workspace_bytes(int64_t tile_rows, int64_t nnz, int64_t features, bool max) {
  if (nnz <= 0 || features <= 0 || tile_rows <= 0) return 0;
  const int64_t slots = 2 * ceil_div(nnz, tile_rows) * features;
  return size_t(slots) * (max ? 8 : 4);
}

GraphProblem make_graph_problem(GraphOp op, const GraphParams& p, int elem_bytes) {
  GraphProblem pr;
  pr.kind = op == GraphOp::kGatherReduce ? GraphKernel::kTile
            : op == GraphOp::kExpand     ? GraphKernel::kExpand
                                         : GraphKernel::kEdgeDot;
  pr.elem_bytes = elem_bytes;
  pr.nnz = p.nnz;
  pr.nseg = p.nseg;
  pr.features = p.features;
  // 16-byte vectors: F a multiple of the vector, every row base 16-byte aligned (dw of edge_dot is
  // written one element per edge and does not count).
  const int64_t vec = 16 / elem_bytes;
  uintptr_t bits = reinterpret_cast<uintptr_t>(p.x) | uintptr_t(p.x_stride * elem_bytes);
  bits |= reinterpret_cast<uintptr_t>(p.argmax) | reinterpret_cast<uintptr_t>(p.mask_arg);  // int32 [., F]
  if (op == GraphOp::kEdgeDot)
    bits |= reinterpret_cast<uintptr_t>(p.g) | uintptr_t(p.g_stride * elem_bytes);
  else
    bits |= reinterpret_cast<uintptr_t>(p.out) | uintptr_t(p.out_stride * elem_bytes);
  pr.wide_ok = p.features % vec == 0 && bits % 16 == 0;
  return pr;
}

GraphPlan plan_graph(const GraphProblem& pr) {
  return with_shape(pr, vec_of(pr, pr.wide_ok), graph_tile_rows(pr.nnz, pr.features));
}

std::vector<GraphPlan> candidate_plans(const GraphProblem& pr) {
  std::vector<GraphPlan> plans;
  if (pr.nseg <= 0 || pr.features <= 0) return plans;
  plans.push_back(plan_graph(pr));
  const int64_t tiles[] = {graph_tile_rows(pr.nnz, pr.features), kGraphMinTile, 32};
  for (bool wide : {true, false}) {
    if (wide && !pr.wide_ok) continue;
    for (int64_t t : tiles) {
      const GraphPlan plan = with_shape(pr, vec_of(pr, wide), t);
      bool seen = false;
      for (const GraphPlan& q : plans) seen = seen || same_plan(q, plan);
      if (!seen) plans.push_back(plan);
    }
  }
  return plans;
}

Status check_plan(const GraphPlan& plan, const GraphProblem& pr) {
  auto fail = [&](const std::string& why) { return Status::Invalid("graph plan " + to_string(plan) + ": " + why); };
  if (plan.kind != pr.kind) return fail("the plan is for another kernel than the call's");
  if (plan.vec != 1 && !(plan.vec == 16 / pr.elem_bytes && pr.wide_ok))
    return fail("16-byte vectors do not fit F = " + std::to_string(pr.features) + " or the row alignment");
  if (plan.tx < 1 || (plan.tx & (plan.tx - 1)) != 0 || plan.tx * plan.ty != kGraphThreads)
    return fail("the block must be a power-of-two tx times ty = 256 threads");
  if (plan.kind == GraphKernel::kEdgeDot && plan.tx > 32) return fail("edge_dot groups are at most a warp");
  if (plan.kind != GraphKernel::kEdgeDot && plan.tile_rows < 1) return fail("tile_rows must be positive");
  const int64_t nv = ceil_div(pr.features, plan.vec);
  if (plan.kind != GraphKernel::kEdgeDot && int64_t(plan.grid_y) * plan.tx < nv)
    return fail("the grid does not cover the " + std::to_string(nv) + " feature vectors");
  if (plan.grid_y > 65535) return fail("grid_y must be at most 65535");
  if (plan.grid_x * plan.ty < items_of(pr, plan.tile_rows)) return fail("the grid does not cover every item");
  if (plan.grid_x > (int64_t(1) << 31) - 1) return fail("grid_x must be below 2^31");
  return Status::Ok();
}

}  // namespace kernelforge
