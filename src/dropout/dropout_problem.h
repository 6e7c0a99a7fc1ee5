// Internal description of one dropout call, shared by the CUDA launchers and the float64 reference.
// validate_dropout() fills it from the public arguments; it is the only place that checks them
// (dtype, shape, contiguity, device, p, rng_state), so every error message comes from one file.
//
// Every op is one form over the flat element range [0, numel): out_i = in_i * f_i (+ add_i), with
// f_i = m_i ? scale : 0 and m_i the keep bit of element i (include/kernelforge/dropout.h):
//   dropout:          in = x,  out = y
//   dropout_add:      in = x,  add = residual, out = y
//   dropout_backward: in = dy, out = dx, the random stream read from the forward's rng_state
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "kernelforge/dropout.h"

namespace kernelforge {

enum class DropOp : int { kDropout = 0, kDropoutAdd = 1, kBackward = 2 };

// The keep rule of drop probability p, shared by the kernels and the reference: keep iff the
// element's 16 random bits (a value in [0, 65536)) < threshold = round((1 - p) 2^16), a value in
// [0, 65536]: p = 0 (or any p below 2^-17) gives 65536 (always), p = 1 gives 0 (never). The keep
// probability is threshold / 65536, (1 - p) to within 2^-17. scale = 1 / (1 - p) in float32 (0 for
// p = 1: unused, nothing is kept).
struct KeepRule {
  uint32_t threshold = 65536;
  float scale = 1.f;
};
KeepRule keep_rule(double p);  // p in [0, 1] (validated before)

// Device-side parameters (passed by value to the kernels).
struct DropParams {
  const void* in = nullptr;    // x (forward) or dy (backward)
  const void* add = nullptr;   // residual (dropout_add), else nullptr
  void* out = nullptr;         // y or dx
  uint8_t* mask = nullptr;     // keep bits (dropout with a mask), else nullptr
  int64_t* rng_out = nullptr;  // forward: receives the resolved (seed, offset), else nullptr
  int64_t numel = 0;
  PhiloxState rng;  // backward: captured-style, pointing into the forward's rng_state
  KeepRule keep;
  bool trigger = false;  // whether the kernel triggers its dependents at once (PDL, whole grid resident)
};

struct DropCall {
  const char* name = "";
  DropOp op = DropOp::kDropout;
  bool cuda = true;  // false: the CPU reference (float64 also accepted)
  double p = 0.5;
  PhiloxState rng;                // forward
  const TensorView* x = nullptr;  // forward input
  const TensorView* residual = nullptr;
  const TensorView* y = nullptr;          // forward output
  const TensorView* dy = nullptr;         // backward input
  const TensorView* dx = nullptr;         // backward output
  const TensorView* rng_state = nullptr;  // forward: optional output; backward: input
  uint8_t* mask = nullptr;
};

// Checks every argument of `c` and fills `p`. `dtype` receives the dtype. For the reference, the
// backward's p->rng holds the values read from the CPU rng_state.
Status validate_dropout(const DropCall& c, DropParams* p, DType* dtype);

}  // namespace kernelforge
