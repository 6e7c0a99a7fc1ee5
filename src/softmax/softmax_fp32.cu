// The softmax launcher instantiated for float (one file per dtype: parallel compilation).
#include "softmax/softmax_launch.cuh"

namespace kernelforge {
template Status launch_softmax<float>(const SoftmaxPlan&, const SoftmaxProblem&, const SoftmaxParams&,
                                      const DeviceInfo&, cudaStream_t);
}  // namespace kernelforge
