// Public entry points of the graph family: validate (graph_validate.cpp), check the device
// (common/device.h), plan (graph_plan.cpp), launch (graph_launch.cuh) with the dtype dispatched once.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "common/device.h"
#include "common/dispatch.h"
#include "graph/graph_plan.h"
#include "graph/graph_problem.h"

namespace kernelforge {

namespace {

const TensorView* primary(const GraphCall& c) {
  if (c.op == GraphOp::kGatherReduce) return c.gr ? c.gr->x : nullptr;
  return c.dout;
}

GraphReduce reduce_of(const GraphCall& c) { return c.op == GraphOp::kGatherReduce ? c.gr->reduce : c.reduce; }

struct Prepared {
  GraphParams p;
  DType dtype = DType::kFloat32;
  DType index = DType::kInt64;
  const DeviceInfo* dev = nullptr;
  GraphProblem problem;
};

Status prepare(const GraphCall& c, Prepared* out) {
  Status s = validate_graph(c, &out->p, &out->dtype, &out->index);
  if (!s.ok()) return s;
  if (!(s = check_device(c.name, primary(c)->device.index, out->dtype, &out->dev)).ok()) return s;
  out->problem = make_graph_problem(c.op, out->p, int(dtype_size(out->dtype)));
  return Status::Ok();
}

bool empty(const GraphProblem& pr) {
  if (pr.kind == GraphKernel::kTile) return pr.nseg == 0 || pr.features == 0;
  if (pr.kind == GraphKernel::kExpand) return pr.nnz == 0 || pr.features == 0;
  return pr.nnz == 0;  // edge_dot: F == 0 still writes dw = 0
}

Status launch(const GraphPlan& plan, const GraphCall& c, Prepared& w, void* workspace, size_t workspace_bytes,
              cudaStream_t stream) {
  const GraphReduce reduce = reduce_of(c);
  if (plan.kind == GraphKernel::kTile) {
    const bool max = reduce == GraphReduce::kMax;
    const size_t need = graph_workspace_bytes(plan.tile_rows, w.p.nnz, w.p.features, max);
    if (need > 0 && (workspace == nullptr || workspace_bytes < need))
      return Status::Invalid(std::string(c.name) + ": the workspace must hold " + std::to_string(need) +
                             " bytes (gather_reduce_workspace_bytes), got " +
                             (workspace ? std::to_string(workspace_bytes) : std::string("none")));
    if (reinterpret_cast<uintptr_t>(workspace) % 16 != 0)
      return Status::Invalid(std::string(c.name) + ": the workspace must be 16-byte aligned");
    w.p.partial = static_cast<float*>(workspace);
    w.p.partial_arg = max ? reinterpret_cast<int32_t*>(static_cast<char*>(workspace) + need / 2) : nullptr;
  }
  const bool index64 = w.index == DType::kInt64;
  return dispatch_dtype(w.dtype, c.name,
                        [&](auto t) { return launch_graph<decltype(t)>(plan, w.p, index64, reduce, *w.dev, stream); });
}

Status run(const GraphCall& c, void* workspace, size_t workspace_bytes, cudaStream_t stream) {
  Prepared w;
  Status s = prepare(c, &w);
  if (!s.ok()) return s;
  if (empty(w.problem)) return Status::Ok();  // nothing to compute: no launch
  return launch(plan_graph(w.problem), c, w, workspace, workspace_bytes, stream);
}

}  // namespace

Status launch_with_plan(const GraphPlan& plan, const GraphCall& call, void* workspace, size_t workspace_bytes,
                        cudaStream_t stream) {
  Prepared w;
  Status s = prepare(call, &w);
  if (!s.ok()) return s;
  if (!(s = check_plan(plan, w.problem)).ok()) return s;
  return launch(plan, call, w, workspace, workspace_bytes, stream);
}

Status graph_candidate_plans(const GraphCall& call, std::vector<GraphPlan>* plans) {
  Prepared w;
  Status s = prepare(call, &w);
  if (!s.ok()) return s;
  *plans = candidate_plans(w.problem);
  return Status::Ok();
}

size_t gather_reduce_workspace_bytes(int64_t nnz, int64_t features, GraphReduce reduce) {
  return graph_workspace_bytes(graph_tile_rows(nnz, features), nnz, features, reduce == GraphReduce::kMax);
}

Status gather_reduce(const GatherReduceArgs& a, void* workspace, size_t workspace_bytes, cudaStream_t stream) {
  GraphCall c;
  c.op = GraphOp::kGatherReduce;
  c.name = a.name;
  c.gr = &a;
  return run(c, workspace, workspace_bytes, stream);
}

Status segment_reduce_backward(const char* name, const TensorView& dout, const TensorView& rowptr, GraphReduce reduce,
                               const TensorView* argmax, const TensorView& dx, cudaStream_t stream) {
  GraphCall c;
  c.op = GraphOp::kExpand;
  c.name = name;
  c.dout = &dout;
  c.rowptr = &rowptr;
  c.reduce = reduce;
  c.argmax = argmax;
  c.result = &dx;
  return run(c, nullptr, 0, stream);
}

Status edge_weight_grad(const char* name, const TensorView& dout, const TensorView& x, const TensorView& src,
                        const TensorView& dst, const TensorView& rowptr, GraphReduce reduce, const TensorView* argmax,
                        const TensorView& dw, cudaStream_t stream) {
  GraphCall c;
  c.op = GraphOp::kEdgeDot;
  c.name = name;
  c.dout = &dout;
  c.x = &x;
  c.src = &src;
  c.dst = &dst;
  c.rowptr = &rowptr;
  c.reduce = reduce;
  c.argmax = argmax;
  c.result = &dw;
  return run(c, nullptr, 0, stream);
}

}  // namespace kernelforge
