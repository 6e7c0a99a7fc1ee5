// The graph planner: GraphProblem -> GraphPlan, pure host code over the small tables in
// graph_plan.cpp (no CUDA code: unit-tested on machines without a GPU).
//
// Layout shared by the kernels: block (tx, ty) = tx threads along the features (one vector of `vec`
// elements each), ty work items (tiles of positions, segments or edges); grid (item groups, feature
// chunks). The plan picks the vector width (16 bytes when F and every row allow it, else one
// element), the tile size of the gather-reduce and the block shape.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/device.h"
#include "graph/graph_problem.h"
#include "kernelforge/status.h"

namespace kernelforge {

constexpr int kGraphThreads = 256;  // threads per block (tx * ty), the kernels' __launch_bounds__

enum class GraphKernel : int {
  kTile = 0,     // seg_tile + seg_combine: gather-reduce over position tiles, then the long segments
  kExpand = 1,   // seg_expand: dx rows from their segment's dout row
  kEdgeDot = 2,  // edge_dot: one dot product per edge
};

struct GraphPlan {
  GraphKernel kind = GraphKernel::kTile;
  int vec = 1;            // elements per vector
  int tx = 32;            // threads along the features (a power of two)
  int ty = 8;             // items per block
  int grid_y = 1;         // feature chunks of tx * vec elements
  int64_t tile_rows = 0;  // kTile / kExpand: positions per tile
  int64_t grid_x = 1;     // item groups of ty
};

std::string to_string(const GraphPlan& plan);  // e.g. "seg_tile vec=8 tile=256 block=16x16 grid=4883x1"

struct GraphProblem {
  GraphKernel kind = GraphKernel::kTile;
  int elem_bytes = 2;
  int64_t nnz = 0;       // positions (edges)
  int64_t nseg = 0;      // segments
  int64_t features = 0;  // F
  bool wide_ok = false;  // F and every row base allow 16-byte vectors
};

GraphProblem make_graph_problem(GraphOp op, const GraphParams& p, int elem_bytes);

// Positions per tile of the gather-reduce for nnz positions of F features: the one value the
// workspace size and the plan both use (so the workspace needs no device query).
int64_t graph_tile_rows(int64_t nnz, int64_t features);
// Workspace bytes of a gather-reduce run with `tile_rows`: two float32 partials (+ two int32 argmax
// for max) of F features per tile.
size_t graph_workspace_bytes(int64_t tile_rows, int64_t nnz, int64_t features, bool max);

// The plan production runs (requires a non-empty problem).
GraphPlan plan_graph(const GraphProblem& problem);
// Every plan that can run the problem (both vector widths the alignment allows x the tile sizes the
// workspace covers): the tests run them all.
std::vector<GraphPlan> candidate_plans(const GraphProblem& problem);
Status check_plan(const GraphPlan& plan, const GraphProblem& problem);

// Test-only entries: run one call with a given plan, and list a call's candidate plans.
Status launch_with_plan(const GraphPlan& plan, const GraphCall& call, void* workspace, size_t workspace_bytes,
                        cudaStream_t stream);
Status graph_candidate_plans(const GraphCall& call, std::vector<GraphPlan>* plans);

// The launcher (graph_launch.cuh), one instantiation per dtype (graph_<dtype>.cu).
template <typename T>
Status launch_graph(const GraphPlan& plan, const GraphParams& p, bool index64, GraphReduce reduce,
                    const DeviceInfo& dev, cudaStream_t stream);

}  // namespace kernelforge
