// grouped_mm's wgmma kernel for __nv_bfloat16, GroupedMmOp::kRowsWRow (one file per (dtype, op): each CUTLASS
// instantiation takes about a minute to compile, and the files build in parallel).
#include "grouped_mm/sm90/gmm_wgmma.cuh"

namespace kernelforge {
template size_t gmm_wgmma_workspace<__nv_bfloat16, GroupedMmOp::kRowsWRow>(int, int);
template Status gmm_wgmma_run<__nv_bfloat16, GroupedMmOp::kRowsWRow>(const GmmParams&, int, void*, cudaStream_t);
}  // namespace kernelforge
