// Activation kernels instantiated for float (one file per dtype: parallel compilation).
#include "activation/activation_kernels.cuh"

namespace kernelforge {
KF_ACT_DEFINE(float)
}  // namespace kernelforge
