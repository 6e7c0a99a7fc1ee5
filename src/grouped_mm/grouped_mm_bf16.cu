// grouped_mm's mma launcher instantiated for __nv_bfloat16 (one file per dtype: parallel compilation).
#include "grouped_mm/grouped_mm_launch.cuh"

namespace kernelforge {
template Status launch_grouped_mm_mma<__nv_bfloat16>(const GroupedMmPlan&, const GmmParams&, const DeviceInfo&,
                                                     cudaStream_t);
}  // namespace kernelforge
