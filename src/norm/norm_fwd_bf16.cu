// Forward normalization kernels instantiated for __nv_bfloat16 (one file per dtype: parallel compilation).
#include "norm/norm_kernels.cuh"

namespace kernelforge {
KF_NORM_FWD_DEFINE(__nv_bfloat16)
}  // namespace kernelforge
