// The activation launcher: one switch over plan.kind, one launch per kind (the bias gradient: its
// column pass, then its reduction). The plan's (vec, vecs) pick the kernel instantiation; only the
// pairs of kActBuilds (activation_plan.cpp) are built, and check_plan has rejected every other plan
// before a launch. Included by activation_<dtype>.cu.
#pragma once

#include <cuda_runtime.h>

#include "activation/activation_plan.h"
#include "activation/kernels/act_bias_grad.cuh"
#include "activation/kernels/act_bias_reduce.cuh"
#include "activation/kernels/act_bwd.cuh"
#include "activation/kernels/act_fwd.cuh"
#include "common/launch.cuh"
#include "common/plan_record.h"

namespace kernelforge {
namespace act_detail {

using ActKernelFn = void (*)(const ActParams);

template <typename T, bool kBwd, ActFn kFn, bool kGated, int kVec, int kVecsPerThread>
ActKernelFn instance() {
  if constexpr (kBwd)
    return act_bwd<T, kFn, kGated, kVec, kVecsPerThread>;
  else
    return act_fwd<T, kFn, kGated, kVec, kVecsPerThread>;
}

// The instantiation of act_fwd (kBwd false) or act_bwd for (vec, vecs); nullptr if not built.
template <typename T, bool kBwd, ActFn kFn, bool kGated>
ActKernelFn kernel_for(int vec, int vecs) {
  constexpr int kWide = 16 / int(sizeof(T));  // elements of a 16-byte vector
  constexpr int kWideVecs = kBwd ? 2 : 4;     // kActBuilds' wide rows besides 1
  constexpr int kNarrowVecs = kBwd ? 4 : 8;   // kActBuilds' narrow rows
  if (vec == kWide && vecs == 1) return instance<T, kBwd, kFn, kGated, kWide, 1>();
  if (vec == kWide && vecs == kWideVecs) return instance<T, kBwd, kFn, kGated, kWide, kWideVecs>();
  if constexpr (sizeof(T) == 2) {
    if (vec == 2 && vecs == kNarrowVecs) return instance<T, kBwd, kFn, kGated, 2, kNarrowVecs>();
  }
  if (vec == 1 && vecs == kNarrowVecs) return instance<T, kBwd, kFn, kGated, 1, kNarrowVecs>();
  return nullptr;
}

template <typename T, bool kBwd>
ActKernelFn kernel_for(ActFn fn, bool gated, int vec, int vecs) {
  switch (fn) {
    case ActFn::kSilu:  // silu alone is not an op
      return gated ? kernel_for<T, kBwd, ActFn::kSilu, true>(vec, vecs) : nullptr;
    case ActFn::kGeluErf:
      return gated ? kernel_for<T, kBwd, ActFn::kGeluErf, true>(vec, vecs)
                   : kernel_for<T, kBwd, ActFn::kGeluErf, false>(vec, vecs);
    case ActFn::kGeluTanh:
      return gated ? kernel_for<T, kBwd, ActFn::kGeluTanh, true>(vec, vecs)
                   : kernel_for<T, kBwd, ActFn::kGeluTanh, false>(vec, vecs);
  }
  return nullptr;
}

// ---- the bias gradient (gelu_backward_bias_grad) -------------------------------------------------
using ActBiasKernelFn = void (*)(const ActParams, const int64_t);

// The instantiation of act_bias_grad for (vec, rows in flight); nullptr if not built (kActBuilds'
// kBiasGrad rows: 16-byte vectors with 2 or 4 rows, narrow accesses with 8).
template <typename T, ActFn kFn>
ActBiasKernelFn bias_kernel_for(int vec, int rows) {
  constexpr int kWide = 16 / int(sizeof(T));
  if (vec == kWide && rows == 2) return act_bias_grad<T, kFn, kWide, 2>;
  if (vec == kWide && rows == 4) return act_bias_grad<T, kFn, kWide, 4>;
  if constexpr (sizeof(T) == 2) {
    if (vec == 2 && rows == 8) return act_bias_grad<T, kFn, 2, 8>;
  }
  if (vec == 1 && rows == 8) return act_bias_grad<T, kFn, 1, 8>;
  return nullptr;
}

template <typename T, typename OutT>
Status launch_bias_reduce(const ActPlan& plan, const ActParams& p, bool pdl, cudaStream_t stream) {
  Launch l(dim3(unsigned(ceil_div(p.n, int64_t(kActBiasTx)))), dim3(kActBiasTx, kActBiasTy), 0, stream, pdl);
  return launched(l(act_bias_reduce<T, OutT>, static_cast<const float*>(p.partials), plan.grid_y, p.n,
                    static_cast<OutT*>(p.dbias), p.dbias_stride),
                  "gelu_backward_bias_grad reduction");
}

template <typename T>
Status launch_bias_grad(const ActPlan& plan, ActFn fn, const ActParams& p, const DeviceInfo& dev, cudaStream_t stream) {
  const bool pdl = use_pdl(dev);
  if (plan.grid_y > 0) {  // no rows: the reduction alone writes dbias = 0
    ActBiasKernelFn kernel = fn == ActFn::kGeluErf    ? bias_kernel_for<T, ActFn::kGeluErf>(plan.vec, plan.vecs)
                             : fn == ActFn::kGeluTanh ? bias_kernel_for<T, ActFn::kGeluTanh>(plan.vec, plan.vecs)
                                                      : nullptr;
    if (kernel == nullptr) return Status::Invalid("gelu_backward_bias_grad: no kernel built for " + to_string(plan));
    Launch l(dim3(unsigned(plan.grid_x), unsigned(plan.grid_y)), dim3(unsigned(plan.tx), unsigned(plan.ty)), 0, stream,
             pdl);
    const Status s = launched(l(kernel, p, plan.chunk_rows), "gelu_backward_bias_grad column pass");
    if (!s.ok()) return s;
  }
  switch (p.dbias_dtype) {
    case DType::kFloat32:
      return launch_bias_reduce<T, float>(plan, p, pdl, stream);
    case DType::kFloat16:
      return launch_bias_reduce<T, __half>(plan, p, pdl, stream);
    case DType::kBFloat16:
      return launch_bias_reduce<T, __nv_bfloat16>(plan, p, pdl, stream);
    default:
      return Status::Invalid(std::string("gelu_backward_bias_grad: dbias has an unsupported dtype ") +
                             dtype_name(p.dbias_dtype));
  }
}

inline Status launch_grid(ActKernelFn kernel, const ActPlan& plan, const ActParams& p, const DeviceInfo& dev,
                          cudaStream_t stream, const char* what) {
  if (kernel == nullptr) return Status::Invalid(std::string(what) + ": no kernel built for " + to_string(plan));
  const bool pdl = use_pdl(dev);
  ActParams q = p;  // a grid of at most one block per SM is resident at once: let the next kernel in
  q.trigger = pdl && int64_t(plan.grid_x) * plan.grid_y <= dev.sm_count;
  Launch l(dim3(unsigned(plan.grid_x), unsigned(plan.grid_y)), dim3(unsigned(plan.tx), unsigned(plan.ty)), 0, stream,
           pdl);
  return launched(l(kernel, q), what);
}

}  // namespace act_detail

template <typename T>
Status launch_activation(const ActPlan& plan, ActFn fn, bool gated, const ActParams& p, const DeviceInfo& dev,
                         cudaStream_t stream) {
  using namespace act_detail;
  record_plan(plan);
  switch (plan.kind) {
    case ActKernel::kFwd:
      return launch_grid(kernel_for<T, false>(fn, gated, plan.vec, plan.vecs), plan, p, dev, stream,
                         "activation forward");
    case ActKernel::kBwd:
      return launch_grid(kernel_for<T, true>(fn, gated, plan.vec, plan.vecs), plan, p, dev, stream,
                         "activation backward");
    case ActKernel::kBiasGrad:
      return launch_bias_grad<T>(plan, fn, p, dev, stream);
  }
  return Status::Invalid("activation: unknown kernel in plan " + to_string(plan));
}

}  // namespace kernelforge
