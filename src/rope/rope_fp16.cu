// RoPE kernels instantiated for __half q/k (one file per dtype: parallel compilation).
#include "rope/rope_kernels.cuh"

namespace kernelforge {
KF_ROPE_DEFINE(__half)
}  // namespace kernelforge
