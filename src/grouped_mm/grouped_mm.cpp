// Public entry points of the grouped_mm family: validate (grouped_mm_validate.cpp), check the device,
// plan (grouped_mm_plan.cpp), then the wgmma kernels (sm90/, when built) or the mma launcher, with the
// dtype dispatched once here.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "common/device.h"
#include "common/plan_record.h"
#include "grouped_mm/grouped_mm_problem.h"

#ifndef KF_HAVE_CUTLASS
#define KF_HAVE_CUTLASS 0
#endif

namespace kernelforge {

bool grouped_mm_has_wgmma() { return KF_HAVE_CUTLASS != 0; }

namespace {

// The dtype and op dispatch of the wgmma kernels: F is called with (T{}, integral_constant<op>).
template <typename F>
Status wgmma_dispatch(DType dt, GroupedMmOp op, F&& f) {
  auto by_op = [&](auto t) -> Status {
    switch (op) {
      case GroupedMmOp::kRowsWRow:
        return f(t, std::integral_constant<GroupedMmOp, GroupedMmOp::kRowsWRow>{});
      case GroupedMmOp::kRowsWCol:
        return f(t, std::integral_constant<GroupedMmOp, GroupedMmOp::kRowsWCol>{});
      case GroupedMmOp::kWgrad:
        return f(t, std::integral_constant<GroupedMmOp, GroupedMmOp::kWgrad>{});
    }
    return Status::Invalid("grouped_mm: unknown op");
  };
  if (dt == DType::kBFloat16) return by_op(__nv_bfloat16{});
  if (dt == DType::kFloat16) return by_op(__half{});
  return Status::Invalid("grouped_mm: bfloat16 or float16 expected");
}

Status wgmma_workspace(DType dt, GroupedMmOp op, int groups, int sm_count, size_t* bytes) {
#if KF_HAVE_CUTLASS
  return wgmma_dispatch(dt, op, [&](auto t, auto o) {
    *bytes = gmm_wgmma_workspace<decltype(t), decltype(o)::value>(groups, sm_count);
    return Status::Ok();
  });
#else
  (void)dt, (void)op, (void)groups, (void)sm_count, (void)bytes;
  return Status::NotSupported("grouped_mm: this build has no wgmma kernels (CUTLASS was not found at configure time)");
#endif
}

Status wgmma_run(DType dt, const GmmParams& p, int sm_count, void* ws, cudaStream_t stream) {
#if KF_HAVE_CUTLASS
  return wgmma_dispatch(dt, p.op, [&](auto t, auto o) {
    return gmm_wgmma_run<decltype(t), decltype(o)::value>(p, sm_count, ws, stream);
  });
#else
  (void)dt, (void)p, (void)sm_count, (void)ws, (void)stream;
  return Status::NotSupported("grouped_mm: this build has no wgmma kernels (CUTLASS was not found at configure time)");
#endif
}

struct Prepared {
  GmmParams p;
  DType dtype = DType::kBFloat16;
  const DeviceInfo* dev = nullptr;
  GmmProblem problem;
};

Status prepare(const GmmCall& c, Prepared* w) {
  Status s = validate_grouped_mm(c, &w->p, &w->dtype);
  if (!s.ok()) return s;
  if (!(s = check_device(c.name, c.a->device.index, w->dtype, &w->dev)).ok()) return s;
  w->problem = make_gmm_problem(w->p, w->dtype);
  return Status::Ok();
}

// The plan with its workspace size filled in.
Status sized(GroupedMmPlan* plan, const Prepared& w) {
  plan->workspace = 0;
  if (plan->kernel != GroupedMmKernel::kWgmma) return Status::Ok();
  return wgmma_workspace(w.dtype, w.p.op, w.p.groups, w.dev->sm_count, &plan->workspace);
}

Status run_plan(GroupedMmPlan plan, const GmmCall& c, const Prepared& w, void* workspace, size_t* workspace_bytes,
                cudaStream_t stream) {
  Status s = sized(&plan, w);
  if (!s.ok()) return s;
  if (workspace_bytes == nullptr) return Status::Invalid(std::string(c.name) + ": workspace_bytes must not be null");
  if (workspace == nullptr) {
    *workspace_bytes = plan.workspace;
    return Status::Ok();
  }
  if (*workspace_bytes < plan.workspace)
    return Status::Invalid(std::string(c.name) + ": the workspace must hold " + std::to_string(plan.workspace) +
                           " bytes (the size asked with workspace == nullptr), got " +
                           std::to_string(*workspace_bytes));
  if (plan.workspace > 0 && reinterpret_cast<uintptr_t>(workspace) % 256 != 0)
    return Status::Invalid(std::string(c.name) + ": the workspace must be 256-byte aligned");
  if (plan.grid == 0) return Status::Ok();  // nothing to write
  record_plan(plan);
  if (plan.kernel == GroupedMmKernel::kWgmma) return wgmma_run(w.dtype, w.p, w.dev->sm_count, workspace, stream);
  if (w.dtype == DType::kBFloat16) return launch_grouped_mm_mma<__nv_bfloat16>(plan, w.p, *w.dev, stream);
  return launch_grouped_mm_mma<__half>(plan, w.p, *w.dev, stream);
}

Status run(const GmmCall& c, void* workspace, size_t* workspace_bytes, cudaStream_t stream) {
  Prepared w;
  Status s = prepare(c, &w);
  if (!s.ok()) return s;
  return run_plan(plan_grouped_mm(w.problem, *w.dev, grouped_mm_has_wgmma()), c, w, workspace, workspace_bytes, stream);
}

Status plan_of(const GmmCall& c, GroupedMmPlan* plan) {
  Prepared w;
  Status s = prepare(c, &w);
  if (!s.ok()) return s;
  *plan = plan_grouped_mm(w.problem, *w.dev, grouped_mm_has_wgmma());
  return sized(plan, w);
}

GmmCall rows_call(const TensorView& x, const TensorView& w, const TensorView& offsets, const TensorView& out) {
  GmmCall c;
  c.name = "grouped_mm";
  c.a = &x, c.b = &w, c.offsets = &offsets, c.out = &out;
  return c;
}

GmmCall wgrad_call(const TensorView& dy, const TensorView& x, const TensorView& offsets, const TensorView& dw) {
  GmmCall c;
  c.name = "grouped_mm_wgrad";
  c.wgrad = true;
  c.a = &dy, c.b = &x, c.offsets = &offsets, c.out = &dw;
  return c;
}

}  // namespace

Status grouped_mm(const TensorView& x, const TensorView& w, const TensorView& offsets, const TensorView& out,
                  void* workspace, size_t* workspace_bytes, cudaStream_t stream) {
  return run(rows_call(x, w, offsets, out), workspace, workspace_bytes, stream);
}

Status grouped_mm_wgrad(const TensorView& dy, const TensorView& x, const TensorView& offsets, const TensorView& dw,
                        void* workspace, size_t* workspace_bytes, cudaStream_t stream) {
  return run(wgrad_call(dy, x, offsets, dw), workspace, workspace_bytes, stream);
}

Status grouped_mm_plan(const TensorView& x, const TensorView& w, const TensorView& offsets, const TensorView& out,
                       GroupedMmPlan* plan) {
  return plan_of(rows_call(x, w, offsets, out), plan);
}

Status grouped_mm_wgrad_plan(const TensorView& dy, const TensorView& x, const TensorView& offsets, const TensorView& dw,
                             GroupedMmPlan* plan) {
  return plan_of(wgrad_call(dy, x, offsets, dw), plan);
}

Status gmm_launch_with_plan(const GroupedMmPlan& plan, const GmmCall& call, void* workspace, size_t* workspace_bytes,
                            cudaStream_t stream) {
  Prepared w;
  Status s = prepare(call, &w);
  if (!s.ok()) return s;
  if (!(s = check_plan(plan, w.problem, *w.dev, grouped_mm_has_wgmma())).ok()) return s;
  return run_plan(plan, call, w, workspace, workspace_bytes, stream);
}

Status gmm_candidate_plans(const GmmCall& call, std::vector<GroupedMmPlan>* plans) {
  Prepared w;
  Status s = prepare(call, &w);
  if (!s.ok()) return s;
  *plans = candidate_plans(w.problem, *w.dev, grouped_mm_has_wgmma());
  for (GroupedMmPlan& p : *plans)
    if (!(s = sized(&p, w)).ok()) return s;
  return Status::Ok();
}

}  // namespace kernelforge
