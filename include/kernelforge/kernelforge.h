// kernelforge: fast CUDA kernels for transformer workloads. Umbrella header of the C++ API.
#pragma once

#include <string>

#include "kernelforge/activation.h"
#include "kernelforge/attention.h"
#include "kernelforge/cross_entropy.h"
#include "kernelforge/decode.h"
#include "kernelforge/diagonal_matmul.h"
#include "kernelforge/dropout.h"
#include "kernelforge/fused_linear_rowsum.h"
#include "kernelforge/gemm.h"
#include "kernelforge/graph.h"
#include "kernelforge/grouped_mm.h"
#include "kernelforge/linear.h"
#include "kernelforge/mla.h"
#include "kernelforge/norm.h"
#include "kernelforge/rope.h"
#include "kernelforge/softmax.h"
#include "kernelforge/status.h"
#include "kernelforge/tensor.h"

#define KERNELFORGE_VERSION_MAJOR 0
#define KERNELFORGE_VERSION_MINOR 1
#define KERNELFORGE_VERSION_PATCH 0

namespace kernelforge {
// Compute capability (major * 10 + minor) of `device`, or a failed status without a GPU.
Status device_capability(int device, int* capability);

// The plan of the last kernelforge launch on this thread (kernel kind and launch parameters, e.g.
// "fwd_row vec=8 iters=2 threads=256 rows/block=1"), as text; empty before the first launch.
std::string last_plan();
}  // namespace kernelforge
