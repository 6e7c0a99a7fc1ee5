// grouped_mm's tile sizes, shared by the planner (host) and the kernels.
#pragma once

namespace kernelforge {

// mma kernel (gmm_mma.cuh): 64 x 64 output tiles, 32-deep slices, 4 warps.
constexpr int kGmmMmaBM = 64, kGmmMmaBN = 64, kGmmMmaBK = 32, kGmmMmaThreads = 128;

// wgmma kernel (sm90/gmm_wgmma.cuh): 128 x 256 output tiles, 64-deep slices, clusters of 2 along M.
constexpr int kGmmWgmmaTileM = 128, kGmmWgmmaTileN = 256, kGmmWgmmaTileK = 64, kGmmWgmmaClusterM = 2;

}  // namespace kernelforge
