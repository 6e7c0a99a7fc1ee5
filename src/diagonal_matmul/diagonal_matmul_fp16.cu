// The diagonal_matmul launcher instantiated for __half (one file per dtype: parallel compilation).
#include "diagonal_matmul/diagonal_matmul_launch.cuh"

namespace kernelforge {
template Status launch_diagonal_matmul<__half>(const DmPlan&, const DmParams&, const DeviceInfo&, cudaStream_t);
}  // namespace kernelforge
