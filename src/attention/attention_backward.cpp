// Public entry points of the attention backward: validate (attention_validate_bwd.cpp), check the
// device (common/device.h), plan (attention_plan_bwd.cpp), launch (attention_bwd_launch.cuh) with
// the dtype dispatched once (common/dispatch.h). The structure of attention.cpp.
//
// A call without query rows (B, Hq or Tq = 0) computes nothing, but its gradients are still defined:
// dk = dv = 0 (no query reads the keys) and dsinks = 0 (an empty sum). These entries write those
// zeros themselves (cudaMemset2DAsync over the strided views) and never call the launcher, which
// therefore always sees batch, heads_q and total_q > 0, as the forward's does. Sk = 0 (dq = 0,
// dsinks = -sum p_sink D = 0 since out = 0) and varlen sequences without queries are the kernels'.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime_api.h>

#include <cstdint>
#include <string>
#include <type_traits>

#include "attention/attention_plan.h"
#include "attention/attention_problem.h"
#include "common/device.h"
#include "common/dispatch.h"
#include "common/validate_util.h"

namespace kernelforge {

namespace {

// A validated backward call on the current device: its params, dtype, device facts and problem.
struct Prepared {
  AttentionGradParams p;
  DType dtype = DType::kFloat16;
  const DeviceInfo* dev = nullptr;
  AttentionProblem problem;
};

Status prepare(const AttentionGradCall& c, Prepared* w) {
  Status s = validate_attention_backward(c, &w->p, &w->dtype);
  if (!s.ok()) return s;
  if (!(s = check_device(c.name, c.t.fwd.q->device.index, w->dtype, &w->dev)).ok()) return s;
  if (w->dev->capability < 80)  // the kernels use mma.sync m16n8k16 and cp.async (sm_80)
    return Status::NotSupported(std::string(c.name) + ": attention needs sm_80 or later, this GPU is sm_" +
                                std::to_string(w->dev->capability));
  w->problem = make_attention_bwd_problem(w->p, w->dtype);
  return Status::Ok();
}

// No query row: nothing to compute (see the top of the file for what is still written).
bool empty(const AttentionProblem& pr) { return pr.batch == 0 || pr.heads_q == 0 || pr.total_q == 0; }

// Zeros every element of a strided view (unit last stride, non-overlapping rows). Views whose rows
// collapse into one stride take one cudaMemset2DAsync; others one per index of the dimensions other
// than the longest row dimension (a few calls for slices of a fused buffer).
Status zero_view(const char* name, const TensorView& x, cudaStream_t stream) {
  if (x.numel() == 0) return Status::Ok();
  const size_t es = dtype_size(x.dtype);
  const int nd = x.ndim;
  const size_t width = size_t(x.shape[nd - 1]) * es;
  cudaError_t e = cudaSuccess;
  int64_t row_stride = 0;
  if (validate_util::collapse_rows(x, &row_stride).empty()) {
    const int64_t rows = x.numel() / x.shape[nd - 1];
    e = cudaMemset2DAsync(x.data, size_t(row_stride) * es, 0, width, size_t(rows), stream);
  } else {
    int hd = 0;  // the memset's height dimension: the longest of the row dimensions
    for (int d = 1; d < nd - 1; ++d)
      if (x.shape[d] > x.shape[hd]) hd = d;
    int64_t idx[kMaxDims] = {};
    const int64_t calls = x.numel() / (x.shape[nd - 1] * x.shape[hd]);
    for (int64_t n = 0; n < calls && e == cudaSuccess; ++n) {
      int64_t off = 0, rem = n;  // decode n over the dimensions other than hd and the last
      for (int d = nd - 2; d >= 0; --d) {
        if (d == hd) continue;
        idx[d] = rem % x.shape[d], rem /= x.shape[d];
        off += idx[d] * x.strides[d];
      }
      e = cudaMemset2DAsync(static_cast<char*>(x.data) + off * int64_t(es), size_t(x.strides[hd]) * es, 0, width,
                            size_t(x.shape[hd]), stream);
    }
  }
  if (e != cudaSuccess)
    return Status::Cuda(std::string(name) + ": zeroing the gradients failed: " + cudaGetErrorString(e));
  return Status::Ok();
}

// The gradients of a call without query rows: dk = dv = 0, dsinks = 0 (dq has no element).
Status zero_gradients(const AttentionGradCall& c, cudaStream_t stream) {
  Status s;
  if (!(s = zero_view(c.name, *c.t.dk, stream)).ok()) return s;
  if (!(s = zero_view(c.name, *c.t.dv, stream)).ok()) return s;
  if (c.t.dsinks) return zero_view(c.name, *c.t.dsinks, stream);
  return Status::Ok();
}

Status check_workspace(const AttentionGradCall& c, const Prepared& w, const AttentionPlan& plan, const void* workspace,
                       size_t bytes) {
  const size_t need = bwd_workspace_bytes(plan, w.problem);
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

Status launch(const AttentionPlan& plan, const AttentionGradCall& c, const Prepared& w, void* workspace,
              cudaStream_t stream) {
  return dispatch_dtype(w.dtype, c.name, [&](auto tag) -> Status {
    using T = decltype(tag);
    if constexpr (std::is_same<T, float>::value) {  // validation admits only float16 / bfloat16 here
      return Status::Invalid(std::string(c.name) + ": q must be float16 or bfloat16, got float32");
    } else {
      return launch_attention_bwd<T>(plan, w.p, *w.dev, workspace, stream);
    }
  });
}

AttentionGradCall make_call(const AttentionGradTensors& t, const AttentionOptions& opts, const char* name) {
  AttentionGradCall c;
  c.name = name;
  c.cuda = true;
  c.t = t;
  c.opts = opts;
  return c;
}

}  // namespace

Status launch_bwd_with_plan(const AttentionPlan& plan, const AttentionGradCall& call, void* workspace, size_t bytes,
                            cudaStream_t stream) {
  Prepared w;
  Status s = prepare(call, &w);
  if (!s.ok()) return s;
  if (empty(w.problem)) return zero_gradients(call, stream);
  if (!(s = check_bwd_plan(plan, w.problem, *w.dev)).ok()) return s;
  if (!(s = check_workspace(call, w, plan, workspace, bytes)).ok()) return s;
  return launch(plan, call, w, workspace, stream);
}

Status attention_candidate_bwd_plans(const AttentionGradCall& call, std::vector<AttentionPlan>* plans) {
  Prepared w;
  Status s = prepare(call, &w);
  if (!s.ok()) return s;
  plans->clear();
  if (!empty(w.problem)) *plans = candidate_bwd_plans(w.problem, *w.dev);
  return Status::Ok();
}

Status attention_backward_plan(const AttentionGradTensors& t, const AttentionOptions& opts, AttentionPlan* plan,
                               size_t* workspace_bytes_out) {
  const AttentionGradCall c = make_call(t, opts, "attention_backward_plan");
  if (plan == nullptr || workspace_bytes_out == nullptr)
    return Status::Invalid("attention_backward_plan: plan and workspace_bytes must not be null");
  Prepared w;
  Status s = prepare(c, &w);
  if (!s.ok()) return s;
  if (empty(w.problem)) {  // nothing runs but the zero fill: a plan that names the head dims, no workspace
    *plan = AttentionPlan{};
    plan->kind = AttentionKernel::kBwdMma;
    plan->head_dim_qk = w.p.f.head_dim_qk;
    plan->head_dim_v = w.p.f.head_dim_v;
    *workspace_bytes_out = 0;
    return Status::Ok();
  }
  *plan = plan_attention_bwd(w.problem, *w.dev);
  // the planner's choice can still be impossible (no kernel built for the head dims, a grid too
  // large): say why here rather than at the run
  if (!(s = check_bwd_plan(*plan, w.problem, *w.dev)).ok()) return s;
  *workspace_bytes_out = bwd_workspace_bytes(*plan, w.problem);
  return Status::Ok();
}

Status attention_backward(const AttentionPlan& plan, const AttentionGradTensors& t, const AttentionOptions& opts,
                          void* workspace, size_t bytes, cudaStream_t stream) {
  const AttentionGradCall c = make_call(t, opts, "attention_backward");
  Prepared w;
  Status s = prepare(c, &w);
  if (!s.ok()) return s;
  if (empty(w.problem)) return zero_gradients(c, stream);
  if (!(s = check_bwd_plan(plan, w.problem, *w.dev)).ok())
    return Status(s.code(),
                  s.message() + " (pass a plan from attention_backward_plan for the same shapes and options)");
  if (!(s = check_workspace(c, w, plan, workspace, bytes)).ok()) return s;
  return launch(plan, c, w, workspace, stream);
}

Status attention_backward(const AttentionGradTensors& t, const AttentionOptions& opts, void* workspace, size_t* bytes,
                          cudaStream_t stream) {
  const AttentionGradCall c = make_call(t, opts, "attention_backward");
  if (bytes == nullptr) return Status::Invalid("attention_backward: workspace_bytes must not be null");
  Prepared w;
  Status s = prepare(c, &w);
  if (!s.ok()) return s;
  if (empty(w.problem)) {  // CUB's convention holds here too: a null workspace is only the size query
    if (workspace == nullptr) {
      *bytes = 0;
      return Status::Ok();
    }
    return zero_gradients(c, stream);
  }
  const AttentionPlan plan = plan_attention_bwd(w.problem, *w.dev);
  if (!(s = check_bwd_plan(plan, w.problem, *w.dev)).ok()) return s;
  const size_t need = bwd_workspace_bytes(plan, w.problem);
  if (workspace == nullptr) {  // CUB's size query: report and launch nothing
    *bytes = need;
    return Status::Ok();
  }
  if (!(s = check_workspace(c, w, plan, workspace, *bytes)).ok()) return s;
  return launch(plan, c, w, workspace, stream);
}

}  // namespace kernelforge
