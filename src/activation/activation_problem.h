// Internal description of one activation call, shared by the CUDA launchers and the float64
// reference. validate_activation() fills it from the public TensorViews; it is the only place that
// checks arguments (dtype, shape, strides, device, sizes), so every error message comes from one file.
//
// Every op is reduced to one form: y = act(a) * b over rows of n columns (b absent for gelu), with
// a = the activation input ("gate") and b = the multiplier. For the [..., 2I] ops a and b are the
// two halves of one row of x (same row stride, b = a +/- I), and the gradients da/db the two halves
// of one row of dx.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "kernelforge/activation.h"

namespace kernelforge {

enum class ActOp : int { kSiluAndMul = 0, kSwiglu = 1, kGeluAndMul = 2, kGeglu = 3, kGelu = 4 };

// The elementwise function applied to a.
enum class ActFn : int { kSilu = 0, kGeluErf = 1, kGeluTanh = 2 };

// Device-side parameters (passed by value to the kernels). Element (r, c) of tensor t is at
// t + r * t_stride + c (64-bit row offsets; c < n < 2^31).
struct ActParams {
  const void* a = nullptr;   // activation input (gate)
  const void* b = nullptr;   // multiplier (up / hidden); nullptr for gelu
  void* y = nullptr;         // forward output
  const void* dy = nullptr;  // backward: gradient of y
  void* da = nullptr;        // backward: gradient of a
  void* db = nullptr;        // backward: gradient of b (gated ops)
  int64_t rows = 0;
  int64_t n = 0;  // columns of y (I for the gated ops)
  int64_t a_stride = 0, b_stride = 0, y_stride = 0, dy_stride = 0, da_stride = 0, db_stride = 0;
  // gelu_backward_bias_grad: dbias[c * dbias_stride] = the column sums of the gradient da (in its own
  // dtype), through the float32 partials [row chunks, n] of the workspace; nullptr otherwise.
  void* dbias = nullptr;
  int64_t dbias_stride = 0;
  DType dbias_dtype = DType::kFloat32;
  float* partials = nullptr;
  // whether the kernel triggers its dependents at once (set by the launcher: PDL on sm_90, whole grid
  // resident)
  bool trigger = false;
};

struct ActCall {
  const char* name = "";
  ActOp op = ActOp::kSwiglu;
  bool backward = false;
  bool cuda = true;  // false: the CPU reference (float64 also accepted)
  GeluApprox approx = GeluApprox::kNone;
  bool gate_first = true;  // gelu_and_mul only
  // inputs: x for silu_and_mul / gelu_and_mul / gelu; gate + up for swiglu; gate + hidden for geglu
  // (`up` holds hidden: it is the multiplier)
  const TensorView* x = nullptr;
  const TensorView* gate = nullptr;
  const TensorView* up = nullptr;
  // forward output
  const TensorView* y = nullptr;
  // backward: dy; dx for the one-input ops, dgate + dup (geglu: dhidden) for the two-input ops
  const TensorView* dy = nullptr;
  const TensorView* dx = nullptr;
  const TensorView* dgate = nullptr;
  const TensorView* dup = nullptr;
  // gelu_backward_bias_grad (op kGelu, backward): the bias gradient [n] and the workspace of its partial
  // sums (CUDA only)
  const TensorView* dbias = nullptr;
  void* workspace = nullptr;
  size_t workspace_bytes = 0;
};

inline bool act_is_split(ActOp op) { return op == ActOp::kSiluAndMul || op == ActOp::kGeluAndMul; }
inline bool act_is_gated(ActOp op) { return op != ActOp::kGelu; }
inline ActFn act_fn(ActOp op, GeluApprox approx) {
  if (op == ActOp::kSiluAndMul || op == ActOp::kSwiglu) return ActFn::kSilu;
  return approx == GeluApprox::kTanh ? ActFn::kGeluTanh : ActFn::kGeluErf;
}

// Checks every argument of `c` and fills `p` (pointers, strides, sizes). `dtype` receives the dtype.
Status validate_activation(const ActCall& c, ActParams* p, DType* dtype);

}  // namespace kernelforge
