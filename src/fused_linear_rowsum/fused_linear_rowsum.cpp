// Public entry points of the fused_linear_rowsum family: validate (fused_linear_rowsum_validate.cpp),
// check the device (common/device.h) and the workspace, plan (fused_linear_rowsum_plan.cpp), launch
// (fused_linear_rowsum_launch.cuh) with the dtype dispatched once (common/dispatch.h).
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <string>
#include <vector>

#include "common/device.h"
#include "common/dispatch.h"
#include "fused_linear_rowsum/fused_linear_rowsum_plan.h"
#include "fused_linear_rowsum/fused_linear_rowsum_problem.h"

namespace kernelforge {

namespace {

// A validated call on the current device: its params, dtype, device facts and problem.
struct Prepared {
  FlrsParams p;
  DType dtype = DType::kFloat32;
  const DeviceInfo* dev = nullptr;
  FlrsProblem problem;
};

Status prepare(const FlrsCall& c, void* workspace, size_t workspace_bytes, Prepared* out) {
  DType w_sum_dtype = DType::kFloat32;
  Status s = validate_fused_linear_rowsum(c, &out->p, &out->dtype, &w_sum_dtype);
  if (!s.ok()) return s;
  const FlrsParams& p = out->p;
  const size_t need = size_t(flrs_workspace_floats(p.tokens, p.k, p.o)) * sizeof(float);
  if (workspace == nullptr || workspace_bytes < need)
    return Status::Invalid(std::string(c.name) + ": workspace must hold at least " + std::to_string(need) +
                           " bytes (fused_linear_rowsum_workspace_size), got " +
                           (workspace == nullptr ? std::string("a null pointer") : std::to_string(workspace_bytes)));
  if (reinterpret_cast<uintptr_t>(workspace) % 16 != 0)
    return Status::Invalid(std::string(c.name) + ": workspace must be 16-byte aligned");
  if (!(s = check_device(c.name, c.x->device.index, out->dtype, &out->dev)).ok()) return s;
  out->problem = make_flrs_problem(p, c.backward, int(dtype_size(out->dtype)));
  return Status::Ok();
}

Status launch(const FlrsPlan& plan, const FlrsCall& c, const Prepared& w, void* workspace, cudaStream_t stream) {
  return dispatch_dtype(w.dtype, c.name, [&](auto t) {
    return launch_fused_linear_rowsum<decltype(t)>(plan, w.p, *w.dev, static_cast<float*>(workspace), stream);
  });
}

Status run(const FlrsCall& c, void* workspace, size_t workspace_bytes, cudaStream_t stream) {
  Prepared w;
  Status s = prepare(c, workspace, workspace_bytes, &w);
  if (!s.ok()) return s;
  if (!flrs_has_work(w.problem, w.p)) return Status::Ok();  // nothing to compute: no launch
  return launch(plan_fused_linear_rowsum(w.problem, *w.dev), c, w, workspace, stream);
}

}  // namespace

size_t fused_linear_rowsum_workspace_size(int64_t tokens, int64_t in_features, int64_t out_features) {
  if (tokens < 0 || in_features < 0 || out_features < 0) return 0;
  return size_t(flrs_workspace_floats(tokens, in_features, out_features)) * sizeof(float);
}

Status launch_with_plan(const FlrsPlan& plan, const FlrsCall& call, void* workspace, size_t workspace_bytes,
                        cudaStream_t stream) {
  Prepared w;
  Status s = prepare(call, workspace, workspace_bytes, &w);
  if (!s.ok()) return s;
  if (!(s = check_plan(plan, w.problem, *w.dev)).ok()) return s;
  if (!flrs_has_work(w.problem, w.p)) return Status::Ok();
  return launch(plan, call, w, workspace, stream);
}

Status flrs_candidate_plans(const FlrsCall& call, std::vector<FlrsPlan>* plans) {
  Prepared w;  // the candidates depend on the problem only: no workspace is checked
  DType w_sum_dtype = DType::kFloat32;
  Status s = validate_fused_linear_rowsum(call, &w.p, &w.dtype, &w_sum_dtype);
  if (!s.ok()) return s;
  if (!(s = check_device(call.name, call.x->device.index, w.dtype, &w.dev)).ok()) return s;
  w.problem = make_flrs_problem(w.p, call.backward, int(dtype_size(w.dtype)));
  *plans = candidate_plans(w.problem, *w.dev);
  return Status::Ok();
}

Status fused_linear_rowsum(const TensorView& x, const TensorView& weight, const TensorView* bias, const TensorView& y,
                           const TensorView& w_sum, void* workspace, size_t workspace_bytes, cudaStream_t stream) {
  FlrsCall c;
  c.name = "fused_linear_rowsum";
  c.x = &x, c.weight = &weight, c.bias = bias, c.y = &y, c.w_sum = &w_sum;
  return run(c, workspace, workspace_bytes, stream);
}

Status fused_linear_rowsum_backward(const TensorView& dy, const TensorView& x, const TensorView& w_sum,
                                    const TensorView* dx, const TensorView* dweight, const TensorView* dbias,
                                    void* workspace, size_t workspace_bytes, cudaStream_t stream) {
  FlrsCall c;
  c.name = "fused_linear_rowsum_backward";
  c.backward = true;
  c.dy = &dy, c.x = &x, c.w_sum = &w_sum, c.dx = dx, c.dweight = dweight, c.dbias = dbias;
  return run(c, workspace, workspace_bytes, stream);
}

}  // namespace kernelforge
