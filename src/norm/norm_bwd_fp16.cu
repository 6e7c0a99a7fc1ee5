// Backward normalization kernels instantiated for __half (one file per dtype: parallel compilation).
#include "norm/norm_kernels.cuh"

namespace kernelforge {
KF_NORM_BWD_DEFINE(__half)
}  // namespace kernelforge
