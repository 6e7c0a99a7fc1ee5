// Public entry points of the diagonal_matmul family: validate (diagonal_matmul_validate.cpp), check
// the device (common/device.h), plan (diagonal_matmul_plan.cpp), launch (diagonal_matmul_launch.cuh)
// with the dtype dispatched once (common/dispatch.h).
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "common/device.h"
#include "common/dispatch.h"
#include "diagonal_matmul/diagonal_matmul_plan.h"
#include "diagonal_matmul/diagonal_matmul_problem.h"

namespace kernelforge {

namespace {

// The float32 row sums of a broadcast a's da: B · M floats, 16-byte aligned.
size_t row_sum_bytes(const DmParams& p) { return size_t(p.rows) * sizeof(float); }

// A validated call on the current device: its params, dtype, device facts and problem. A backward
// without da runs as the forward on dy (db = a · dy); with a broadcast a, da goes through the float32
// row sums in `workspace` (*workspace_bytes receives their size; workspace == nullptr: size only).
struct Prepared {
  DmParams p;
  DType dtype = DType::kFloat32;
  const DeviceInfo* dev = nullptr;
  DmProblem problem;
  bool size_only = false;
};

Status prepare(const DmCall& c, void* workspace, size_t* workspace_bytes, Prepared* out) {
  bool broadcast = false;
  Status s = validate_diagonal_matmul(c, &out->p, &out->dtype, &broadcast);
  if (!s.ok()) return s;
  DmParams& p = out->p;
  bool dm_bwd = c.backward;
  if (c.backward) {
    const size_t need = broadcast && c.da != nullptr ? row_sum_bytes(p) : 0;
    if (workspace_bytes == nullptr) return Status::Invalid(std::string(c.name) + ": workspace_bytes must not be null");
    if (workspace == nullptr) {
      *workspace_bytes = need;
      out->size_only = true;
      return Status::Ok();
    }
    if (*workspace_bytes < need)
      return Status::Invalid(std::string(c.name) + ": the workspace must hold " + std::to_string(need) +
                             " bytes (the size asked with workspace == nullptr), got " +
                             std::to_string(*workspace_bytes));
    if (need > 0 && reinterpret_cast<uintptr_t>(workspace) % 16 != 0)
      return Status::Invalid(std::string(c.name) + ": the workspace must be 16-byte aligned");
    if (c.da == nullptr) {  // db = a · dy: the forward kernel on dy
      dm_bwd = false;
      p.b = p.dy, p.b_stride = p.dy_stride;
      p.y = p.db, p.y_stride = p.db_stride;
      p.dy = nullptr, p.db = nullptr;
      if (p.n == 0) p.rows = 0;  // nothing to write
    } else if (broadcast) {
      p.da_rows = static_cast<float*>(workspace);
    }
  }
  if (!(s = check_device(c.name, c.b->device.index, out->dtype, &out->dev)).ok()) return s;
  out->problem = make_dm_problem(p, dm_bwd, int(dtype_size(out->dtype)));
  return Status::Ok();
}

Status launch(const DmPlan& plan, const DmCall& c, const Prepared& w, cudaStream_t stream) {
  return dispatch_dtype(w.dtype, c.name,
                        [&](auto t) { return launch_diagonal_matmul<decltype(t)>(plan, w.p, *w.dev, stream); });
}

Status run(const DmCall& c, void* workspace, size_t* workspace_bytes, cudaStream_t stream) {
  Prepared w;
  Status s = prepare(c, workspace, workspace_bytes, &w);
  if (!s.ok() || w.size_only) return s;
  if (!dm_has_work(w.problem)) return Status::Ok();  // nothing to write: no launch
  return launch(plan_diagonal_matmul(w.problem, *w.dev), c, w, stream);
}

}  // namespace

Status dm_launch_with_plan(const DmPlan& plan, const DmCall& call, void* workspace, size_t* workspace_bytes,
                           cudaStream_t stream) {
  Prepared w;
  Status s = prepare(call, workspace, workspace_bytes, &w);
  if (!s.ok() || w.size_only) return s;
  if (!(s = check_plan(plan, w.problem, *w.dev)).ok()) return s;
  return launch(plan, call, w, stream);
}

Status dm_candidate_plans(const DmCall& call, std::vector<DmPlan>* plans) {
  // A broadcast backward plans with its row sums in a stand-in workspace (only its presence counts).
  alignas(16) static float stand_in[4];
  size_t bytes = ~size_t(0);
  Prepared w;
  Status s = prepare(call, stand_in, &bytes, &w);
  if (!s.ok()) return s;
  *plans = candidate_plans(w.problem, *w.dev);
  return Status::Ok();
}

Status diagonal_matmul(const TensorView& a, const TensorView& b, const TensorView& y, cudaStream_t stream) {
  DmCall c;
  c.name = "diagonal_matmul";
  c.a = &a, c.b = &b, c.y = &y;
  return run(c, nullptr, nullptr, stream);
}

Status diagonal_matmul_backward(const TensorView& dy, const TensorView& a, const TensorView& b, const TensorView* da,
                                const TensorView* db, void* workspace, size_t* workspace_bytes, cudaStream_t stream) {
  DmCall c;
  c.name = "diagonal_matmul_backward";
  c.backward = true;
  c.dy = &dy, c.a = &a, c.b = &b, c.da = da, c.db = db;
  return run(c, workspace, workspace_bytes, stream);
}

}  // namespace kernelforge
