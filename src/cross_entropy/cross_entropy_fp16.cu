// Cross-entropy kernels instantiated for __half (one file per dtype: parallel compilation).
#include "cross_entropy/cross_entropy_kernels.cuh"

namespace kernelforge {
KF_CE_DEFINE(__half)
}  // namespace kernelforge
