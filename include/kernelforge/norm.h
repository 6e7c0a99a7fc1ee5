// kernelforge normalization family: RMSNorm, residual-add RMSNorm, LayerNorm, AdaLN.
//
// Every tensor is viewed as rows: x has shape [..., N]; its leading dimensions must collapse into
// one row stride (any contiguous tensor, or a row-strided view such as x[:, :N] of a wider buffer),
// and its last dimension must be contiguous (stride 1). Outputs are row views of the same kind.
// Inputs and outputs share one dtype: float32, float16 or bfloat16 (bfloat16 needs sm_80+).
// Statistics are accumulated in float32; every function launches on `stream` and never
// synchronizes or allocates. Rows == 0 launches nothing.
//
// Formulas (r = one row, n = N, all arithmetic in float32, T(v) = round to the tensor dtype):
//   rms_norm     rstd = 1/sqrt(mean(x^2) + eps)
//                y = T(T(x * rstd) * w)        (HF transformers: cast to the input dtype, then *w)
//                y = T(x * rstd)               (no weight)
//   add_rms_norm s = T(x + residual); y = rms_norm(s); both y and s are written
//   layer_norm   mean = mean(x), var = mean((x - mean)^2) (biased), y = T((x - mean) * rstd * w + b)
//   ada_norm     y = T(norm(x) * (1 + scale) + shift), norm = layer_norm or rms_norm in float32
//                (weight/bias optional, no intermediate rounding); scale/shift have shape [N],
//                or x's rank with leading dims equal to x's followed by ones, e.g. [B, 1, N] or
//                [B, S, N] for x [B, S, N] (fewer dims are broadcast as in PyTorch).
//
// Backward functions need a float32 workspace for the deterministic weight-gradient reduction:
// call once with workspace == nullptr to get *workspace_bytes, then again with a buffer of that
// size (CUB style). The reduction order is fixed: results are bit-identical run to run.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>

#include "kernelforge/status.h"
#include "kernelforge/tensor.h"

namespace kernelforge {

enum class NormKind : int { kRms = 0, kLayer = 1 };

// ---- forward (CUDA) --------------------------------------------------------------------------
Status rms_norm(const TensorView& x, const TensorView* weight, float eps, const TensorView& y, cudaStream_t stream);

Status add_rms_norm(const TensorView& x, const TensorView& residual, const TensorView* weight, float eps,
                    const TensorView& y, const TensorView& sum, cudaStream_t stream);

Status layer_norm(const TensorView& x, const TensorView* weight, const TensorView* bias, float eps, const TensorView& y,
                  cudaStream_t stream);

Status ada_norm(const TensorView& x, const TensorView& scale, const TensorView& shift, const TensorView* weight,
                const TensorView* bias, float eps, NormKind kind, const TensorView& y, cudaStream_t stream);

// ---- backward (CUDA) -------------------------------------------------------------------------
// Gradient outputs that are nullptr are not computed. dweight/dbias have the shape of weight/bias,
// dscale/dshift the shape of scale/shift (contiguous).
Status rms_norm_backward(const TensorView& dy, const TensorView& x, const TensorView* weight, float eps,
                         const TensorView& dx, const TensorView* dweight, void* workspace, size_t* workspace_bytes,
                         cudaStream_t stream);

// `sum` is the s = x + residual written by the forward; dsum (optional) is the gradient flowing
// into s from later layers. dx is the gradient of both x and residual.
Status add_rms_norm_backward(const TensorView& dy, const TensorView* dsum, const TensorView& sum,
                             const TensorView* weight, float eps, const TensorView& dx, const TensorView* dweight,
                             void* workspace, size_t* workspace_bytes, cudaStream_t stream);

Status layer_norm_backward(const TensorView& dy, const TensorView& x, const TensorView* weight, const TensorView* bias,
                           float eps, const TensorView& dx, const TensorView* dweight, const TensorView* dbias,
                           void* workspace, size_t* workspace_bytes, cudaStream_t stream);

Status ada_norm_backward(const TensorView& dy, const TensorView& x, const TensorView& scale, const TensorView& shift,
                         const TensorView* weight, const TensorView* bias, float eps, NormKind kind,
                         const TensorView& dx, const TensorView* dscale, const TensorView* dshift,
                         const TensorView* dweight, const TensorView* dbias, void* workspace, size_t* workspace_bytes,
                         cudaStream_t stream);

// ---- float64 CPU reference -------------------------------------------------------------------
// Same signatures without the stream and workspace, for CPU tensors of float64/float32/float16/
// bfloat16. Computes in double and rounds like the CUDA kernels (the rms_norm intermediate cast
// included). It is the test oracle and the CPU implementation of the PyTorch ops.
namespace ref {
Status rms_norm(const TensorView& x, const TensorView* weight, float eps, const TensorView& y);
Status add_rms_norm(const TensorView& x, const TensorView& residual, const TensorView* weight, float eps,
                    const TensorView& y, const TensorView& sum);
Status layer_norm(const TensorView& x, const TensorView* weight, const TensorView* bias, float eps,
                  const TensorView& y);
Status ada_norm(const TensorView& x, const TensorView& scale, const TensorView& shift, const TensorView* weight,
                const TensorView* bias, float eps, NormKind kind, const TensorView& y);
Status rms_norm_backward(const TensorView& dy, const TensorView& x, const TensorView* weight, float eps,
                         const TensorView& dx, const TensorView* dweight);
Status add_rms_norm_backward(const TensorView& dy, const TensorView* dsum, const TensorView& sum,
                             const TensorView* weight, float eps, const TensorView& dx, const TensorView* dweight);
Status layer_norm_backward(const TensorView& dy, const TensorView& x, const TensorView* weight, const TensorView* bias,
                           float eps, const TensorView& dx, const TensorView* dweight, const TensorView* dbias);
Status ada_norm_backward(const TensorView& dy, const TensorView& x, const TensorView& scale, const TensorView& shift,
                         const TensorView* weight, const TensorView* bias, float eps, NormKind kind,
                         const TensorView& dx, const TensorView* dscale, const TensorView* dshift,
                         const TensorView* dweight, const TensorView* dbias);
}  // namespace ref

}  // namespace kernelforge
