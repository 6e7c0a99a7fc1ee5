// RoPE kernels instantiated for __nv_bfloat16 q/k (one file per dtype: parallel compilation).
#include "rope/rope_kernels.cuh"

namespace kernelforge {
KF_ROPE_DEFINE(__nv_bfloat16)
}  // namespace kernelforge
