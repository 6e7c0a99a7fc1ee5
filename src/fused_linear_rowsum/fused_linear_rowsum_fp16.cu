// The fused_linear_rowsum launcher instantiated for __half (one file per dtype: parallel compilation).
#include "fused_linear_rowsum/fused_linear_rowsum_launch.cuh"

namespace kernelforge {
template Status launch_fused_linear_rowsum<__half>(const FlrsPlan&, const FlrsParams&, const DeviceInfo&, float*,
                                                   cudaStream_t);
}  // namespace kernelforge
