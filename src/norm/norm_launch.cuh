// The normalization family's launcher: one switch over plan.kind, one launch per kind. The per-kind
// launches are defined in norm_launch_fwd.cuh and norm_launch_bwd.cuh and instantiated per dtype in
// norm_fwd_<dtype>.cu and norm_bwd_<dtype>.cu (so that the forward and backward kernels of each dtype
// compile in parallel); launch_norm<T> itself is instantiated in norm_fwd_<dtype>.cu.
// This header holds host code only: the switch, and the compile-time dispatch of op and vector count.
#pragma once

#include <cuda_runtime_api.h>

#include <string>
#include <type_traits>

#include "common/plan_record.h"
#include "norm/norm_plan.h"

namespace kernelforge {
namespace norm_detail {

// Calls f(std::integral_constant<NormOp, op>{}): the op as a template argument.
template <typename F>
Status with_op(NormOp op, F&& f) {
  switch (op) {
    case NormOp::kRms:
      return f(std::integral_constant<NormOp, NormOp::kRms>{});
    case NormOp::kAddRms:
      return f(std::integral_constant<NormOp, NormOp::kAddRms>{});
    case NormOp::kLayer:
      return f(std::integral_constant<NormOp, NormOp::kLayer>{});
    case NormOp::kAdaRms:
      return f(std::integral_constant<NormOp, NormOp::kAdaRms>{});
    case NormOp::kAdaLayer:
      return f(std::integral_constant<NormOp, NormOp::kAdaLayer>{});
  }
  return Status::Invalid("norm: unknown op " + std::to_string(int(op)));
}

// Calls f(std::integral_constant<int, iters>{}) for iters a power of two up to kMax (instantiated
// only up to kMax).
template <int kMax, typename F>
Status with_iters(int iters, F&& f) {
  switch (iters) {
    case 1:
      return f(std::integral_constant<int, 1>{});
    case 2:
      if constexpr (kMax >= 2) return f(std::integral_constant<int, 2>{});
      break;
    case 4:
      if constexpr (kMax >= 4) return f(std::integral_constant<int, 4>{});
      break;
    case 8:
      if constexpr (kMax >= 8) return f(std::integral_constant<int, 8>{});
      break;
    case 16:
      if constexpr (kMax >= 16) return f(std::integral_constant<int, 16>{});
      break;
    default:
      break;
  }
  return Status::Invalid("norm: no kernel for iters=" + std::to_string(iters) + " (at most " + std::to_string(kMax) +
                         ")");
}

// ---- per-kind launches (norm_launch_fwd.cuh, norm_launch_bwd.cuh) --------------------------------
template <typename T>
Status launch_fwd_row(const NormPlan&, NormOp, const NormParams&, const DeviceInfo&, cudaStream_t);
template <typename T>
Status launch_fwd_cluster(const NormPlan&, NormOp, const NormParams&, const DeviceInfo&, cudaStream_t);
template <typename T>
Status launch_fwd_bulk(const NormPlan&, NormOp, const NormParams&, const DeviceInfo&, cudaStream_t);
template <typename T>
Status launch_fwd_stream(const NormPlan&, NormOp, const NormParams&, const DeviceInfo&, cudaStream_t);
// Every backward kind: the row kernel(s) of the plan, then the column reductions (with workspace ==
// nullptr only *workspace_bytes is set).
template <typename T>
Status launch_bwd(const NormPlan&, NormOp, const NormParams&, const DeviceInfo&, void* workspace,
                  size_t* workspace_bytes, cudaStream_t);

}  // namespace norm_detail

template <typename T>
Status launch_norm(const NormPlan& plan, NormOp op, const NormParams& p, const DeviceInfo& dev, void* workspace,
                   size_t* workspace_bytes, cudaStream_t stream) {
  using namespace norm_detail;
  record_plan(plan);
  switch (plan.kind) {
    case NormKernel::kFwdRow:
      return launch_fwd_row<T>(plan, op, p, dev, stream);
    case NormKernel::kFwdCluster:
      return launch_fwd_cluster<T>(plan, op, p, dev, stream);
    case NormKernel::kFwdBulk:
      return launch_fwd_bulk<T>(plan, op, p, dev, stream);
    case NormKernel::kFwdStream:
      return launch_fwd_stream<T>(plan, op, p, dev, stream);
    case NormKernel::kBwdRegs:
    case NormKernel::kBwdRegsBulk:
    case NormKernel::kBwdChunk:
    case NormKernel::kBwdSplit:
    case NormKernel::kBwdStream:
      return launch_bwd<T>(plan, op, p, dev, workspace, workspace_bytes, stream);
  }
  return Status::Invalid("norm: unknown plan kind " + std::to_string(int(plan.kind)));
}

}  // namespace kernelforge
