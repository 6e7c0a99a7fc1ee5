// The cross-entropy launcher: one switch over plan.kind. The forward is a fixed sequence of three
// launches (partials, row losses, reduction), the backward one launch. The kernel instantiation is
// picked by (vec, scalar head, softcap); check_plan has accepted the plan before a launch. Included
// by cross_entropy_<dtype>.cu.
#pragma once

#include <cuda_runtime.h>

#include "common/launch.cuh"
#include "common/plan_record.h"
#include "cross_entropy/cross_entropy_plan.h"
#include "cross_entropy/kernels/ce_bwd.cuh"
#include "cross_entropy/kernels/ce_fwd_finalize.cuh"
#include "cross_entropy/kernels/ce_fwd_partial.cuh"
#include "cross_entropy/kernels/ce_reduce.cuh"

namespace kernelforge {
namespace ce_detail {

using PartialFn = void (*)(const CeParams, const int, float4*);
using BackwardFn = void (*)(const CeParams, const int);

// The instantiation for the plan's read path: 16-byte vectors, scalar head + 16-byte vectors, or one
// element per access; nullptr for any other (vec, scalar_head).
template <typename T, bool kSoftcap>
PartialFn partial_for(const CePlan& plan) {
  constexpr int kWide = 16 / int(sizeof(T));
  if (plan.vec == kWide)
    return plan.scalar_head ? ce_fwd_partial<T, kWide, kSoftcap, true> : ce_fwd_partial<T, kWide, kSoftcap, false>;
  return plan.vec == 1 && !plan.scalar_head ? ce_fwd_partial<T, 1, kSoftcap, false> : nullptr;
}
template <typename T, bool kSoftcap>
BackwardFn backward_for(const CePlan& plan) {
  constexpr int kWide = 16 / int(sizeof(T));
  if (plan.vec == kWide) return plan.scalar_head ? ce_bwd<T, kWide, kSoftcap, true> : ce_bwd<T, kWide, kSoftcap, false>;
  return plan.vec == 1 && !plan.scalar_head ? ce_bwd<T, 1, kSoftcap, false> : nullptr;
}

// partials -> row losses -> reduction; partials and row-loss blocks skipped without rows (the
// reduction still writes loss and valid).
template <typename T, bool kSoftcap>
Status forward(const CePlan& plan, const CeParams& p, bool pdl, void* workspace, cudaStream_t stream) {
  float4* part = static_cast<float4*>(workspace);
  float2* block_part = reinterpret_cast<float2*>(part + p.rows * plan.segments);
  if (p.rows > 0) {
    const PartialFn partial = partial_for<T, kSoftcap>(plan);
    if (partial == nullptr) return Status::Invalid("cross_entropy: no kernel built for " + to_string(plan));
    Launch a(dim3(unsigned(plan.grid)), dim3(kCeThreads), 0, stream, pdl);
    Status s = launched(a(partial, p, plan.segments, part), "cross_entropy (partials)");
    if (!s.ok()) return s;
    Launch b(dim3(unsigned(plan.finalize_blocks)), dim3(kCeFinalizeBlock), 0, stream, pdl);
    s = launched(b(ce_fwd_finalize<T, kSoftcap>, p, plan.segments, static_cast<const float4*>(part), block_part),
                 "cross_entropy (row losses)");
    if (!s.ok()) return s;
  }
  Launch c(dim3(1), dim3(kCeReduceThreads), 0, stream, pdl);
  return launched(c(ce_reduce<T>, p, static_cast<const float2*>(block_part), int(plan.finalize_blocks)),
                  "cross_entropy (reduction)");
}

template <typename T, bool kSoftcap>
Status backward(const CePlan& plan, const CeParams& p, bool pdl, cudaStream_t stream) {
  const BackwardFn kernel = backward_for<T, kSoftcap>(plan);
  if (kernel == nullptr) return Status::Invalid("cross_entropy_backward: no kernel built for " + to_string(plan));
  Launch a(dim3(unsigned(plan.grid)), dim3(kCeThreads), 0, stream, pdl);
  return launched(a(kernel, p, plan.segments), "cross_entropy_backward");
}

}  // namespace ce_detail

template <typename T>
Status launch_cross_entropy(const CePlan& plan, const CeParams& p, const DeviceInfo& dev, void* workspace,
                            cudaStream_t stream) {
  using namespace ce_detail;
  record_plan(plan);
  const bool pdl = use_pdl(dev);
  const bool cap = p.softcap > 0.f;
  switch (plan.kind) {
    case CeKernel::kForward:
      return cap ? forward<T, true>(plan, p, pdl, workspace, stream)
                 : forward<T, false>(plan, p, pdl, workspace, stream);
    case CeKernel::kBackward:
      return cap ? backward<T, true>(plan, p, pdl, stream) : backward<T, false>(plan, p, pdl, stream);
  }
  return Status::Invalid("cross_entropy: unknown kernel in plan " + to_string(plan));
}

}  // namespace kernelforge
