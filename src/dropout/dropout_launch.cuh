// The dropout launcher: one switch over plan.kind, one launch per kind. The plan's unroll picks the
// kernel instantiation; only the unrolls of kDropBuilds (dropout_plan.cpp) are built, and check_plan
// has rejected every other plan before a launch. Included by dropout_<dtype>.cu.
#pragma once

#include <cuda_runtime.h>

#include "common/launch.cuh"
#include "common/plan_record.h"
#include "dropout/dropout_plan.h"
#include "dropout/kernels/dropout_scalar.cuh"
#include "dropout/kernels/dropout_vec.cuh"

namespace kernelforge {
namespace drop_detail {

using DropKernelFn = void (*)(const DropParams);

template <typename T, bool kAdd>
DropKernelFn kernel_for(DropKernel kind, int unroll) {
  if (kind == DropKernel::kVec) {
    if (unroll == 1) return dropout_vec<T, kAdd, 1>;
    if (unroll == 2) return dropout_vec<T, kAdd, 2>;
    if (unroll == 4) return dropout_vec<T, kAdd, 4>;
  } else if (kind == DropKernel::kScalar) {
    if (unroll == 1) return dropout_scalar<T, kAdd, 1>;
    if (unroll == 2) return dropout_scalar<T, kAdd, 2>;
  }
  return nullptr;
}

}  // namespace drop_detail

template <typename T>
Status launch_dropout(const DropPlan& plan, const DropParams& p, const DeviceInfo& dev, cudaStream_t stream) {
  using namespace drop_detail;
  record_plan(plan);
  const DropKernelFn kernel =
      p.add != nullptr ? kernel_for<T, true>(plan.kind, plan.unroll) : kernel_for<T, false>(plan.kind, plan.unroll);
  if (kernel == nullptr) return Status::Invalid("dropout: no kernel built for " + to_string(plan));
  const bool pdl = use_pdl(dev);
  DropParams q = p;  // a grid of at most one block per SM is resident at once: let the next kernel in
  q.trigger = pdl && plan.grid <= dev.sm_count;
  Launch l(dim3(unsigned(plan.grid)), dim3(kDropThreads), 0, stream, pdl);
  return launched(l(kernel, q), "dropout");
}

}  // namespace kernelforge
