// The activation launcher instantiated for __nv_bfloat16 (one file per dtype: parallel compilation).
#include "activation/activation_launch.cuh"

namespace kernelforge {
template Status launch_activation<__nv_bfloat16>(const ActPlan&, ActFn, bool, const ActParams&, const DeviceInfo&,
                                                 cudaStream_t);
}  // namespace kernelforge
