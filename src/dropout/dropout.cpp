// Public entry points of the dropout family: validate (dropout_validate.cpp), check the device
// (common/device.h), plan (dropout_plan.cpp), launch (dropout_launch.cuh) with the dtype dispatched
// once (common/dispatch.h).
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "common/device.h"
#include "common/dispatch.h"
#include "dropout/dropout_plan.h"
#include "dropout/dropout_problem.h"

namespace kernelforge {

namespace {

// A validated call on the current device: its params, dtype, device facts and problem.
struct Prepared {
  DropParams p;
  DType dtype = DType::kFloat32;
  const DeviceInfo* dev = nullptr;
  DropProblem problem;
};

Status prepare(const DropCall& c, Prepared* out) {
  Status s = validate_dropout(c, &out->p, &out->dtype);
  if (!s.ok()) return s;
  const TensorView& primary = c.op == DropOp::kBackward ? *c.dy : *c.x;
  if (!(s = check_device(c.name, primary.device.index, out->dtype, &out->dev)).ok()) return s;
  out->problem = make_drop_problem(out->p, int(dtype_size(out->dtype)));
  return Status::Ok();
}

Status launch(const DropPlan& plan, const DropCall& c, const Prepared& w, cudaStream_t stream) {
  return dispatch_dtype(w.dtype, c.name,
                        [&](auto t) { return launch_dropout<decltype(t)>(plan, w.p, *w.dev, stream); });
}

Status run(const DropCall& c, cudaStream_t stream) {
  Prepared w;
  Status s = prepare(c, &w);
  if (!s.ok()) return s;
  if (w.problem.numel == 0) return Status::Ok();  // nothing to compute: no launch (rng_state is not written)
  return launch(plan_dropout(w.problem, *w.dev), c, w, stream);
}

DropCall make(const char* name, DropOp op, double p) {
  DropCall c;
  c.name = name;
  c.op = op;
  c.p = p;
  c.cuda = true;
  return c;
}

}  // namespace

Status launch_with_plan(const DropPlan& plan, const DropCall& call, cudaStream_t stream) {
  Prepared w;
  Status s = prepare(call, &w);
  if (!s.ok()) return s;
  if (!(s = check_plan(plan, w.problem, *w.dev)).ok()) return s;
  return launch(plan, call, w, stream);
}

Status drop_candidate_plans(const DropCall& call, std::vector<DropPlan>* plans) {
  Prepared w;
  Status s = prepare(call, &w);
  if (!s.ok()) return s;
  *plans = candidate_plans(w.problem, *w.dev);
  return Status::Ok();
}

Status dropout(const TensorView& x, double p, const PhiloxState& rng, const TensorView& y, const TensorView* rng_state,
               uint8_t* mask, cudaStream_t stream) {
  DropCall c = make("dropout", DropOp::kDropout, p);
  c.x = &x, c.y = &y, c.rng = rng, c.rng_state = rng_state, c.mask = mask;
  return run(c, stream);
}

Status dropout_add(const TensorView& x, const TensorView& residual, double p, const PhiloxState& rng,
                   const TensorView& y, const TensorView* rng_state, cudaStream_t stream) {
  DropCall c = make("dropout_add", DropOp::kDropoutAdd, p);
  c.x = &x, c.residual = &residual, c.y = &y, c.rng = rng, c.rng_state = rng_state;
  return run(c, stream);
}

Status dropout_backward(const TensorView& dy, const TensorView& rng_state, double p, const TensorView& dx,
                        cudaStream_t stream) {
  DropCall c = make("dropout_backward", DropOp::kBackward, p);
  c.dy = &dy, c.rng_state = &rng_state, c.dx = &dx;
  return run(c, stream);
}

}  // namespace kernelforge
