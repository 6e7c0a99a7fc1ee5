// The forward launches for __nv_bfloat16, and launch_norm<__nv_bfloat16> (one file per dtype and direction: parallel
// compilation).
#include <cuda_bf16.h>

#include "norm/norm_launch_fwd.cuh"

namespace kernelforge {
template Status launch_norm<__nv_bfloat16>(const NormPlan&, NormOp, const NormParams&, const DeviceInfo&, void*,
                                           size_t*, cudaStream_t);
namespace norm_detail {
template Status launch_fwd_row<__nv_bfloat16>(const NormPlan&, NormOp, const NormParams&, const DeviceInfo&,
                                              cudaStream_t);
template Status launch_fwd_cluster<__nv_bfloat16>(const NormPlan&, NormOp, const NormParams&, const DeviceInfo&,
                                                  cudaStream_t);
template Status launch_fwd_bulk<__nv_bfloat16>(const NormPlan&, NormOp, const NormParams&, const DeviceInfo&,
                                               cudaStream_t);
template Status launch_fwd_stream<__nv_bfloat16>(const NormPlan&, NormOp, const NormParams&, const DeviceInfo&,
                                                 cudaStream_t);
}  // namespace norm_detail
}  // namespace kernelforge
