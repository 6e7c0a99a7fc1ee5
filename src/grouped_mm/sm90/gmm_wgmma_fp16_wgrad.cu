// grouped_mm's wgmma kernel for __half, GroupedMmOp::kWgrad (one file per (dtype, op): each CUTLASS
// instantiation takes about a minute to compile, and the files build in parallel).
#include "grouped_mm/sm90/gmm_wgmma.cuh"

namespace kernelforge {
template size_t gmm_wgmma_workspace<__half, GroupedMmOp::kWgrad>(int, int);
template Status gmm_wgmma_run<__half, GroupedMmOp::kWgrad>(const GmmParams&, int, void*, cudaStream_t);
}  // namespace kernelforge
