// Internal description of one graph call, shared by the CUDA launchers and the float64 reference.
// graph_validate.cpp fills GraphParams from the public TensorViews; it is the only place that checks
// arguments, so every error message comes from one file.
#pragma once

#include <cstdint>

#include "kernelforge/graph.h"

namespace kernelforge {

enum class GraphOp : int {
  kGatherReduce = 0,  // gather_reduce (forward, and the transposed backward of gather_scatter)
  kExpand = 1,        // segment_reduce_backward
  kEdgeDot = 2,       // edge_weight_grad
};

// Device-side parameters (by value). Row r of a row tensor t starts at t + r * t_stride; index
// tensors are contiguous arrays of I (int32 or int64); argmax / mask_arg are contiguous int32 [., F].
struct GraphParams {
  const void* x = nullptr;  // gathered rows (gather_reduce, edge_dot) or dout (expand)
  int64_t x_stride = 0;
  int64_t x_rows = 0;
  const void* g = nullptr;  // edge_dot: dout rows
  int64_t g_stride = 0;
  const void* rowptr = nullptr;  // [nseg + 1]
  const void* col = nullptr;     // [nnz] or nullptr
  const void* eid = nullptr;     // [nnz] or nullptr
  const void* src = nullptr;     // edge_dot: [nnz]
  const void* weight = nullptr;  // [edges] or nullptr
  const void* scale_rowptr = nullptr;
  const int32_t* mask_arg = nullptr;
  void* out = nullptr;  // out rows (gather_reduce), dx rows (expand), dw (edge_dot)
  int64_t out_stride = 0;
  int32_t* argmax = nullptr;
  float* partial = nullptr;        // [tiles, 2, F]: slot 0 = the tile's head segment, 1 = its tail
  int32_t* partial_arg = nullptr;  // max: the argmax of each partial
  int64_t nseg = 0;                // segments (N)
  int64_t nnz = 0;                 // positions (gather_reduce, expand) or edges (edge_dot)
  int64_t features = 0;            // F
  int64_t tile_rows = 0;           // positions per tile (set by the launcher from the plan)
  int64_t tiles = 0;
  bool mean = false;
};

struct GraphCall {
  GraphOp op = GraphOp::kGatherReduce;
  bool cuda = true;  // false: the CPU reference (float64 also accepted)
  const char* name = "";
  const GatherReduceArgs* gr = nullptr;  // kGatherReduce
  // kExpand / kEdgeDot
  const TensorView* dout = nullptr;
  const TensorView* x = nullptr;
  const TensorView* rowptr = nullptr;
  const TensorView* src = nullptr;
  const TensorView* dst = nullptr;
  const TensorView* argmax = nullptr;
  const TensorView* result = nullptr;  // dx or dw
  GraphReduce reduce = GraphReduce::kSum;
};

// Checks every argument of `c` and fills `p` (pointers, strides, sizes); `dtype` receives the value
// dtype and `index_dtype` the index dtype (int32 or int64).
Status validate_graph(const GraphCall& c, GraphParams* p, DType* dtype, DType* index_dtype);

}  // namespace kernelforge
