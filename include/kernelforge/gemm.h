// kernelforge GEMM family: out = act(a b^T + bias), the product of a linear layer and of its two
// backward GEMMs, through cuBLASLt with its fused epilogues (a well-kept library that already runs
// these products at the tensor cores' rate: this family plans, validates and fuses around it).
//
// Tensors (element strides; each matrix either row-major (stride 1 along K) or column-major (stride
// 1 along its rows), so a transposed view is taken as is, without a copy):
//   a      [M, K]   x in the forward; dy in dx = dy W (b = W^T, a view); dy^T in dW = dy^T x
//   b      [N, K]   nn.Linear's weight [N, K] in the forward
//   bias   optional [N], contiguous: added before the activation
//   out    [M, N]   row-major (stride 1 along N), any row stride
//   aux    optional [M, N], contiguous: the pre-activation a b^T + bias, written for gelu_tanh's
//          backward (relu's reads out > 0; cuBLASLt wants N % 8 == 0 for aux, else NotSupported)
//   a_sum  optional [M], contiguous: sum_k a[m, k] (the bias gradient when a = dy^T), float32
//          accumulation, rounded once; without bias and activation
// Batched (torch.bmm / matmul): out [B, M, N] (row-major matrices, any batch stride that keeps the batches
// apart), a [B, M, K] or [M, K], b [B, N, K] or [N, K] (a 2-D operand is shared by every batch, batch
// stride 0), aux [B, M, N] contiguous, bias [N] shared; one strided-batched cuBLASLt call. a_sum takes
// 2-D calls only.
// a, b, bias, out and aux share one dtype, float16, bfloat16 or float32; products accumulate in float32
// and out is rounded once (float32 runs cuBLASLt's plain float32 compute, no TF32: torch's default). Activations: none,
// relu, gelu_tanh (0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))), cuBLASLt's GELU). M, N or K may be 0 (K = 0: out =
// act(bias), or act(0)).
//
// accumulate: out += a b^T (cuBLASLt's beta = 1; out is read), without bias, activation, aux or a_sum:
// the running sums of a chunked weight gradient. Its first run is not timed (timing would add the product
// several times); it takes the timed choice of the same product without accumulate when one exists.
//
// FLOPs 2 B M N K. The fused epilogue saves the separate pass over out (a read and a write of M N
// elements) that an unfused bias + activation costs.
//
// Plan and run as in attention.h: gemm_plan() reads shapes, strides, alignment and the device, asks
// cuBLASLt's heuristic once per distinct problem (cached) and returns the algorithm with the workspace
// it needs (CUB's size-query convention); see GemmPlan for the one-time timing of its candidates.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <string>

#include "kernelforge/status.h"
#include "kernelforge/tensor.h"

namespace kernelforge {

enum class GemmActivation { kNone, kRelu, kGeluTanh };

// The most workspace a plan asks for (cuBLAS's recommendation on Hopper; split-K and stream-K use it):
// a caller that reserves this much can run any plan.
constexpr size_t kGemmMaxWorkspace = size_t(32) << 20;

const char* to_string(GemmActivation act);  // "none", "relu", "gelu_tanh"

struct GemmTensors {
  const TensorView* a = nullptr;
  const TensorView* b = nullptr;
  const TensorView* bias = nullptr;  // optional
  const TensorView* out = nullptr;
  const TensorView* aux = nullptr;    // optional (with an activation)
  const TensorView* a_sum = nullptr;  // optional
  bool accumulate = false;            // out += a b^T
};

// A cuBLASLt algorithm for one problem, kept opaque (cublasLtMatmulAlgo_t is 8 64-bit words), with the
// fields worth printing. The heuristic ranks up to 8 candidates without running them; the first run of a
// problem outside a CUDA-graph capture times each once and the fastest is kept (`tuned`; until then the
// plan is the heuristic's first choice with a workspace that fits every candidate). KF_GEMM_TUNE=0: the
// heuristic's first choice, untimed.
struct GemmPlan {
  uint64_t algo[8] = {};
  bool tuned = false;
  int algo_id = -1;  // cuBLASLt's algorithm id; -1: no GEMM runs (K = 0 or an empty output)
  int tile = 0;      // cublasLtMatmulTile_t
  int stages = 0;    // cublasLtMatmulStages_t
  int split_k = 1;   // K splits
  size_t workspace = 0;
};

std::string to_string(const GemmPlan& plan);  // e.g. "gemm_cublaslt algo=66 tile=20 stages=0 split_k=1 ws=0 tuned"

// ---- CUDA ------------------------------------------------------------------------------------
Status gemm_plan(const GemmTensors& t, GemmActivation act, GemmPlan* plan, size_t* workspace_bytes);
Status gemm(const GemmPlan& plan, const GemmTensors& t, GemmActivation act, void* workspace, size_t workspace_bytes,
            cudaStream_t stream);
Status gemm(const GemmTensors& t, GemmActivation act, void* workspace, size_t* workspace_bytes, cudaStream_t stream);

// ---- float64 CPU reference -------------------------------------------------------------------
// The same call on CPU tensors (float32 and float64 also accepted): double sums, each output rounded once.
namespace ref {
Status gemm(const GemmTensors& t, GemmActivation act);
}  // namespace ref

}  // namespace kernelforge
