// kernelforge activation family: gated MLP activations (SwiGLU, GeGLU) and GELU, forward and backward.
//
// Every tensor is viewed as rows, as in norm.h: shape [..., N] whose leading dimensions collapse into
// one row stride (any contiguous tensor, or a row-strided view such as big[:, :N]) and whose last
// dimension is contiguous (stride 1). Inputs and outputs share one dtype: float32, float16 or
// bfloat16 (bfloat16 needs sm_80+). Arithmetic is float32 and each output is rounded once to the
// dtype; every function launches on `stream` and never synchronizes or allocates. Rows == 0 (or a
// last dimension of 0) launches nothing. Any last-dimension size and base-pointer alignment works
// (16-byte vectors where alignment allows, narrower ones otherwise).
//
// Formulas (a = the activation input ("gate"), b = the multiplier, T(v) = round to the dtype):
//   silu(a)      = a / (1 + exp(-a))                        d/da = s (1 + a (1 - s)), s = sigmoid(a)
//   gelu(a)      = 0.5 a (1 + erf(a / sqrt(2)))             d/da = Phi(a) + a phi(a)      (kNone)
//   gelu_tanh(a) = 0.5 a (1 + tanh(k (a + 0.044715 a^3)))   k = sqrt(2 / pi)              (kTanh)
//                  d/da = 0.5 (1 + t) + 0.5 a (1 - t^2) k (1 + 3 * 0.044715 a^2), t = tanh(...)
//
//   silu_and_mul  x [..., 2I] -> y [..., I]:   y = T(silu(x[..., :I]) * x[..., I:])   (vLLM / kernels)
//   swiglu        gate, up [..., I] -> y:      y = T(silu(gate) * up)                 (HF LlamaMLP)
//   gelu_and_mul  x [..., 2I] -> y [..., I]:   gate_first: y = T(gelu(x[..., :I]) * x[..., I:])
//                                              else:       y = T(x[..., :I] * gelu(x[..., I:]))
//                                              (the latter is diffusers GEGLU: hidden, gate = chunk(2))
//   geglu         hidden, gate [..., I] -> y:  y = T(hidden * gelu(gate))             (diffusers)
//   gelu          x [..., N] -> y [..., N]:    y = T(gelu(x))                         (F.gelu)
// Eager PyTorch rounds act(a) to the dtype before the multiply; the fused ops round once (closer to
// exact; the two differ by at most that rounding).
//
// Backward (g = the gradient of y): d(gate) = T(g * b * act'(a)), d(up) = T(g * act(a)); for the
// [..., 2I] ops both halves are written into dx [..., 2I] in the input's order.
//
// GELU backward with the bias gradient (the backward of act(x Wᵀ + b) when x = the pre-activation
// of a linear layer's output [..., N] and b its bias [N]):
//   gelu_backward_bias_grad   dx[r, c] = T(dy[r, c] * gelu'(x[r, c]))      (bit-identical to gelu_backward)
//                             dbias[c] = Tb(sum_r dy[r, c] * gelu'(x[r, c]))
// One pass over dy and x: reads 2·M·N, writes M·N elements and N bias values, instead of gelu_backward
// followed by a column sum of dx (4·M·N). The sums add the float32 products before their rounding to T,
// in a fixed order (row chunks of float32 partials in `workspace`, reduced chunk by chunk, no
// atomics): bit-identical run to run, on every GPU and for every plan. dbias is a 1-D tensor [N] of
// any element stride (not 0 unless N = 1) and any of float32/float16/bfloat16 (its own dtype: the
// bias's, which may differ from dy's); M = 0 writes dbias = 0. Workspace: at least
// gelu_backward_bias_grad_workspace_size(M, N) bytes, 4-byte aligned (a function of the sizes only;
// caller memory, never allocated here; any pointer when the size is 0).
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "kernelforge/status.h"
#include "kernelforge/tensor.h"

