// The graph launcher instantiated for float (one file per dtype: parallel compilation).
#include "graph/graph_launch.cuh"

namespace kernelforge {
template Status launch_graph<float>(const GraphPlan&, const GraphParams&, bool, GraphReduce, const DeviceInfo&,
                                    cudaStream_t);
}  // namespace kernelforge
