// The activation launcher instantiated for float (one file per dtype: parallel compilation).
#include "activation/activation_launch.cuh"

namespace kernelforge {
template Status launch_activation<float>(const ActPlan&, ActFn, bool, const ActParams&, const DeviceInfo&,
                                         cudaStream_t);
}  // namespace kernelforge
