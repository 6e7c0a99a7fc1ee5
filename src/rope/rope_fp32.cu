// The RoPE launcher instantiated for float q/k (one file per dtype: parallel compilation).
#include "rope/rope_launch.cuh"

namespace kernelforge {
template Status launch_rope<float>(const RopePlan&, const RopeParams&, bool, const DeviceInfo&, cudaStream_t);
}  // namespace kernelforge
