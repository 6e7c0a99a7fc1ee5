// kernelforge grouped_mm family: the grouped GEMMs of a mixture-of-experts layer, with the tokens
// sorted by expert and the group boundaries on the device (no group size reaches the host, so a call
// never synchronizes and a CUDA graph captures it).
//
//   grouped_mm          out[r, :] = x[r, :] · w[e]ᵀ        for every row r of group e
//                       (the experts' up/gate/down projections; dx = dy · w[e] is the same call with
//                       w's transposed view, see below)
//   grouped_mm_wgrad    dw[e] = dy_eᵀ · x_e                (the weight gradient: a GEMM whose reduction
//                                                          runs over the group's rows, so its length
//                                                          differs per group; an empty group's dw[e] = 0)
//
// Groups: offsets int32 [E] holds the groups' row ends (torch._grouped_mm's `offs`): group e owns rows
// [end(e-1), end(e)) with end(e) = clamp(max(offsets[0..e]), 0, T) and end(-1) = 0. The running
// maximum and the clamp make every input safe: groups never overlap and never leave [0, T), whatever
// the values. Offsets are meant to be non-decreasing with offsets[E-1] = T; rows past the last end
// belong to no group and grouped_mm writes them as 0.
//
// Tensors (element strides):
//   x    [T, K]     row-major (stride 1 along K), any row stride
//   w    [E, N, K]  each matrix row-major (stride 1 along K: nn.Linear weights stacked) or column-major
//                   (stride 1 along N: the transposed view of a [E, K, N] stack, e.g. torch._grouped_mm's
//                   mat_b, or w.transpose(1, 2) for dx = dy · w[e]); any batch stride
//   out  [T, N]     row-major, any row stride
//   dy   [T, N], x [T, K]: row-major, any row strides; dw [E, N, K]: row-major matrices, any batch stride
// One dtype for all of them, bfloat16 or float16; products accumulate in float32, each output is
// rounded once. E >= 1; T, N, K may be 0 (K = 0: out = 0; T = 0: dw = 0).
//
// FLOPs 2 T N K for either call (Σ_e 2 T_e N K).
//
// Kernels (GroupedMmPlan):
//   wgmma   sm_90a, CUTLASS's warp-specialized TMA + wgmma grouped GEMM (CUTLASS 4 headers from the pip
//           package nvidia-cutlass, found at configure time): a persistent grid over every (group,
//           output tile), 128 × 256 tiles, clusters of two CTAs. A setup kernel turns the offsets into
//           the per-group shapes, pointers and strides, in the workspace. It needs 16-byte aligned
//           base pointers, and N, K and every row and batch stride multiples of 8 elements.
//   mma     every other call (sm_80, sm_75 for float16, unaligned shapes and strides): 64 × 64 tiles
//           with tensor-core fragments (WMMA), any strides, bounds-checked loads. Correct everywhere,
//           a fraction of the wgmma kernel's rate.
//
// Workspace: CUB's size-query convention. Call with workspace == nullptr to get *workspace_bytes (0 for
// the mma kernel), then again with a buffer of at least that size, 256-byte aligned (cudaMalloc's are).
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "kernelforge/status.h"
#include "kernelforge/tensor.h"

namespace kernelforge {

enum class GroupedMmKernel : int { kWgmma = 0, kMma = 1 };

// Which product: out rows of group e = x_e · w[e]ᵀ with w's matrices row-major (kRowsWRow) or
// column-major (kRowsWCol), or the weight gradient dw[e] = dy_eᵀ · x_e (kWgrad).
enum class GroupedMmOp : int { kRowsWRow = 0, kRowsWCol = 1, kWgrad = 2 };

struct GroupedMmPlan {
  GroupedMmKernel kernel = GroupedMmKernel::kMma;
  GroupedMmOp op = GroupedMmOp::kRowsWRow;
  int tile_m = 0, tile_n = 0, tile_k = 0;  // output tile (rows x columns) and reduction step
  int cluster_m = 1;                       // CTAs per cluster along the rows (wgmma)
  int64_t grid = 0;                        // CTAs launched (wgmma: persistent, one per SM)
  size_t workspace = 0;                    // bytes
};

std::string to_string(
    const GroupedMmPlan& plan);  // e.g. "grouped_mm_wgmma rows/w-row tile=128x256x64 cluster=2 grid=132"

// ---- CUDA ------------------------------------------------------------------------------------
Status grouped_mm(const TensorView& x, const TensorView& w, const TensorView& offsets, const TensorView& out,
                  void* workspace, size_t* workspace_bytes, cudaStream_t stream);
Status grouped_mm_wgrad(const TensorView& dy, const TensorView& x, const TensorView& offsets, const TensorView& dw,
                        void* workspace, size_t* workspace_bytes, cudaStream_t stream);

// The plan a call would run on the current device (validates the call; no launch).
Status grouped_mm_plan(const TensorView& x, const TensorView& w, const TensorView& offsets, const TensorView& out,
                       GroupedMmPlan* plan);
Status grouped_mm_wgrad_plan(const TensorView& dy, const TensorView& x, const TensorView& offsets, const TensorView& dw,
                             GroupedMmPlan* plan);

// Whether this build has the wgmma kernels (CUTLASS found at configure time, sm_90a built).
bool grouped_mm_has_wgmma();

// ---- float64 CPU reference -------------------------------------------------------------------
// The same calls on CPU tensors (float32 and float64 also accepted; offsets int32): double sums, each
// output rounded once, the same group rule.
namespace ref {
Status grouped_mm(const TensorView& x, const TensorView& w, const TensorView& offsets, const TensorView& out);
Status grouped_mm_wgrad(const TensorView& dy, const TensorView& x, const TensorView& offsets, const TensorView& dw);
}  // namespace ref

}  // namespace kernelforge
