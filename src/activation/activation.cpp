// Public entry points of the activation family: validate (activation_validate.cpp), check the
// device (common/device.h), plan (activation_plan.cpp), launch (activation_launch.cuh) with the dtype
// dispatched once (common/dispatch.h).
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "activation/activation_plan.h"
#include "activation/activation_problem.h"
#include "common/device.h"
#include "common/dispatch.h"

namespace kernelforge {

namespace {

// The primary input (the one whose device the call runs on).
const TensorView& primary(const ActCall& c) {
  if (c.op == ActOp::kSwiglu) return *c.gate;
  if (c.op == ActOp::kGeglu) return *c.up;
  return *c.x;
}

// A validated call on the current device: its params, dtype, device facts and problem.
struct Prepared {
  ActParams p;
  DType dtype = DType::kFloat32;
  const DeviceInfo* dev = nullptr;
  ActProblem problem;
};

Status prepare(const ActCall& c, Prepared* out) {
  Status s = validate_activation(c, &out->p, &out->dtype);
  if (!s.ok()) return s;
  if (!(s = check_device(c.name, primary(c).device.index, out->dtype, &out->dev)).ok()) return s;
  if (c.dbias != nullptr && out->p.dbias_dtype != out->dtype &&  // (bfloat16 needs sm_80+)
      !(s = check_device(c.name, primary(c).device.index, out->p.dbias_dtype, &out->dev)).ok())
    return s;
  out->problem = make_act_problem(out->p, c.backward, int(dtype_size(out->dtype)));
  return Status::Ok();
}

Status launch(const ActPlan& plan, const ActCall& c, const Prepared& w, cudaStream_t stream) {
  const ActFn fn = act_fn(c.op, c.approx);
  const bool gated = act_is_gated(c.op);
  return dispatch_dtype(w.dtype, c.name,
                        [&](auto t) { return launch_activation<decltype(t)>(plan, fn, gated, w.p, *w.dev, stream); });
}

Status run(const ActCall& c, cudaStream_t stream) {
  Prepared w;
  Status s = prepare(c, &w);
  if (!s.ok()) return s;
  if (act_empty(w.problem)) return Status::Ok();  // nothing to compute: no launch
  return launch(plan_activation(w.problem, *w.dev), c, w, stream);
}

ActCall make(const char* name, ActOp op, bool bwd) {
  ActCall c;
  c.name = name;
  c.op = op;
  c.backward = bwd;
  c.cuda = true;
  return c;
}

}  // namespace

Status launch_with_plan(const ActPlan& plan, const ActCall& call, cudaStream_t stream) {
  Prepared w;
  Status s = prepare(call, &w);
  if (!s.ok()) return s;
  if (!(s = check_plan(plan, w.problem, *w.dev)).ok()) return s;
  return launch(plan, call, w, stream);
}

Status act_candidate_plans(const ActCall& call, std::vector<ActPlan>* plans) {
  Prepared w;
  Status s = prepare(call, &w);
  if (!s.ok()) return s;
  *plans = candidate_plans(w.problem, *w.dev);
  return Status::Ok();
}

Status silu_and_mul(const TensorView& x, const TensorView& y, cudaStream_t stream) {
  ActCall c = make("silu_and_mul", ActOp::kSiluAndMul, false);
  c.x = &x, c.y = &y;
  return run(c, stream);
}

Status swiglu(const TensorView& gate, const TensorView& up, const TensorView& y, cudaStream_t stream) {
  ActCall c = make("swiglu", ActOp::kSwiglu, false);
  c.gate = &gate, c.up = &up, c.y = &y;
  return run(c, stream);
}

Status gelu_and_mul(const TensorView& x, GeluApprox approximate, bool gate_first, const TensorView& y,
                    cudaStream_t stream) {
  ActCall c = make("gelu_and_mul", ActOp::kGeluAndMul, false);
  c.x = &x, c.y = &y, c.approx = approximate, c.gate_first = gate_first;
  return run(c, stream);
}

Status geglu(const TensorView& hidden, const TensorView& gate, GeluApprox approximate, const TensorView& y,
             cudaStream_t stream) {
  ActCall c = make("geglu", ActOp::kGeglu, false);
  c.up = &hidden, c.gate = &gate, c.y = &y, c.approx = approximate;
  return run(c, stream);
}

Status gelu(const TensorView& x, GeluApprox approximate, const TensorView& y, cudaStream_t stream) {
  ActCall c = make("gelu", ActOp::kGelu, false);
  c.x = &x, c.y = &y, c.approx = approximate;
  return run(c, stream);
}

Status silu_and_mul_backward(const TensorView& dy, const TensorView& x, const TensorView& dx, cudaStream_t stream) {
  ActCall c = make("silu_and_mul_backward", ActOp::kSiluAndMul, true);
  c.dy = &dy, c.x = &x, c.dx = &dx;
  return run(c, stream);
}

Status swiglu_backward(const TensorView& dy, const TensorView& gate, const TensorView& up, const TensorView& dgate,
                       const TensorView& dup, cudaStream_t stream) {
  ActCall c = make("swiglu_backward", ActOp::kSwiglu, true);
  c.dy = &dy, c.gate = &gate, c.up = &up, c.dgate = &dgate, c.dup = &dup;
  return run(c, stream);
}

Status gelu_and_mul_backward(const TensorView& dy, const TensorView& x, GeluApprox approximate, bool gate_first,
                             const TensorView& dx, cudaStream_t stream) {
  ActCall c = make("gelu_and_mul_backward", ActOp::kGeluAndMul, true);
  c.dy = &dy, c.x = &x, c.dx = &dx, c.approx = approximate, c.gate_first = gate_first;
  return run(c, stream);
}

Status geglu_backward(const TensorView& dy, const TensorView& hidden, const TensorView& gate, GeluApprox approximate,
                      const TensorView& dhidden, const TensorView& dgate, cudaStream_t stream) {
  ActCall c = make("geglu_backward", ActOp::kGeglu, true);
  c.dy = &dy, c.up = &hidden, c.gate = &gate, c.dup = &dhidden, c.dgate = &dgate, c.approx = approximate;
  return run(c, stream);
}

Status gelu_backward(const TensorView& dy, const TensorView& x, GeluApprox approximate, const TensorView& dx,
                     cudaStream_t stream) {
  ActCall c = make("gelu_backward", ActOp::kGelu, true);
  c.dy = &dy, c.x = &x, c.dx = &dx, c.approx = approximate;
  return run(c, stream);
}

size_t gelu_backward_bias_grad_workspace_size(int64_t rows, int64_t n) {
  return size_t(act_bias_workspace_floats(rows, n)) * sizeof(float);
}

Status gelu_backward_bias_grad(const TensorView& dy, const TensorView& x, GeluApprox approximate, const TensorView& dx,
                               const TensorView& dbias, void* workspace, size_t workspace_bytes, cudaStream_t stream) {
  ActCall c = make("gelu_backward_bias_grad", ActOp::kGelu, true);
  c.dy = &dy, c.x = &x, c.dx = &dx, c.approx = approximate, c.dbias = &dbias;
  c.workspace = workspace, c.workspace_bytes = workspace_bytes;
  return run(c, stream);
}

}  // namespace kernelforge
