// The diagonal_matmul launcher instantiated for __nv_bfloat16 (one file per dtype: parallel compilation).
#include "diagonal_matmul/diagonal_matmul_launch.cuh"

namespace kernelforge {
template Status launch_diagonal_matmul<__nv_bfloat16>(const DmPlan&, const DmParams&, const DeviceInfo&, cudaStream_t);
}  // namespace kernelforge
