// Public entry points of the linear family: validate (linear_validate.cpp), check the device, plan
// (linear_plan.cpp), launch (linear_launch.cuh) with the dtype dispatched once.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <string>
#include <type_traits>

#include "common/device.h"
#include "common/dispatch.h"
#include "linear/linear_plan.h"

namespace kernelforge {

template <typename T>
Status launch_linear(const LinearPlan& plan, const LinearParams& p, void* workspace, cudaStream_t stream);

namespace {

struct Prepared {
  LinearParams p;
  DType dtype = DType::kFloat16;
  const DeviceInfo* dev = nullptr;
};

Status prepare(const char* name, const LinearTensors& t, Prepared* w) {
  Status s = validate_linear(name, true, t, &w->p, &w->dtype);
  if (!s.ok()) return s;
  if (!(s = check_device(name, t.x->device.index, w->dtype, &w->dev)).ok()) return s;
  if (w->dev->capability < 80)  // mma.sync m16n8k16 and cp.async
    return Status::NotSupported(std::string(name) + ": linear needs sm_80 or later, this GPU is sm_" +
                                std::to_string(w->dev->capability));
  return Status::Ok();
}

bool empty(const LinearParams& p) { return p.M == 0 || p.N == 0; }

// Whether one-row calls take the GEMV kernel (linear_plan.h: kLinearGemvByDefault; KF_LINEAR_GEMV=0 or 1
// overrides it, read once: the bench times either kernel through the public entries).
bool gemv_default() {
  static const bool on = env_switch("KF_LINEAR_GEMV", kLinearGemvByDefault);
  return on;
}

LinearPlan default_plan(const Prepared& w) {
  return plan_linear(w.p, *w.dev, w.dev->capability == 90 && linear_tma_built(), gemv_default());
}

Status check_workspace(const LinearPlan& plan, const LinearParams& p, const void* workspace, size_t bytes) {
  const size_t need = linear_workspace_bytes(plan, p);
  if (bytes < need)
    return Status::Invalid("linear: workspace_bytes must be at least " + std::to_string(need) + " for plan " +
                           to_string(plan) + ", got " + std::to_string(bytes));
  if (need > 0 && workspace == nullptr)
    return Status::Invalid("linear: workspace must not be null: plan " + to_string(plan) + " needs " +
                           std::to_string(need) + " bytes");
  if (need > 0 && reinterpret_cast<uintptr_t>(workspace) % 256 != 0)
    return Status::Invalid("linear: workspace must be 256-byte aligned");
  return Status::Ok();
}

Status launch(const LinearPlan& plan, const Prepared& w, void* workspace, cudaStream_t stream) {
  return dispatch_dtype(w.dtype, "linear", [&](auto tag) -> Status {
    using T = decltype(tag);
    if constexpr (std::is_same<T, float>::value) {  // validation admits only float16 / bfloat16 on CUDA
      return Status::Invalid("linear: x must be float16 or bfloat16, got float32");
    } else {
      return launch_linear<T>(plan, w.p, workspace, stream);
    }
  });
}

}  // namespace

Status linear_plan(const LinearTensors& t, LinearPlan* plan, size_t* bytes) {
  if (plan == nullptr || bytes == nullptr)
    return Status::Invalid("linear_plan: plan and workspace_bytes must not be null");
  Prepared w;
  Status s = prepare("linear", t, &w);
  if (!s.ok()) return s;
  *plan = default_plan(w);
  *bytes = empty(w.p) ? 0 : linear_workspace_bytes(*plan, w.p);
  return Status::Ok();
}

Status linear(const LinearPlan& plan, const LinearTensors& t, void* workspace, size_t bytes, cudaStream_t stream) {
  Prepared w;
  Status s = prepare("linear", t, &w);
  if (!s.ok()) return s;
  if (empty(w.p)) return Status::Ok();
  if (!(s = check_linear_plan(plan, w.p, *w.dev)).ok()) return s;
  if (!(s = check_workspace(plan, w.p, workspace, bytes)).ok()) return s;
  return launch(plan, w, workspace, stream);
}

Status linear(const LinearTensors& t, void* workspace, size_t* bytes, cudaStream_t stream) {
  if (bytes == nullptr) return Status::Invalid("linear: workspace_bytes must not be null");
  Prepared w;
  Status s = prepare("linear", t, &w);
  if (!s.ok()) return s;
  if (empty(w.p)) {
    if (workspace == nullptr) *bytes = 0;
    return Status::Ok();
  }
  const LinearPlan plan = default_plan(w);
  const size_t need = linear_workspace_bytes(plan, w.p);
  if (workspace == nullptr) {
    *bytes = need;
    return Status::Ok();
  }
  if (!(s = check_workspace(plan, w.p, workspace, *bytes)).ok()) return s;
  return launch(plan, w, workspace, stream);
}

}  // namespace kernelforge
