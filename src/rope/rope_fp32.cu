// RoPE kernels instantiated for float q/k (one file per dtype: parallel compilation).
#include "rope/rope_kernels.cuh"

namespace kernelforge {
KF_ROPE_DEFINE(float)
}  // namespace kernelforge
