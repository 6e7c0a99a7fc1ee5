// Public entry points of the softmax family: validate (softmax_validate.cpp) -> check the device
// (common/device.h) -> plan (softmax_plan.cpp) -> launch (softmax_launch.cuh), the dtype dispatched
// once (common/dispatch.h). Also the test entries launch_with_plan and softmax_candidate_plans.
#include <string>
#include <vector>

#include "common/device.h"
#include "common/dispatch.h"
#include "softmax/softmax_plan.h"
#include "softmax/softmax_problem.h"

namespace kernelforge {

namespace {

// A validated call on the current device: its params, dtype and device facts.
struct Prepared {
  SoftmaxParams p;
  DType dtype = DType::kFloat32;
  const DeviceInfo* dev = nullptr;
};

Status prepare(const SoftmaxCall& c, Prepared* out) {
  Status s = validate_softmax(c, &out->p, &out->dtype);
  if (!s.ok()) return s;
  const TensorView& t = c.backward ? *c.g : *c.x;
  return check_device(c.name, t.device.index, out->dtype, &out->dev);
}

int elem_size(DType t) { return t == DType::kFloat32 ? 4 : 2; }

SoftmaxProblem problem_of(const SoftmaxCall& c, const Prepared& pc) {
  return make_softmax_problem(pc.p, c.log, c.backward, elem_size(pc.dtype));
}

// The plan (nullptr: plan_softmax's) launched for the call's dtype.
Status run(const SoftmaxCall& c, const SoftmaxPlan* given, cudaStream_t stream) {
  Prepared pc;
  Status s = prepare(c, &pc);
  if (!s.ok()) return s;
  if (pc.p.rows == 0) return Status::Ok();  // nothing to compute: no launch
  const SoftmaxProblem pr = problem_of(c, pc);
  SoftmaxPlan plan;
  if (given != nullptr) {
    if (!(s = check_plan(*given, pr, *pc.dev)).ok()) return Status(s.code(), std::string(c.name) + ": " + s.message());
    plan = *given;
  } else {
    plan = plan_softmax(pr, *pc.dev);
  }
  return dispatch_dtype(pc.dtype, c.name, [&](auto t) {
    using T = decltype(t);
    return launch_softmax<T>(plan, pr, pc.p, *pc.dev, stream);
  });
}

SoftmaxCall make(const char* name, bool log, bool bwd) {
  SoftmaxCall c;
  c.name = name;
  c.log = log;
  c.backward = bwd;
  c.cuda = true;
  return c;
}

}  // namespace

Status launch_with_plan(const SoftmaxPlan& plan, const SoftmaxCall& call, cudaStream_t stream) {
  return run(call, &plan, stream);
}

Status softmax_candidate_plans(const SoftmaxCall& call, std::vector<SoftmaxPlan>* plans) {
  Prepared pc;
  Status s = prepare(call, &pc);
  if (!s.ok()) return s;
  *plans = candidate_plans(problem_of(call, pc), *pc.dev);
  return Status::Ok();
}

Status softmax(const TensorView& x, const TensorView& y, cudaStream_t stream) {
  SoftmaxCall c = make("softmax", false, false);
  c.x = &x, c.y = &y;
  return run(c, nullptr, stream);
}

Status log_softmax(const TensorView& x, const TensorView& y, cudaStream_t stream) {
  SoftmaxCall c = make("log_softmax", true, false);
  c.x = &x, c.y = &y;
  return run(c, nullptr, stream);
}

Status softmax_backward(const TensorView& g, const TensorView& y, const TensorView& dx, cudaStream_t stream) {
  SoftmaxCall c = make("softmax_backward", false, true);
  c.g = &g, c.y = &y, c.dx = &dx;
  return run(c, nullptr, stream);
}

Status log_softmax_backward(const TensorView& g, const TensorView& y, const TensorView& dx, cudaStream_t stream) {
  SoftmaxCall c = make("log_softmax_backward", true, true);
  c.g = &g, c.y = &y, c.dx = &dx;
  return run(c, nullptr, stream);
}

}  // namespace kernelforge
