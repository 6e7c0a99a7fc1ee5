// SCAFFOLD (replaced by the planner and its tables before landing).
#include "attention/attention_plan.h"

namespace kernelforge {

std::string to_string(const AttentionPlan& p) {
  return std::string(p.kind == AttentionKernel::kWgmma ? "attn_fwd_wgmma" : "attn_fwd_mma") + " d=" +
         std::to_string(p.head_dim_qk) + "/" + std::to_string(p.head_dim_v);
}

AttentionPlan plan_attention_fwd(const AttentionProblem& pr, const DeviceInfo&) {
  AttentionPlan p;
  p.head_dim_qk = pr.head_dim_qk, p.head_dim_v = pr.head_dim_v;
  return p;
}

std::vector<AttentionPlan> candidate_plans(const AttentionProblem& pr, const DeviceInfo& dev) {
  return {plan_attention_fwd(pr, dev)};
}

Status check_plan(const AttentionPlan&, const AttentionProblem&, const DeviceInfo&) { return Status::Ok(); }

size_t workspace_bytes(const AttentionPlan&, const AttentionProblem&) { return 0; }

}  // namespace kernelforge
