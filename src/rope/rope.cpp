// Public entry points of the RoPE family: validate (rope_validate.cpp), check the device
// (common/device.h), plan (rope_plan.cpp), launch (rope_launch.cuh) with the dtype dispatched once
// (common/dispatch.h).
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "common/device.h"
#include "common/dispatch.h"
#include "rope/rope_plan.h"
#include "rope/rope_problem.h"

namespace kernelforge {

namespace {

// A validated call on the current device: its params, dtypes, device facts and problem.
struct Prepared {
  RopeParams p;
  DType dtype = DType::kFloat32;
  DType cs_dtype = DType::kFloat32;
  const DeviceInfo* dev = nullptr;
  RopeProblem problem;
};

Status prepare(const RopeCall& c, Prepared* out) {
  Status s = validate_rope(c, &out->p, &out->dtype, &out->cs_dtype);
  if (!s.ok()) return s;
  // bfloat16 q/k or cos/sin both need sm_80: the device check is asked about bfloat16 if either is
  const DType need = out->cs_dtype == DType::kBFloat16 ? DType::kBFloat16 : out->dtype;
  if (!(s = check_device(c.name, c.q->device.index, need, &out->dev)).ok()) return s;
  out->problem = make_rope_problem(out->p, int(dtype_size(out->dtype)));
  return Status::Ok();
}

Status launch(const RopePlan& plan, const RopeCall& c, const Prepared& w, cudaStream_t stream) {
  const bool cs_float = w.cs_dtype == DType::kFloat32;
  return dispatch_dtype(w.dtype, c.name,
                        [&](auto t) { return launch_rope<decltype(t)>(plan, w.p, cs_float, *w.dev, stream); });
}

bool empty(const RopeProblem& pr) { return pr.tokens == 0 || pr.heads == 0; }

Status run(const RopeCall& c, cudaStream_t stream) {
  Prepared w;
  Status s = prepare(c, &w);
  if (!s.ok()) return s;
  if (empty(w.problem)) return Status::Ok();  // nothing to compute: no launch
  return launch(plan_rope(w.problem, *w.dev), c, w, stream);
}

}  // namespace

Status launch_with_plan(const RopePlan& plan, const RopeCall& call, cudaStream_t stream) {
  Prepared w;
  Status s = prepare(call, &w);
  if (!s.ok()) return s;
  if (!(s = check_plan(plan, w.problem, *w.dev)).ok()) return s;
  return launch(plan, call, w, stream);
}

Status rope_candidate_plans(const RopeCall& call, std::vector<RopePlan>* plans) {
  Prepared w;
  Status s = prepare(call, &w);
  if (!s.ok()) return s;
  *plans = candidate_plans(w.problem, *w.dev);
  return Status::Ok();
}

Status apply_rope(const TensorView& q, const TensorView* k, const TensorView& cos, const TensorView& sin,
                  const TensorView* position_ids, const RopeOptions& opts, const TensorView& q_out,
                  const TensorView* k_out, cudaStream_t stream) {
  RopeCall c;
  c.name = "apply_rope";
  c.q = &q, c.k = k, c.cos = &cos, c.sin = &sin, c.pos = position_ids, c.opts = opts, c.q_out = &q_out, c.k_out = k_out;
  return run(c, stream);
}

Status apply_rope_backward(const TensorView& dq_out, const TensorView* dk_out, const TensorView& cos,
                           const TensorView& sin, const TensorView* position_ids, const RopeOptions& opts,
                           const TensorView& dq, const TensorView* dk, cudaStream_t stream) {
  RopeCall c;
  c.name = "apply_rope_backward";
  c.backward = true;
  c.q = &dq_out, c.k = dk_out, c.cos = &cos, c.sin = &sin, c.pos = position_ids, c.opts = opts, c.q_out = &dq,
  c.k_out = dk;
  return run(c, stream);
}

}  // namespace kernelforge
