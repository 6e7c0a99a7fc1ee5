// The dropout launcher instantiated for __nv_bfloat16 (one file per dtype: parallel compilation).
#include "dropout/dropout_launch.cuh"

namespace kernelforge {
template Status launch_dropout<__nv_bfloat16>(const DropPlan&, const DropParams&, const DeviceInfo&, cudaStream_t);
}  // namespace kernelforge
