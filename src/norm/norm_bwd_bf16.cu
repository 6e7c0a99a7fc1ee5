// The backward launches for __nv_bfloat16 (one file per dtype and direction: parallel compilation).
#include <cuda_bf16.h>

#include "norm/norm_launch_bwd.cuh"

namespace kernelforge {
namespace norm_detail {
template Status launch_bwd<__nv_bfloat16>(const NormPlan&, NormOp, const NormParams&, const DeviceInfo&, void*, size_t*,
                                          cudaStream_t);
}  // namespace norm_detail
}  // namespace kernelforge
