// The RoPE launcher instantiated for __nv_bfloat16 q/k (one file per dtype: parallel compilation).
#include "rope/rope_launch.cuh"

namespace kernelforge {
template Status launch_rope<__nv_bfloat16>(const RopePlan&, const RopeParams&, bool, const DeviceInfo&, cudaStream_t);
}  // namespace kernelforge
