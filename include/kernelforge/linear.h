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
// it, so the bound is the copy rate of N * K elements. FLOPs 2 * M * N * K, on tensor cores (kGemv:
// float32 FMAs on the CUDA cores).
//
// Plan and run as in attention.h: linear_plan() reads only shapes, strides and the device; the run
// needs a workspace when a kCpAsync plan splits K (float32 partial sums), CUB's size-query convention.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <string>

#include "kernelforge/status.h"
#include "kernelforge/tensor.h"

namespace kernelforge {

constexpr int64_t kLinearMaxRows = 16;
constexpr int64_t kLinearGemvMaxRows = 4;  // the kGemv kernel's rows of x

struct LinearTensors {
  const TensorView* x = nullptr;
  const TensorView* w = nullptr;
  const TensorView* bias = nullptr;  // optional
  const TensorView* y = nullptr;
};

// Which kernel runs (notes/linear.md):
//   kCpAsync  any sm_80+ GPU, any alignment: every thread copies W and x with cp.async into a
//             `stages`-deep ring; K splits write float32 partial sums to the workspace and a second
//             kernel adds them and the bias.
//   kTma      sm_90 with a 90a build, 16-byte aligned x and w with 16-byte multiple row strides and
//             K >= 8: one producer warp issues TMA tile copies into the ring; the K splits of a column
//             block form one thread-block cluster (splits <= 8) and add their partial sums through
//             distributed shared memory (no workspace, no second kernel).
//   kGemv     M <= 4 rows (kLinearGemvMaxRows), K a multiple of 8, x and w 16-byte aligned with row
//             strides of 8-element multiples (x's only when M > 1): CUDA-core FMAs, each warp load 512
//             contiguous bytes of one W row, registers instead of a shared-memory ring; no K split.
enum class LinearKernel { kCpAsync, kTma, kGemv };

// kCpAsync / kTma: one CTA per (block_n output columns, K split); `warps` warps each own 32 of the
// columns (kTma adds one producer warp) and stream their weight rows through the ring, block_k columns
// per stage. kGemv: one CTA per block_n output columns over all of K, block_k columns of K per round
// (16 bytes a thread per row), stages = 1 (a round's loads are registers), splits = 1.
struct LinearPlan {
  LinearKernel kernel = LinearKernel::kCpAsync;
  int block_n = 0;
  int block_k = 0;
  int warps = 0;
  int stages = 0;
  int splits = 1;  // K splits: kCpAsync writes float32 partial sums to the workspace then reduces them
};

// e.g. "linear_skinny tile=128x64 warps=4 stages=4 splits=8",
//      "linear_skinny_tma tile=128x64 warps=4+1 stages=6 splits=8", "linear_gemv rows=4 k_round=2048 warps=4"
std::string to_string(const LinearPlan& plan);

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
