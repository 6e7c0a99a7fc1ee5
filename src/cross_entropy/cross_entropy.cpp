// Public entry points of the cross-entropy family: validate (cross_entropy_validate.cpp), check the
// device (common/device.h) and the workspace, plan (cross_entropy_plan.cpp), launch
// (cross_entropy_launch.cuh) with the dtype dispatched once (common/dispatch.h).
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <string>

#include "common/device.h"
#include "common/dispatch.h"
#include "cross_entropy/cross_entropy_plan.h"
#include "cross_entropy/cross_entropy_problem.h"

namespace kernelforge {

// The forward's segments (ce_segment_elems); the workspace is sized for the float32 count, the largest.
int64_t ce_segment_len(DType t) { return ce_segment_elems(int(dtype_size(t))); }
int64_t ce_segments(int64_t vocab, DType t) { return (vocab + ce_segment_len(t) - 1) / ce_segment_len(t); }
size_t ce_workspace_bytes(int64_t rows, int64_t vocab, DType t) {
  const int64_t nfin = (rows + kCeFinalizeBlock - 1) / kCeFinalizeBlock;
  return size_t(rows * ce_segments(vocab, t)) * 16 + size_t(nfin) * 8 + 16;
}
size_t cross_entropy_workspace_size(int64_t tokens, int64_t vocab) {
  return ce_workspace_bytes(tokens, vocab, DType::kFloat32);
}

namespace {

// A validated call on the current device (and, for the forward, a workspace that fits): its params,
// dtype, device facts and problem.
struct Prepared {
  CeParams p;
  DType dtype = DType::kFloat32;
  const DeviceInfo* dev = nullptr;
  CeProblem problem;
};

Status prepare(const CeCall& c, void* workspace, size_t workspace_bytes, Prepared* out) {
  Status s = validate_cross_entropy(c, &out->p, &out->dtype);
  if (!s.ok()) return s;
  if (!(s = check_device(c.name, c.logits->device.index, out->dtype, &out->dev)).ok()) return s;
  if (!c.backward) {
    const size_t need = ce_workspace_bytes(out->p.rows, out->p.vocab, out->dtype);
    if (workspace_bytes < need || (workspace == nullptr && need > 0))
      return Status::Invalid("cross_entropy: workspace must hold at least " + std::to_string(need) +
                             " bytes (cross_entropy_workspace_size), got " + std::to_string(workspace_bytes));
    if (reinterpret_cast<uintptr_t>(workspace) % 16 != 0)
      return Status::Invalid("cross_entropy: workspace must be 16-byte aligned");
  }
  out->problem = make_ce_problem(out->p, c.backward, int(dtype_size(out->dtype)));
  return Status::Ok();
}

Status launch(const CePlan& plan, const CeCall& c, const Prepared& w, void* workspace, cudaStream_t stream) {
  return dispatch_dtype(
      w.dtype, c.name, [&](auto t) { return launch_cross_entropy<decltype(t)>(plan, w.p, *w.dev, workspace, stream); });
}

Status run(const CeCall& c, void* workspace, size_t workspace_bytes, cudaStream_t stream) {
  Prepared w;
  Status s = prepare(c, workspace, workspace_bytes, &w);
  if (!s.ok()) return s;
  if (c.backward && w.p.rows == 0) return Status::Ok();  // nothing to compute: no launch
  return launch(plan_cross_entropy(w.problem, *w.dev), c, w, workspace, stream);
}

}  // namespace

Status launch_with_plan(const CePlan& plan, const CeCall& call, void* workspace, size_t workspace_bytes,
                        cudaStream_t stream) {
  Prepared w;
  Status s = prepare(call, workspace, workspace_bytes, &w);
  if (!s.ok()) return s;
  if (!(s = check_plan(plan, w.problem, *w.dev)).ok()) return s;
  return launch(plan, call, w, workspace, stream);
}

Status ce_candidate_plans(const CeCall& call, std::vector<CePlan>* plans) {
  CeParams p;
  DType dtype;
  Status s = validate_cross_entropy(call, &p, &dtype);
  if (!s.ok()) return s;
  const DeviceInfo* dev = nullptr;
  if (!(s = check_device(call.name, call.logits->device.index, dtype, &dev)).ok()) return s;
  *plans = candidate_plans(make_ce_problem(p, call.backward, int(dtype_size(dtype))), *dev);
  return Status::Ok();
}

Status cross_entropy(const TensorView& logits, const TensorView& target, const CrossEntropyOptions& opts,
                     const TensorView& row_loss, const TensorView& lse, const TensorView& loss, const TensorView& valid,
                     void* workspace, size_t workspace_bytes, cudaStream_t stream) {
  CeCall c;
  c.name = "cross_entropy";
  c.opts = opts;
  c.logits = &logits, c.target = &target, c.row_loss = &row_loss, c.lse_out = &lse, c.loss = &loss,
  c.valid_out = &valid;
  return run(c, workspace, workspace_bytes, stream);
}

Status cross_entropy_backward(const TensorView& dloss, const TensorView& logits, const TensorView& target,
                              const TensorView& lse, const TensorView& valid, const CrossEntropyOptions& opts,
                              const TensorView& dlogits, cudaStream_t stream) {
  CeCall c;
  c.name = "cross_entropy_backward";
  c.backward = true;
  c.opts = opts;
  c.dloss = &dloss, c.logits = &logits, c.target = &target, c.lse = &lse, c.valid = &valid, c.dlogits = &dlogits;
  return run(c, nullptr, 0, stream);
}

}  // namespace kernelforge
