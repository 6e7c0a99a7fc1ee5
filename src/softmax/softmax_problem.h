// Internal description of one softmax-family call, shared by the CUDA launchers and the float64
// reference. validate_softmax() fills it from the public TensorViews; it is the only place that
// checks arguments (dtype, shape, strides, device, sizes), so every error message comes from one file.
//
// Every call is one form over rows of n columns: out = f(in[, y]) with
//   forward:  in = x, out = y                      (softmax / log_softmax of each row)
//   backward: in = g (= dL/dy), y = the forward's output, out = dx
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "kernelforge/softmax.h"

namespace kernelforge {

// Device-side parameters (passed by value to the kernels). Element (r, c) of tensor t is at
// t + r * t_stride + c (64-bit row offsets; c < n <= 2^31 - 1).
struct SoftmaxParams {
  const void* in = nullptr;  // forward: x; backward: g
  const void* y = nullptr;   // backward: the forward's output (nullptr in the forward)
  void* out = nullptr;       // forward: y; backward: dx (may alias in, or y)
  int64_t rows = 0;
  int64_t n = 0;
  int64_t in_stride = 0, y_stride = 0, out_stride = 0;
  // launch: whether the kernel triggers its dependents at once (set by the launcher: PDL on sm_90,
  // the whole grid resident)
  bool trigger = false;
  // launch: rows whose pointers are not 16-byte aligned but share their misalignment (odd n,
  // contiguous): each row is read as a scalar head up to the next 16-byte boundary, then 16-byte
  // vectors (set by the launcher from SoftmaxPlan::scalar_head; softmax_stream reads it, the other
  // kernels are instantiated for it)
  bool scalar_head = false;
};

struct SoftmaxCall {
  const char* name = "";
  bool log = false;                // log_softmax
  bool backward = false;           // *_backward
  bool cuda = true;                // false: the CPU reference (float64 also accepted)
  const TensorView* x = nullptr;   // forward input
  const TensorView* g = nullptr;   // backward: gradient of y
  const TensorView* y = nullptr;   // forward: output; backward: the forward's output (input)
  const TensorView* dx = nullptr;  // backward output
};

// Checks every argument of `c` and fills `p` (pointers, strides, sizes). `dtype` receives the dtype.
Status validate_softmax(const SoftmaxCall& c, SoftmaxParams* p, DType* dtype);

}  // namespace kernelforge
