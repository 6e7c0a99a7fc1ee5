// grouped_mm's mma launcher instantiated for __half (one file per dtype: parallel compilation).
#include "grouped_mm/grouped_mm_launch.cuh"

namespace kernelforge {
template Status launch_grouped_mm_mma<__half>(const GroupedMmPlan&, const GmmParams&, const DeviceInfo&, cudaStream_t);
}  // namespace kernelforge
