// Cross-entropy kernels instantiated for __nv_bfloat16 (one file per dtype: parallel compilation).
#include "cross_entropy/cross_entropy_kernels.cuh"

namespace kernelforge {
KF_CE_DEFINE(__nv_bfloat16)
}  // namespace kernelforge
