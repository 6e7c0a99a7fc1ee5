// Activation kernels instantiated for __nv_bfloat16 (one file per dtype: parallel compilation).
#include "activation/activation_kernels.cuh"

namespace kernelforge {
KF_ACT_DEFINE(__nv_bfloat16)
}  // namespace kernelforge
