// kernelforge fused_linear_rowsum family: the row sums of a linear layer's output, without the output.
//
//   y[t] = sum_o (x Wᵀ + b)[t, o] = x[t, :] · w_sum + b_sum,  w_sum[k] = sum_o W[o, k],  b_sum = sum_o b[o]
//
// i.e. torch.nn.functional.linear(x, W, b).sum(-1), whose [T, O] product never exists: the forward reads
// W once (column sums) and x once (a dot product per row).
//
// Tensors (one dtype for x, weight, bias, y and the gradients: float32, float16 or bfloat16; bfloat16
// needs sm_80+):
//   x       [..., K]  rows: the leading dimensions collapse into one row stride, the last is contiguous
//   weight  [O, K]    nn.Linear's weight (one row stride, last dimension contiguous)
//   bias    [O]       optional (nullptr: b_sum = 0), any stride
//   y       x.shape[:-1] (one stride): a [T] output for x [T, K]. The Flash-Kernels-v2 FusedLinearRowSum
//                     module returns [batch] too, not [batch, 1]; keepdim is the caller's unsqueeze(-1).
//   w_sum   [K] float32, contiguous: written by the forward, kept (instead of W) for the backward
// Math is float32 with deterministic reductions (fixed order, no atomics: bit-identical run to run on
// one device); every output is rounded once to the dtype.
//
// Backward, given dy (x.shape[:-1]):
//   dx[t, k]      = dy[t] * w_sum[k]
//   dweight[o, k] = g[k] = sum_t dy[t] x[t, k]   (the same row for every o)
//   dbias[o]      = sum_t dy[t]                  (the same value for every o)
// Each gradient is optional (nullptr: not computed).
//
// Empty sizes: T = 0 (no rows) launches nothing in the forward (w_sum is then not written: the
// backward of zero rows never reads it) and gives dweight = 0, dbias = 0 in the backward; K = 0
// gives y = b_sum; O = 0 gives y = 0 and w_sum = 0.
//
// Workspace: the column sums go through float32 partials (row chunks spread over the GPU, reduced in a
// fixed order), held in caller memory: fused_linear_rowsum_workspace_size(T, K, O) bytes (a function
// of the sizes only; it covers the forward and the backward), 16-byte aligned. The library never
// allocates or synchronizes; every function launches on `stream`.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "kernelforge/status.h"
#include "kernelforge/tensor.h"

namespace kernelforge {

// Bytes of workspace the forward and the backward of these sizes need (T = rows of x, K = in_features,
// O = out_features).
size_t fused_linear_rowsum_workspace_size(int64_t tokens, int64_t in_features, int64_t out_features);

// ---- CUDA ------------------------------------------------------------------------------------
// Writes y and w_sum.
Status fused_linear_rowsum(const TensorView& x, const TensorView& weight, const TensorView* bias, const TensorView& y,
                           const TensorView& w_sum, void* workspace, size_t workspace_bytes, cudaStream_t stream);

// Writes the requested gradients. O is read from dweight or dbias (either may be absent); w_sum is read
// only for dx.
Status fused_linear_rowsum_backward(const TensorView& dy, const TensorView& x, const TensorView& w_sum,
                                    const TensorView* dx, const TensorView* dweight, const TensorView* dbias,
                                    void* workspace, size_t workspace_bytes, cudaStream_t stream);

// ---- float64 CPU reference (the test oracle and the CPU implementation of the ops) -----------
// Same contract for CPU tensors of float64/float32/float16/bfloat16, no workspace: sums in double,
// every output rounded once. w_sum may be float32 or float64 (float64 keeps the reference exact for
// float64 inputs).
namespace ref {
Status fused_linear_rowsum(const TensorView& x, const TensorView& weight, const TensorView* bias, const TensorView& y,
                           const TensorView& w_sum);
Status fused_linear_rowsum_backward(const TensorView& dy, const TensorView& x, const TensorView& w_sum,
                                    const TensorView* dx, const TensorView* dweight, const TensorView* dbias);
}  // namespace ref

}  // namespace kernelforge
