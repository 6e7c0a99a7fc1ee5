// Softmax kernels instantiated for float (one file per dtype: parallel compilation).
#include "softmax/softmax_kernels.cuh"

namespace kernelforge {
KF_SOFTMAX_DEFINE(float)
}  // namespace kernelforge
