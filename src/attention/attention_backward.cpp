// SCAFFOLD (owner: backward core): the public backward entries, validate_attention_backward,
// make_attention_bwd_problem, launch_bwd_with_plan, attention_candidate_bwd_plans and
// ref::attention_backward. Replaced by the real ones.
#include "attention/attention_plan.h"
#include "attention/attention_problem.h"

namespace kernelforge {

namespace {
Status not_yet(const char* name) { return Status::NotSupported(std::string(name) + ": not built yet"); }
}  // namespace

Status validate_attention_backward(const AttentionGradCall& c, AttentionGradParams* p, DType* dtype) {
  (void)p;
  (void)dtype;
  return not_yet(c.name);
}

AttentionProblem make_attention_bwd_problem(const AttentionGradParams& p, DType dtype) {
  return make_attention_problem(p.f, dtype);
}

Status launch_bwd_with_plan(const AttentionPlan& plan, const AttentionGradCall& call, void* workspace, size_t bytes,
                            cudaStream_t stream) {
  (void)plan, (void)workspace, (void)bytes, (void)stream;
  return not_yet(call.name);
}

Status attention_candidate_bwd_plans(const AttentionGradCall& call, std::vector<AttentionPlan>* plans) {
  (void)plans;
  return not_yet(call.name);
}

Status attention_backward_plan(const AttentionGradTensors& t, const AttentionOptions& opts, AttentionPlan* plan,
                               size_t* workspace_bytes) {
  (void)t, (void)opts, (void)plan, (void)workspace_bytes;
  return not_yet("attention_backward_plan");
}

Status attention_backward(const AttentionPlan& plan, const AttentionGradTensors& t, const AttentionOptions& opts,
                          void* workspace, size_t workspace_bytes, cudaStream_t stream) {
  (void)plan, (void)t, (void)opts, (void)workspace, (void)workspace_bytes, (void)stream;
  return not_yet("attention_backward");
}

Status attention_backward(const AttentionGradTensors& t, const AttentionOptions& opts, void* workspace,
                          size_t* workspace_bytes, cudaStream_t stream) {
  (void)t, (void)opts, (void)workspace, (void)workspace_bytes, (void)stream;
  return not_yet("attention_backward");
}

namespace ref {
Status attention_backward(const AttentionGradTensors& t, const AttentionOptions& opts) {
  (void)t, (void)opts;
  return not_yet("ref::attention_backward");
}
}  // namespace ref

}  // namespace kernelforge
