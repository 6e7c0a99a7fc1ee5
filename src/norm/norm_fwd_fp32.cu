// The forward launches for float, and launch_norm<float> (one file per dtype and direction: parallel
// compilation).
#include "norm/norm_launch_fwd.cuh"

namespace kernelforge {
template Status launch_norm<float>(const NormPlan&, NormOp, const NormParams&, const DeviceInfo&, void*, size_t*,
                                   cudaStream_t);
namespace norm_detail {
template Status launch_fwd_row<float>(const NormPlan&, NormOp, const NormParams&, const DeviceInfo&, cudaStream_t);
template Status launch_fwd_cluster<float>(const NormPlan&, NormOp, const NormParams&, const DeviceInfo&, cudaStream_t);
template Status launch_fwd_bulk<float>(const NormPlan&, NormOp, const NormParams&, const DeviceInfo&, cudaStream_t);
template Status launch_fwd_stream<float>(const NormPlan&, NormOp, const NormParams&, const DeviceInfo&, cudaStream_t);
}  // namespace norm_detail
}  // namespace kernelforge
