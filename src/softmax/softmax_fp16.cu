// The softmax launcher instantiated for __half (one file per dtype: parallel compilation).
#include "softmax/softmax_launch.cuh"

namespace kernelforge {
template Status launch_softmax<__half>(const SoftmaxPlan&, const SoftmaxProblem&, const SoftmaxParams&,
                                       const DeviceInfo&, cudaStream_t);
}  // namespace kernelforge
