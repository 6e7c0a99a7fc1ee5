// The softmax launcher instantiated for __nv_bfloat16 (one file per dtype: parallel compilation).
#include "softmax/softmax_launch.cuh"

namespace kernelforge {
template Status launch_softmax<__nv_bfloat16>(const SoftmaxPlan&, const SoftmaxProblem&, const SoftmaxParams&,
                                              const DeviceInfo&, cudaStream_t);
}  // namespace kernelforge
