// Activation kernels instantiated for __half (one file per dtype: parallel compilation).
#include "activation/activation_kernels.cuh"

namespace kernelforge {
KF_ACT_DEFINE(__half)
}  // namespace kernelforge
