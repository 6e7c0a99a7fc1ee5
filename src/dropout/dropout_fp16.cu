// The dropout launcher instantiated for __half (one file per dtype: parallel compilation).
#include "dropout/dropout_launch.cuh"

namespace kernelforge {
template Status launch_dropout<__half>(const DropPlan&, const DropParams&, const DeviceInfo&, cudaStream_t);
}  // namespace kernelforge
