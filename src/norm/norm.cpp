// Public entry points of the normalization family: validate (norm_validate.cpp), check the device,
// plan (norm_plan.cpp), launch (norm_launch.cuh) with the dtype dispatched once.
#include "common/device.h"
#include "common/dispatch.h"
#include "norm/norm_plan.h"
#include "norm/norm_problem.h"

namespace kernelforge {

namespace {

// validate -> check the device -> plan (or check the given plan) -> launch.
Status run(const NormCall& c, const NormPlan* given, void* workspace, size_t* workspace_bytes, cudaStream_t stream) {
  NormParams p;
  DType dtype;
  Status s = validate_norm(c, &p, &dtype);
  if (!s.ok()) return s;
  if (!c.cuda) return Status::Invalid(std::string(c.name) + ": the CUDA entry needs a CUDA call");
  if (c.backward && workspace_bytes == nullptr)
    return Status::Invalid(std::string(c.name) + ": workspace_bytes must not be null");
  const DeviceInfo* info = nullptr;
  if (!(s = check_device(c.name, c.x->device.index, dtype, &info)).ok()) return s;
  if (p.rows == 0) {  // nothing to normalize
    if (!c.backward) return Status::Ok();
    if (workspace == nullptr) {  // backward: the parameter gradients of no rows are zero
      *workspace_bytes = 0;
      return Status::Ok();
    }
    const size_t e = dtype_size(dtype);
    void* zero[] = {p.dweight, p.dbias, p.dscale, p.dshift};
    const int64_t count[] = {p.n, p.n, c.dscale ? c.dscale->numel() : 0, c.dshift ? c.dshift->numel() : 0};
    for (int i = 0; i < 4; ++i)
      if (zero[i] && count[i] > 0) {
        cudaError_t err = cudaMemsetAsync(zero[i], 0, size_t(count[i]) * e, stream);
        if (err != cudaSuccess) return cuda_status(err, c.name, "cudaMemsetAsync");
      }
    return Status::Ok();
  }
  const NormProblem problem = make_norm_problem(c.op, c.backward, p, dtype);
  NormPlan plan;
  if (given != nullptr) {
    if (!(s = check_plan(*given, problem, *info)).ok())
      return Status(s.code(), std::string(c.name) + ": " + s.message());
    plan = *given;
  } else {
    plan = plan_norm(problem, *info);
  }
  return dispatch_dtype(dtype, c.name, [&](auto t) {
    return launch_norm<decltype(t)>(plan, c.op, p, *info, workspace, workspace_bytes, stream);
  });
}

Status run(const NormCall& c, void* workspace, size_t* workspace_bytes, cudaStream_t stream) {
  return run(c, nullptr, workspace, workspace_bytes, stream);
}

NormCall make(const char* name, NormOp op, bool bwd, float eps) {
  NormCall c;
  c.name = name;
  c.op = op;
  c.backward = bwd;
  c.cuda = true;
  c.eps = eps;
  return c;
}

NormOp ada_op(NormKind k) { return k == NormKind::kRms ? NormOp::kAdaRms : NormOp::kAdaLayer; }

}  // namespace

Status rms_norm(const TensorView& x, const TensorView* weight, float eps, const TensorView& y, cudaStream_t stream) {
  NormCall c = make("rms_norm", NormOp::kRms, false, eps);
  c.x = &x, c.weight = weight, c.y = &y;
  return run(c, nullptr, nullptr, stream);
}

Status add_rms_norm(const TensorView& x, const TensorView& residual, const TensorView* weight, float eps,
                    const TensorView& y, const TensorView& sum, cudaStream_t stream) {
  NormCall c = make("add_rms_norm", NormOp::kAddRms, false, eps);
  c.x = &x, c.residual = &residual, c.weight = weight, c.y = &y, c.sum = &sum;
  return run(c, nullptr, nullptr, stream);
}

Status layer_norm(const TensorView& x, const TensorView* weight, const TensorView* bias, float eps, const TensorView& y,
                  cudaStream_t stream) {
  NormCall c = make("layer_norm", NormOp::kLayer, false, eps);
  c.x = &x, c.weight = weight, c.bias = bias, c.y = &y;
  return run(c, nullptr, nullptr, stream);
}

Status ada_norm(const TensorView& x, const TensorView& scale, const TensorView& shift, const TensorView* weight,
                const TensorView* bias, float eps, NormKind kind, const TensorView& y, cudaStream_t stream) {
  NormCall c = make("ada_norm", ada_op(kind), false, eps);
  c.x = &x, c.scale = &scale, c.shift = &shift, c.weight = weight, c.bias = bias, c.y = &y, c.kind = kind;
  return run(c, nullptr, nullptr, stream);
}

Status rms_norm_backward(const TensorView& dy, const TensorView& x, const TensorView* weight, float eps,
                         const TensorView& dx, const TensorView* dweight, void* workspace, size_t* workspace_bytes,
                         cudaStream_t stream) {
  NormCall c = make("rms_norm_backward", NormOp::kRms, true, eps);
  c.dy = &dy, c.x = &x, c.weight = weight, c.dx = &dx, c.dweight = dweight;
  return run(c, workspace, workspace_bytes, stream);
}

Status add_rms_norm_backward(const TensorView& dy, const TensorView* dsum, const TensorView& sum,
                             const TensorView* weight, float eps, const TensorView& dx, const TensorView* dweight,
                             void* workspace, size_t* workspace_bytes, cudaStream_t stream) {
  NormCall c = make("add_rms_norm_backward", NormOp::kAddRms, true, eps);
  c.dy = &dy, c.dsum = dsum, c.x = &sum, c.weight = weight, c.dx = &dx, c.dweight = dweight;
  return run(c, workspace, workspace_bytes, stream);
}

Status layer_norm_backward(const TensorView& dy, const TensorView& x, const TensorView* weight, const TensorView* bias,
                           float eps, const TensorView& dx, const TensorView* dweight, const TensorView* dbias,
                           void* workspace, size_t* workspace_bytes, cudaStream_t stream) {
  NormCall c = make("layer_norm_backward", NormOp::kLayer, true, eps);
  c.dy = &dy, c.x = &x, c.weight = weight, c.bias = bias, c.dx = &dx, c.dweight = dweight, c.dbias = dbias;
  return run(c, workspace, workspace_bytes, stream);
}

Status ada_norm_backward(const TensorView& dy, const TensorView& x, const TensorView& scale, const TensorView& shift,
                         const TensorView* weight, const TensorView* bias, float eps, NormKind kind,
                         const TensorView& dx, const TensorView* dscale, const TensorView* dshift,
                         const TensorView* dweight, const TensorView* dbias, void* workspace, size_t* workspace_bytes,
                         cudaStream_t stream) {
  NormCall c = make("ada_norm_backward", ada_op(kind), true, eps);
  c.dy = &dy, c.x = &x, c.scale = &scale, c.shift = &shift, c.weight = weight, c.bias = bias, c.dx = &dx, c.kind = kind;
  c.dscale = dscale, c.dshift = dshift, c.dweight = dweight, c.dbias = dbias;
  return run(c, workspace, workspace_bytes, stream);
}

Status launch_with_plan(const NormPlan& plan, const NormCall& call, void* workspace, size_t* workspace_bytes,
                        cudaStream_t stream) {
  return run(call, &plan, workspace, workspace_bytes, stream);
}

Status candidate_plans_for(const NormCall& c, std::vector<NormPlan>* plans) {
  NormParams p;
  DType dtype;
  Status s = validate_norm(c, &p, &dtype);
  if (!s.ok()) return s;
  const DeviceInfo* info = nullptr;
  if (!(s = check_device(c.name, c.x->device.index, dtype, &info)).ok()) return s;
  *plans = candidate_plans(make_norm_problem(c.op, c.backward, p, dtype), *info);
  return Status::Ok();
}

}  // namespace kernelforge
