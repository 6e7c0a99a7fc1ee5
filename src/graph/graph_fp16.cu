// The graph launcher instantiated for __half (one file per dtype: parallel compilation).
#include "graph/graph_launch.cuh"

namespace kernelforge {
template Status launch_graph<__half>(const GraphPlan&, const GraphParams&, bool, GraphReduce, const DeviceInfo&,
                                     cudaStream_t);
}  // namespace kernelforge
