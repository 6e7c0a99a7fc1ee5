// The backward launches for float (one file per dtype and direction: parallel compilation).
#include "norm/norm_launch_bwd.cuh"

namespace kernelforge {
namespace norm_detail {
template Status launch_bwd<float>(const NormPlan&, NormOp, const NormParams&, const DeviceInfo&, void*, size_t*,
                                  cudaStream_t);
}  // namespace norm_detail
}  // namespace kernelforge
