// The RoPE launcher: one switch over plan.kind, one launch per kind. The kernel instantiation is
// picked by (cos/sin dtype, pairing, vector width); check_plan has accepted the plan before a launch.
// Included by rope_<dtype>.cu.
#pragma once

#include <cuda_runtime.h>

#include <type_traits>

#include "common/launch.cuh"
#include "common/plan_record.h"
#include "rope/kernels/rope_flat.cuh"
#include "rope/kernels/rope_token.cuh"
#include "rope/rope_plan.h"

namespace kernelforge {
namespace rope_detail {

using RopeKernelFn = void (*)(const RopeParams, const int, const int);

template <typename T, typename CS, bool kInterleaved, int kVec>
RopeKernelFn instance(RopeKernel kind) {
  return kind == RopeKernel::kFlat ? rope_flat<T, CS, kInterleaved, kVec> : rope_token<T, CS, kInterleaved, kVec>;
}

// The kernel of `kind` for 16-byte vectors (vec = 16 / sizeof(T)) or one element; nullptr otherwise.
template <typename T, typename CS>
RopeKernelFn kernel_for(RopeKernel kind, bool interleaved, int vec) {
  constexpr int kWide = 16 / int(sizeof(T));
  if (vec == kWide) return interleaved ? instance<T, CS, true, kWide>(kind) : instance<T, CS, false, kWide>(kind);
  if (vec == 1) return interleaved ? instance<T, CS, true, 1>(kind) : instance<T, CS, false, 1>(kind);
  return nullptr;
}

template <typename T>
RopeKernelFn kernel_for(RopeKernel kind, bool cs_float, bool interleaved, int vec) {
  if constexpr (std::is_same<T, float>::value) {
    (void)cs_float;
    return kernel_for<float, float>(kind, interleaved, vec);
  } else {
    return cs_float ? kernel_for<T, float>(kind, interleaved, vec) : kernel_for<T, T>(kind, interleaved, vec);
  }
}

}  // namespace rope_detail

template <typename T>
Status launch_rope(const RopePlan& plan, const RopeParams& p, bool cs_float, const DeviceInfo& dev,
                   cudaStream_t stream) {
  using namespace rope_detail;
  record_plan(plan);
  const char* what = p.backward ? "apply_rope_backward" : "apply_rope";
  const RopeKernelFn kernel = kernel_for<T>(plan.kind, cs_float, p.interleaved, plan.vec);
  if (kernel == nullptr) return Status::Invalid(std::string(what) + ": no kernel built for " + to_string(plan));
  const bool pdl = use_pdl(dev);
  RopeParams q = p;  // a grid of at most one block per SM is resident at once: let the next kernel in
  q.trigger = pdl && int64_t(plan.grid_x) * plan.grid_y <= dev.sm_count;
  switch (plan.kind) {
    case RopeKernel::kToken: {
      Launch l(dim3(unsigned(plan.grid_x)),
               dim3(unsigned(plan.block_x), unsigned(plan.block_y), unsigned(plan.block_z)), 0, stream, pdl);
      return launched(l(kernel, q, plan.units_rot, plan.units), what);
    }
    case RopeKernel::kFlat: {
      Launch l(dim3(unsigned(plan.grid_x), unsigned(plan.grid_y)), dim3(unsigned(plan.block_x), unsigned(plan.block_y)),
               0, stream, pdl);
      return launched(l(kernel, q, plan.units_rot, plan.units), what);
    }
  }
  return Status::Invalid(std::string(what) + ": unknown kernel in plan " + to_string(plan));
}

}  // namespace kernelforge
