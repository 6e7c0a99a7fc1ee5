// The graph launcher: one switch over plan.kind. The index dtype (int32 / int64), the vector width
// (16 bytes or one element) and max-or-not pick the kernel instantiation. Included by
// graph_<dtype>.cu.
#pragma once

#include <cuda_runtime.h>

#include "common/launch.cuh"
#include "common/plan_record.h"
#include "graph/graph_plan.h"
#include "graph/kernels/edge_dot.cuh"
#include "graph/kernels/seg_combine.cuh"
#include "graph/kernels/seg_expand.cuh"
#include "graph/kernels/seg_tile.cuh"

namespace kernelforge {
namespace graph_detail {

template <typename T, typename I, int kVec, bool kMax>
Status launch_kind(const GraphPlan& plan, const GraphParams& p, const DeviceInfo& dev, cudaStream_t stream) {
  const bool pdl = use_pdl(dev);
  const dim3 block(unsigned(plan.tx), unsigned(plan.ty));
  GraphParams q = p;
  switch (plan.kind) {
    case GraphKernel::kTile: {
      q.tile_rows = plan.tile_rows;
      q.tiles = ceil_div(p.nnz, plan.tile_rows);
      if (q.tiles > 0) {
        Launch l(dim3(unsigned(plan.grid_x), unsigned(plan.grid_y)), block, 0, stream, pdl);
        // the transposed walk of a max backward (mask_arg) is a masked sum
        void (*tile)(const GraphParams) =
            (!kMax && p.mask_arg != nullptr) ? seg_tile<T, I, kVec, false, true> : seg_tile<T, I, kVec, kMax, false>;
        const Status s = launched(l(tile, q), "gather_reduce (seg_tile)");
        if (!s.ok()) return s;
      }
      Launch l(dim3(unsigned(ceil_div(p.nseg, plan.ty)), unsigned(plan.grid_y)), block, 0, stream, pdl);
      return launched(l(seg_combine<T, I, kVec, kMax>, q), "gather_reduce (seg_combine)");
    }
    case GraphKernel::kExpand: {
      q.tile_rows = plan.tile_rows;
      q.tiles = ceil_div(p.nnz, plan.tile_rows);
      Launch l(dim3(unsigned(plan.grid_x), unsigned(plan.grid_y)), block, 0, stream, pdl);
      return launched(l(seg_expand<T, I, kVec, kMax>, q), "segment_reduce_backward (seg_expand)");
    }
    case GraphKernel::kEdgeDot: {
      Launch l(dim3(unsigned(plan.grid_x)), block, 0, stream, pdl);
      return launched(l(edge_dot<T, I, kVec, kMax>, q), "edge_weight_grad (edge_dot)");
    }
  }
  return Status::Invalid("graph: unknown kernel in plan " + to_string(plan));
}

template <typename T, typename I>
Status launch_index(const GraphPlan& plan, const GraphParams& p, bool max, const DeviceInfo& dev, cudaStream_t stream) {
  constexpr int kWide = 16 / int(sizeof(T));
  if (plan.vec == kWide)
    return max ? launch_kind<T, I, kWide, true>(plan, p, dev, stream)
               : launch_kind<T, I, kWide, false>(plan, p, dev, stream);
  if (plan.vec == 1)
    return max ? launch_kind<T, I, 1, true>(plan, p, dev, stream) : launch_kind<T, I, 1, false>(plan, p, dev, stream);
  return Status::Invalid("graph: no kernel built for " + to_string(plan));
}

}  // namespace graph_detail

// reduce == kMax selects the argmax paths: the forward's argmax (kTile), the backward's routing to the
// argmax position (kExpand, kEdgeDot). The transposed gather-reduce of gather_scatter's backward is a
// sum with a mask (p.mask_arg), launched with kSum.
template <typename T>
Status launch_graph(const GraphPlan& plan, const GraphParams& p, bool index64, GraphReduce reduce,
                    const DeviceInfo& dev, cudaStream_t stream) {
  record_plan(plan);
  const bool max = reduce == GraphReduce::kMax;
  return index64 ? graph_detail::launch_index<T, int64_t>(plan, p, max, dev, stream)
                 : graph_detail::launch_index<T, int32_t>(plan, p, max, dev, stream);
}

}  // namespace kernelforge
