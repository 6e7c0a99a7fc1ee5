// The cross-entropy launcher instantiated for __half logits (one file per dtype: parallel compilation).
#include "cross_entropy/cross_entropy_launch.cuh"

namespace kernelforge {
template Status launch_cross_entropy<__half>(const CePlan&, const CeParams&, const DeviceInfo&, void*, cudaStream_t);
}  // namespace kernelforge