namespace kernelforge {

// GELU flavour, as F.gelu's `approximate`: "none" (erf) or "tanh".
enum class GeluApprox : int { kNone = 0, kTanh = 1 };

// ---- forward (CUDA) --------------------------------------------------------------------------
Status silu_and_mul(const TensorView& x, const TensorView& y, cudaStream_t stream);
Status swiglu(const TensorView& gate, const TensorView& up, const TensorView& y, cudaStream_t stream);
Status gelu_and_mul(const TensorView& x, GeluApprox approximate, bool gate_first, const TensorView& y,
                    cudaStream_t stream);
Status geglu(const TensorView& hidden, const TensorView& gate, GeluApprox approximate, const TensorView& y,
             cudaStream_t stream);
Status gelu(const TensorView& x, GeluApprox approximate, const TensorView& y, cudaStream_t stream);

// ---- backward (CUDA) -------------------------------------------------------------------------
// dy has the forward output's shape; every gradient has its input's shape (outputs may be row views).
Status silu_and_mul_backward(const TensorView& dy, const TensorView& x, const TensorView& dx, cudaStream_t stream);
Status swiglu_backward(const TensorView& dy, const TensorView& gate, const TensorView& up, const TensorView& dgate,
                       const TensorView& dup, cudaStream_t stream);
Status gelu_and_mul_backward(const TensorView& dy, const TensorView& x, GeluApprox approximate, bool gate_first,
                             const TensorView& dx, cudaStream_t stream);
Status geglu_backward(const TensorView& dy, const TensorView& hidden, const TensorView& gate, GeluApprox approximate,
                      const TensorView& dhidden, const TensorView& dgate, cudaStream_t stream);
Status gelu_backward(const TensorView& dy, const TensorView& x, GeluApprox approximate, const TensorView& dx,
                     cudaStream_t stream);

// ---- GELU backward + bias gradient (CUDA) --------------------------------------------------------
// rows = M (the product of x's leading dimensions), n = N (its last dimension).
size_t gelu_backward_bias_grad_workspace_size(int64_t rows, int64_t n);
Status gelu_backward_bias_grad(const TensorView& dy, const TensorView& x, GeluApprox approximate, const TensorView& dx,
                               const TensorView& dbias, void* workspace, size_t workspace_bytes, cudaStream_t stream);

// ---- float64 CPU reference -------------------------------------------------------------------
// Same signatures without the stream, for CPU tensors of float64/float32/float16/bfloat16: computes
// in double with the textbook formulas above and rounds each output once. It is the test oracle
// and the CPU implementation of the PyTorch ops.
namespace ref {
Status silu_and_mul(const TensorView& x, const TensorView& y);
Status swiglu(const TensorView& gate, const TensorView& up, const TensorView& y);
Status gelu_and_mul(const TensorView& x, GeluApprox approximate, bool gate_first, const TensorView& y);
Status geglu(const TensorView& hidden, const TensorView& gate, GeluApprox approximate, const TensorView& y);
Status gelu(const TensorView& x, GeluApprox approximate, const TensorView& y);
Status silu_and_mul_backward(const TensorView& dy, const TensorView& x, const TensorView& dx);
Status swiglu_backward(const TensorView& dy, const TensorView& gate, const TensorView& up, const TensorView& dgate,
                       const TensorView& dup);
Status gelu_and_mul_backward(const TensorView& dy, const TensorView& x, GeluApprox approximate, bool gate_first,
                             const TensorView& dx);
Status geglu_backward(const TensorView& dy, const TensorView& hidden, const TensorView& gate, GeluApprox approximate,
                      const TensorView& dhidden, const TensorView& dgate);
Status gelu_backward(const TensorView& dy, const TensorView& x, GeluApprox approximate, const TensorView& dx);
// dbias may also be float64 here; the sums are float64.
Status gelu_backward_bias_grad(const TensorView& dy, const TensorView& x, GeluApprox approximate, const TensorView& dx,
                               const TensorView& dbias);
}  // namespace ref

}  // namespace kernelforge
