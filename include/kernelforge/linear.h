// kernelforge linear family: y = x W^T (+ bias), nn.Linear's product, for the few rows of a decode
// step (M <= 16 tokens: skinny GEMM, bound by reading W once).
//
// Tensors (element strides; every last dimension contiguous):
//   x     [M, K]        any row stride (the rows of a [B, S, K] activation flattened by the caller)
//   w     [N, K]        nn.Linear's weight, any row stride
//   bias  optional [N]
//   y     [M, N]        any row stride
// x, w, bias and y share one dtype, float16 or bfloat16; products accumulate in float32 and y is
// rounded once. M <= 16 (kLinearMaxRows); K and N any size >= 1 (M = 0 or N = 0: nothing runs;
// K = 0: y = bias, or 0).
//
// Bytes: N * K * sizeof(T) of w (read once), M * (K + N) of x and y: at M <= 16 the weight is all of
// it, so the bound is the copy rate of N * K elements. FLOPs 2 * M * N * K, on tensor cores.
//
// Plan and run as in attention.h: linear_plan() reads only shapes, strides and the device; the run
// needs a workspace when the plan splits K (float32 partial sums), CUB's size-query convention.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <string>

#include "kernelforge/status.h"
#include "kernelforge/tensor.h"

namespace kernelforge {

constexpr int64_t kLinearMaxRows = 16;

struct LinearTensors {
  const TensorView* x = nullptr;
  const TensorView* w = nullptr;
  const TensorView* bias = nullptr;  // optional
  const TensorView* y = nullptr;
};

// One CTA per (block_n output columns, K split); its warps each own block_n / warps columns and
// stream their weight rows through a `stages`-deep cp.async ring, block_k columns per stage.
struct LinearPlan {
  int block_n = 0;
  int block_k = 0;
  int warps = 0;
  int stages = 0;
  int splits = 1;  // K splits: > 1 writes float32 partial sums to the workspace, then a reduction
};

std::string to_string(const LinearPlan& plan);  // e.g. "linear_skinny tile=128x64 warps=4 stages=4 splits=8"

// ---- CUDA ------------------------------------------------------------------------------------
Status linear_plan(const LinearTensors& t, LinearPlan* plan, size_t* workspace_bytes);
Status linear(const LinearPlan& plan, const LinearTensors& t, void* workspace, size_t workspace_bytes,
              cudaStream_t stream);
Status linear(const LinearTensors& t, void* workspace, size_t* workspace_bytes, cudaStream_t stream);

// ---- float64 CPU reference -------------------------------------------------------------------
// The same call on CPU tensors (float32 and float64 also accepted; any M): double sums, y rounded once.
namespace ref {
Status linear(const LinearTensors& t);
}  // namespace ref

}  // namespace kernelforge
