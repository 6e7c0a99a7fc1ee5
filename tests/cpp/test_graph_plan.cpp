// The graph planner without a GPU: the tile table, the vector width from F and the alignment, the
// block shape, candidate plans (each passes check_plan, the production plan first), check_plan's
// rejections and the workspace size.
#include "graph/graph_plan.h"
#include "test_util.h"

namespace {

namespace kf = kernelforge;
using kf::GraphKernel;
using kf::GraphPlan;
using kf::GraphProblem;

GraphProblem problem(GraphKernel kind, int elem, int64_t nnz, int64_t nseg, int64_t f, bool wide) {
  GraphProblem p;
  p.kind = kind, p.elem_bytes = elem, p.nnz = nnz, p.nseg = nseg, p.features = f, p.wide_ok = wide;
  return p;
}

TEST(GraphPlan, TileRowsGrowWithTheWork) {
  EXPECT_EQ(kf::graph_tile_rows(20000000, 128), 256);  // the 1M-node / 20M-edge bench graph
  EXPECT_EQ(kf::graph_tile_rows(200000, 128), 64);
  EXPECT_EQ(kf::graph_tile_rows(1000, 1), 16);
}

TEST(GraphPlan, VectorWidthAndBlock) {
  const GraphPlan bf = kf::plan_graph(problem(GraphKernel::kTile, 2, 20000000, 1000000, 128, true));
  EXPECT_EQ(bf.vec, 8);
  EXPECT_EQ(bf.tx, 16);
  EXPECT_EQ(bf.ty, 16);
  EXPECT_EQ(bf.grid_y, 1);
  EXPECT_EQ(bf.tile_rows, 256);
  EXPECT_EQ(bf.grid_x, (20000000 / 256 + 1 + 15) / 16) << kf::to_string(bf);
  const GraphPlan narrow = kf::plan_graph(problem(GraphKernel::kTile, 4, 1000, 10, 1024, false));
  EXPECT_EQ(narrow.vec, 1);
  EXPECT_EQ(narrow.tx, 256);
  EXPECT_EQ(narrow.grid_y, 4);
  const GraphPlan dot = kf::plan_graph(problem(GraphKernel::kEdgeDot, 2, 5000, 10, 1024, true));
  EXPECT_EQ(dot.tx, 32);  // a group of lanes within one warp
  EXPECT_EQ(dot.ty, 8);
  EXPECT_EQ(dot.grid_x, 625);
  EXPECT_EQ(kf::to_string(bf).rfind("seg_tile vec=8 tile=256 block=16x16", 0), 0u) << kf::to_string(bf);
}

TEST(GraphPlan, CandidatesPassCheckPlan) {
  for (GraphKernel k : {GraphKernel::kTile, GraphKernel::kExpand, GraphKernel::kEdgeDot})
    for (int64_t f : {1, 7, 8, 64, 1024})
      for (bool wide : {false, true}) {
        const GraphProblem pr = problem(k, 2, 3001, 50, f, wide && f % 8 == 0);
        const std::vector<GraphPlan> plans = kf::candidate_plans(pr);
        ASSERT_FALSE(plans.empty());
        EXPECT_EQ(plans.front().tile_rows, k == GraphKernel::kEdgeDot ? 0 : kf::graph_tile_rows(3001, f));
        for (const GraphPlan& p : plans) EXPECT_TRUE(kf::check_plan(p, pr).ok()) << kf::to_string(p);
        bool small_tile = false;
        for (const GraphPlan& p : plans) small_tile = small_tile || p.tile_rows == 4;
        EXPECT_EQ(small_tile, k != GraphKernel::kEdgeDot);  // the combine path with many partials
      }
  EXPECT_TRUE(kf::candidate_plans(problem(GraphKernel::kTile, 2, 0, 0, 8, true)).empty());
}

TEST(GraphPlan, CheckPlanRejects) {
  const GraphProblem pr = problem(GraphKernel::kTile, 2, 3001, 50, 33, false);
  GraphPlan p = kf::plan_graph(pr);
  GraphPlan wide = p;
  wide.vec = 8;
  EXPECT_TRUE(kftest::has_substrings(kf::check_plan(wide, pr), {"16-byte vectors do not fit F = 33"}));
  GraphPlan block = p;
  block.ty = 3;
  EXPECT_TRUE(kftest::has_substrings(kf::check_plan(block, pr), {"256 threads"}));
  GraphPlan cover = p;
  cover.grid_x = 1;
  EXPECT_TRUE(kftest::has_substrings(kf::check_plan(cover, pr), {"does not cover every item"}));
  GraphPlan kind = p;
  kind.kind = GraphKernel::kExpand;
  EXPECT_TRUE(kftest::has_substrings(kf::check_plan(kind, pr), {"another kernel"}));
}

TEST(GraphPlan, WorkspaceBytes) {
  EXPECT_EQ(kf::graph_workspace_bytes(256, 20000000, 128, false), size_t(2) * 78125 * 128 * 4);
  EXPECT_EQ(kf::graph_workspace_bytes(4, 10, 3, true), size_t(2) * 3 * 3 * 8);
  EXPECT_EQ(kf::graph_workspace_bytes(16, 0, 3, true), 0u);
  EXPECT_EQ(kf::gather_reduce_workspace_bytes(1000, 8, kf::GraphReduce::kSum),
            kf::graph_workspace_bytes(kf::graph_tile_rows(1000, 8), 1000, 8, false));
}

}  // namespace
