// The dropout launcher instantiated for float (one file per dtype: parallel compilation).
#include "dropout/dropout_launch.cuh"

namespace kernelforge {
template Status launch_dropout<float>(const DropPlan&, const DropParams&, const DeviceInfo&, cudaStream_t);
}  // namespace kernelforge
