// The cross-entropy launcher instantiated for __nv_bfloat16 logits (one file per dtype: parallel compilation).
#include "cross_entropy/cross_entropy_launch.cuh"

namespace kernelforge {
template Status launch_cross_entropy<__nv_bfloat16>(const CePlan&, const CeParams&, const DeviceInfo&, void*,
                                                    cudaStream_t);
}  // namespace kernelforge
