// Softmax kernels instantiated for __half (one file per dtype: parallel compilation).
#include "softmax/softmax_kernels.cuh"

namespace kernelforge {
KF_SOFTMAX_DEFINE(__half)
}  // namespace kernelforge
