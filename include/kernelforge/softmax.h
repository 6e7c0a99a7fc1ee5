// kernelforge softmax family: softmax and log_softmax over the last dimension, forward and backward.
//
// Tensors are viewed as rows, as in norm.h: shape [..., N] whose leading dimensions collapse into
// one row stride (any contiguous tensor, or a row-strided view such as big[:, :N]) and whose last
// dimension is contiguous (stride 1). Inputs and outputs share one dtype: float32, float16 or
// bfloat16 (bfloat16 needs sm_80+). Arithmetic is float32 and each output is rounded once to the
// dtype; every function launches on `stream` and never synchronizes or allocates. Rows == 0 (or
// N == 0) launches nothing. Any N from 1 to at least 262144 and any base-pointer alignment works.
//
// Formulas (per row, m = max_j x_j, s = sum_j exp(x_j - m), T(v) = round to the dtype):
//   softmax       y_j = T(exp(x_j - m) / s)
//   log_softmax   y_j = T(x_j - m - log(s))
// Backward takes the forward's output y (as PyTorch's _softmax_backward_data does), g = dL/dy:
//   softmax       dx_j = T(y_j * (g_j - sum_k g_k y_k))
//   log_softmax   dx_j = T(g_j - exp(y_j) * sum_k g_k)
// A row holding +inf, -inf only or NaN gives what torch.softmax gives (NaN where it does).
// Traffic: forward reads x and writes y once (2 passes over the rows); backward reads g and y and
// writes dx once (3 passes). Rows too long for one CTA are split over a thread-block cluster on
// sm_90; without clusters (sm_75/sm_80) such rows are read twice.
#pragma once

#include <cuda_runtime_api.h>

#include "kernelforge/status.h"
#include "kernelforge/tensor.h"

namespace kernelforge {

// ---- CUDA ------------------------------------------------------------------------------------
// x, y: [..., N] (y may be x itself: in place). dx may be g itself (in place).
Status softmax(const TensorView& x, const TensorView& y, cudaStream_t stream);
Status log_softmax(const TensorView& x, const TensorView& y, cudaStream_t stream);
Status softmax_backward(const TensorView& g, const TensorView& y, const TensorView& dx, cudaStream_t stream);
Status log_softmax_backward(const TensorView& g, const TensorView& y, const TensorView& dx, cudaStream_t stream);

// ---- float64 CPU reference (same signatures without the stream; CPU tensors of any float dtype,
// computed in double and rounded once). The test oracle and the CPU implementation of the ops.
namespace ref {
Status softmax(const TensorView& x, const TensorView& y);
Status log_softmax(const TensorView& x, const TensorView& y);
Status softmax_backward(const TensorView& g, const TensorView& y, const TensorView& dx);
Status log_softmax_backward(const TensorView& g, const TensorView& y, const TensorView& dx);
}  // namespace ref

}  // namespace kernelforge
