// SCAFFOLD (owner: the backward kernel): the backward planner. Replaced by the real table.
#include "attention/attention_plan.h"

namespace kernelforge {

AttentionPlan plan_attention_bwd(const AttentionProblem& problem, const DeviceInfo& dev) {
  (void)dev;
  AttentionPlan p;
  p.kind = AttentionKernel::kBwdMma;
  p.head_dim_qk = problem.head_dim_qk;
  p.head_dim_v = problem.head_dim_v;
  return p;
}

std::vector<AttentionPlan> candidate_bwd_plans(const AttentionProblem& problem, const DeviceInfo& dev) {
  return {plan_attention_bwd(problem, dev)};
}

Status check_bwd_plan(const AttentionPlan& plan, const AttentionProblem& problem, const DeviceInfo& dev) {
  (void)plan;
  (void)problem;
  (void)dev;
  return Status::NotSupported("attention_backward: no backward kernel is built yet");
}

size_t bwd_workspace_bytes(const AttentionPlan& plan, const AttentionProblem& problem) {
  (void)plan;
  (void)problem;
  return 0;
}

}  // namespace kernelforge
