// grouped_mm's mma launcher (the wgmma kernels launch from sm90/): the tail fill of the rows ops, then
// the tile kernel. Included by grouped_mm_<dtype>.cu.
#pragma once

#include <cuda_runtime.h>

#include "common/launch.cuh"
#include "grouped_mm/grouped_mm_problem.h"
#include "grouped_mm/kernels/gmm_mma.cuh"

namespace kernelforge {

template <typename T>
Status launch_grouped_mm_mma(const GroupedMmPlan& plan, const GmmParams& p, const DeviceInfo& dev,
                             cudaStream_t stream) {
  const bool pdl = use_pdl(dev);
  if (p.op == GroupedMmOp::kWgrad) {
    Launch l(dim3(unsigned(plan.grid)), dim3(kGmmMmaThreads), 0, stream, pdl);
    return launched(l(gmm_mma<T, true>, p), "grouped_mm_wgrad (mma)");
  }
  // Rows of no group: enough blocks to write a full output in a few waves (the count is on the device).
  const int64_t fill_blocks =
      std::min<int64_t>(std::max<int64_t>(1, p.t * p.n / (256 * 16)), 2 * int64_t(dev.sm_count));
  Launch lf(dim3(unsigned(fill_blocks)), dim3(256), 0, stream, pdl);
  Status s = launched(lf(gmm_fill_tail<T>, p), "grouped_mm (rows of no group)");
  if (!s.ok()) return s;
  const int64_t tiles_n = (p.n + kGmmMmaBN - 1) / kGmmMmaBN;
  Launch l(dim3(unsigned(plan.grid / tiles_n), unsigned(tiles_n)), dim3(kGmmMmaThreads), 0, stream, pdl);
  return launched(l(gmm_mma<T, false>, p), "grouped_mm (mma)");
}

}  // namespace kernelforge
