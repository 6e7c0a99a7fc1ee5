// Backward normalization kernels instantiated for float (one file per dtype: parallel compilation).
#include "norm/norm_kernels.cuh"

namespace kernelforge {
KF_NORM_BWD_DEFINE(float)
}  // namespace kernelforge
