// Public entry points of the attention family: validate (attention_validate.cpp), check the device
// (common/device.h), plan (attention_plan.cpp), launch (attention_launch.cuh) with the dtype
// dispatched once (common/dispatch.h).
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <string>
#include <type_traits>

#include "attention/attention_plan.h"
#include "attention/attention_problem.h"
#include "common/device.h"
#include "common/dispatch.h"

namespace kernelforge {

namespace {

// A validated call on the current device: its params, dtype, device facts and problem.
struct Prepared {
  AttentionParams p;
  DType dtype = DType::kFloat16;
  const DeviceInfo* dev = nullptr;
  AttentionProblem problem;
};

Status prepare(const AttentionCall& c, Prepared* w) {
  Status s = validate_attention(c, &w->p, &w->dtype);
  if (!s.ok()) return s;
  if (!(s = check_device(c.name, c.t.q->device.index, w->dtype, &w->dev)).ok()) return s;
  if (w->dev->capability < 80)  // the kernels use mma.sync m16n8k16 and cp.async (sm_80)
    return Status::NotSupported(std::string(c.name) + ": attention needs sm_80 or later, this GPU is sm_" +
                                std::to_string(w->dev->capability));
  w->problem = make_attention_problem(w->p, w->dtype);
  if (w->p.varlen) w->problem.total_q = c.t.q->shape[0];  // Tq (Params only bound it)
  return Status::Ok();
}

// Nothing to compute (no query row): no launch. Sk = 0 is not empty: every row is written
// (out = 0, lse = -inf or the sink) by the kernels, which handle rows that see no key.
bool empty(const AttentionProblem& pr) { return pr.batch == 0 || pr.heads_q == 0 || pr.total_q == 0; }

Status check_workspace(const AttentionCall& c, const Prepared& w, const AttentionPlan& plan, const void* workspace,
                       size_t bytes) {
  const size_t need = workspace_bytes(plan, w.problem);
  if (bytes < need)
    return Status::Invalid(std::string(c.name) + ": workspace_bytes must be at least " + std::to_string(need) +
                           " for plan " + to_string(plan) + ", got " + std::to_string(bytes));
  if (need > 0 && workspace == nullptr)
    return Status::Invalid(std::string(c.name) + ": workspace must not be null: plan " + to_string(plan) + " needs " +
                           std::to_string(need) + " bytes");
  if (need > 0 && reinterpret_cast<uintptr_t>(workspace) % 256 != 0)
    return Status::Invalid(std::string(c.name) + ": workspace must be 256-byte aligned");
  return Status::Ok();
}

Status launch(const AttentionPlan& plan, const AttentionCall& c, const Prepared& w, void* workspace,
              cudaStream_t stream) {
  return dispatch_dtype(w.dtype, c.name, [&](auto tag) -> Status {
    using T = decltype(tag);
    if constexpr (std::is_same<T, float>::value) {  // validation admits only float16 / bfloat16 here
      return Status::Invalid(std::string(c.name) + ": q must be float16 or bfloat16, got float32");
    } else {
      return launch_attention_fwd<T>(plan, w.p, *w.dev, workspace, stream);
    }
  });
}

AttentionCall make_call(const AttentionTensors& t, const AttentionOptions& opts) {
  AttentionCall c;
  c.name = "attention_forward";
  c.cuda = true;
  c.t = t;
  c.opts = opts;
  return c;
}

}  // namespace

Status launch_with_plan(const AttentionPlan& plan, const AttentionCall& call, void* workspace, size_t bytes,
                        cudaStream_t stream) {
  Prepared w;
  Status s = prepare(call, &w);
  if (!s.ok()) return s;
  if (empty(w.problem)) return Status::Ok();
  if (!(s = check_plan(plan, w.problem, *w.dev)).ok()) return s;
  if (!(s = check_workspace(call, w, plan, workspace, bytes)).ok()) return s;
  return launch(plan, call, w, workspace, stream);
}

Status attention_candidate_plans(const AttentionCall& call, std::vector<AttentionPlan>* plans) {
  Prepared w;
  Status s = prepare(call, &w);
  if (!s.ok()) return s;
  plans->clear();
  if (!empty(w.problem)) *plans = candidate_plans(w.problem, *w.dev);
  return Status::Ok();
}

Status attention_plan(const AttentionTensors& t, const AttentionOptions& opts, AttentionPlan* plan,
                      size_t* workspace_bytes_out) {
  AttentionCall c = make_call(t, opts);
  c.name = "attention_plan";
  if (plan == nullptr || workspace_bytes_out == nullptr)
    return Status::Invalid("attention_plan: plan and workspace_bytes must not be null");
  Prepared w;
  Status s = prepare(c, &w);
  if (!s.ok()) return s;
  if (empty(w.problem)) {  // nothing runs: a plan that names the head dims, no workspace
    *plan = AttentionPlan{};
    plan->head_dim_qk = w.p.head_dim_qk;
    plan->head_dim_v = w.p.head_dim_v;
    *workspace_bytes_out = 0;
    return Status::Ok();
  }
  *plan = plan_attention_fwd(w.problem, *w.dev);
  *workspace_bytes_out = workspace_bytes(*plan, w.problem);
  return Status::Ok();
}

Status attention_forward(const AttentionPlan& plan, const AttentionTensors& t, const AttentionOptions& opts,
                         void* workspace, size_t bytes, cudaStream_t stream) {
  const AttentionCall c = make_call(t, opts);
  Prepared w;
  Status s = prepare(c, &w);
  if (!s.ok()) return s;
  if (empty(w.problem)) return Status::Ok();
  if (!(s = check_plan(plan, w.problem, *w.dev)).ok())
    return Status(s.code(), s.message() + " (pass a plan from attention_plan for the same shapes and options)");
  if (!(s = check_workspace(c, w, plan, workspace, bytes)).ok()) return s;
  return launch(plan, c, w, workspace, stream);
}

Status attention_forward(const AttentionTensors& t, const AttentionOptions& opts, void* workspace,
                         size_t* bytes, cudaStream_t stream) {
  const AttentionCall c = make_call(t, opts);
  if (bytes == nullptr) return Status::Invalid("attention_forward: workspace_bytes must not be null");
  Prepared w;
  Status s = prepare(c, &w);
  if (!s.ok()) return s;
  if (empty(w.problem)) {
    if (workspace == nullptr) *bytes = 0;
    return Status::Ok();
  }
  const AttentionPlan plan = plan_attention_fwd(w.problem, *w.dev);
  const size_t need = workspace_bytes(plan, w.problem);
  if (workspace == nullptr) {  // CUB's size query: report and launch nothing
    *bytes = need;
    return Status::Ok();
  }
  if (!(s = check_workspace(c, w, plan, workspace, *bytes)).ok()) return s;
  return launch(plan, c, w, workspace, stream);
}

}  // namespace kernelforge
