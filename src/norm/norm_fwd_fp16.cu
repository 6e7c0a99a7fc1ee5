// The forward launches for __half, and launch_norm<__half> (one file per dtype and direction: parallel
// compilation).
#include <cuda_fp16.h>

#include "norm/norm_launch_fwd.cuh"

namespace kernelforge {
template Status launch_norm<__half>(const NormPlan&, NormOp, const NormParams&, const DeviceInfo&, void*, size_t*,
                                    cudaStream_t);
namespace norm_detail {
template Status launch_fwd_row<__half>(const NormPlan&, NormOp, const NormParams&, const DeviceInfo&, cudaStream_t);
template Status launch_fwd_cluster<__half>(const NormPlan&, NormOp, const NormParams&, const DeviceInfo&, cudaStream_t);
template Status launch_fwd_bulk<__half>(const NormPlan&, NormOp, const NormParams&, const DeviceInfo&, cudaStream_t);
template Status launch_fwd_stream<__half>(const NormPlan&, NormOp, const NormParams&, const DeviceInfo&, cudaStream_t);
}  // namespace norm_detail
}  // namespace kernelforge
