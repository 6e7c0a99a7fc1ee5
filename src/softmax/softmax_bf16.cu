// Softmax kernels instantiated for __nv_bfloat16 (one file per dtype: parallel compilation).
#include "softmax/softmax_kernels.cuh"

namespace kernelforge {
KF_SOFTMAX_DEFINE(__nv_bfloat16)
}  // namespace kernelforge
