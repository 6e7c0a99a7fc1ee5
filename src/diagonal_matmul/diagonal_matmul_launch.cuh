// The diagonal_matmul launcher: one switch over plan.kind, one launch per kernel. The plan's (vec,
// vecs) pick the kernel instantiation; only the kDmBuilds rows (diagonal_matmul_plan.cpp) are built, and
// check_plan has rejected every other plan before a launch. Included by diagonal_matmul_<dtype>.cu.
#pragma once

#include <cuda_runtime.h>

#include "common/launch.cuh"
#include "common/plan_record.h"
#include "diagonal_matmul/diagonal_matmul_plan.h"
#include "diagonal_matmul/kernels/dm_bwd.cuh"
#include "diagonal_matmul/kernels/dm_fwd.cuh"
#include "diagonal_matmul/kernels/dm_reduce.cuh"

namespace kernelforge {
namespace dm_detail {

using DmKernelFn = void (*)(const DmParams);

// The instantiation for (vec, vecs): 16-byte vectors, 4-byte pairs (16-bit types) or one element;
// nullptr if not built.
template <typename T>
DmKernelFn fwd_kernel(int vec, int vecs) {
  constexpr int kWide = 16 / int(sizeof(T));
  if (vec == kWide && vecs == 1) return dm_fwd<T, kWide, 1>;
  if (vec == kWide && vecs == 2) return dm_fwd<T, kWide, 2>;
  if (vec == kWide && vecs == 4) return dm_fwd<T, kWide, 4>;
  if constexpr (sizeof(T) == 2) {
    if (vec == 2 && vecs == 4) return dm_fwd<T, 2, 4>;
  }
  if (vec == 1 && vecs == 4) return dm_fwd<T, 1, 4>;
  return nullptr;
}

template <typename T, bool kDb>
DmKernelFn bwd_kernel(int vec, int vecs) {
  constexpr int kWide = 16 / int(sizeof(T));
  if (vec == kWide && vecs == 2) return dm_bwd<T, kWide, 2, kDb>;
  if (vec == kWide && vecs == 4) return dm_bwd<T, kWide, 4, kDb>;
  if constexpr (sizeof(T) == 2) {
    if (vec == 2 && vecs == 4) return dm_bwd<T, 2, 4, kDb>;
  }
  if (vec == 1 && vecs == 4) return dm_bwd<T, 1, 4, kDb>;
  return nullptr;
}

inline Status launch_one(DmKernelFn kernel, dim3 grid, dim3 block, const DmParams& p, const DeviceInfo& dev,
                         cudaStream_t stream, const DmPlan& plan, const char* what) {
  if (kernel == nullptr) return Status::Invalid(std::string(what) + ": no kernel built for " + to_string(plan));
  const bool pdl = use_pdl(dev);
  DmParams q = p;  // a grid of at most one block per SM is resident at once: let the next kernel in
  q.trigger = pdl && int64_t(grid.x) * grid.y <= dev.sm_count;
  Launch l(grid, block, 0, stream, pdl);
  return launched(l(kernel, q), what);
}

}  // namespace dm_detail

template <typename T>
Status launch_diagonal_matmul(const DmPlan& plan, const DmParams& p, const DeviceInfo& dev, cudaStream_t stream) {
  using namespace dm_detail;
  record_plan(plan);
  const dim3 block(unsigned(plan.tx), unsigned(plan.ty));
  switch (plan.kind) {
    case DmKernel::kFwd:
      return launch_one(fwd_kernel<T>(plan.vec, plan.vecs), dim3(unsigned(plan.grid_x), unsigned(plan.grid_y)), block,
                        p, dev, stream, plan, "diagonal_matmul forward");
    case DmKernel::kBwd: {
      if (plan.grid_x > 0) {
        const DmKernelFn k =
            plan.db ? bwd_kernel<T, true>(plan.vec, plan.vecs) : bwd_kernel<T, false>(plan.vec, plan.vecs);
        Status s = launch_one(k, dim3(unsigned(plan.grid_x)), block, p, dev, stream, plan, "diagonal_matmul backward");
        if (!s.ok()) return s;
      }
      if (plan.reduce_grid == 0) return Status::Ok();
      return launch_one(dm_reduce<T>, dim3(unsigned(plan.reduce_grid)), dim3(kDmThreads), p, dev, stream, plan,
                        "diagonal_matmul backward (da reduce)");
    }
  }
  return Status::Invalid("diagonal_matmul: unknown kernel in plan " + to_string(plan));
}

}  // namespace kernelforge
