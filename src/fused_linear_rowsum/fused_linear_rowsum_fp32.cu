// The fused_linear_rowsum launcher instantiated for float (one file per dtype: parallel compilation).
#include "fused_linear_rowsum/fused_linear_rowsum_launch.cuh"

namespace kernelforge {
template Status launch_fused_linear_rowsum<float>(const FlrsPlan&, const FlrsParams&, const DeviceInfo&, float*,
                                                  cudaStream_t);
}  // namespace kernelforge
