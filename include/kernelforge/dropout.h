// kernelforge dropout family: dropout and dropout_add (pre-norm blocks' residual + dropout(x)),
// forward and backward, with a counter-based random number generator (Philox4x32-10).
//
// Formulas (m_i in {0, 1} the keep bit of element i, s = 1 / (1 - p), T(v) = round to the dtype):
//   dropout       y_i = T(x_i * f_i),               f_i = m_i ? s : 0
//   dropout_add   y_i = T(residual_i + x_i * f_i)    (one rounding; eager residual + F.dropout(x)
//                                                     rounds the dropout first)
//   backward      dx_i = T(dy_i * f_i)               (dropout_add: dresidual = dy, no kernel)
// A dropped element is x * 0, as F.dropout: 0 for finite x, NaN for inf / NaN. p = 1 keeps nothing
// (y = x * 0, zero gradient); p = 0 keeps everything (y = x, bit for bit). p must lie in [0, 1].
//
// Random bits: element i (its index in the row-major order of x, whatever the launch) takes 16 bits:
// with B = Philox4x32-10(key = (seed lo, seed hi), counter = (c lo, c hi, g lo, g hi)), c = offset / 4
// and g = i / 8 (curand's, and so PyTorch's, Philox stream of subsequence g at `offset`), element i
// takes the half (i % 8) % 2 (0 = the low 16 bits) of word (i % 8) / 2 of B. It is kept iff that
// value < round((1 - p) * 2^16): the keep probability is round((1 - p) 65536) / 65536, exact for
// p = 0 and p = 1 and within 2^-17 of 1 - p otherwise (the scale stays 1 / (1 - p)). Every plan,
// the backward and the float64 CPU reference give the identical mask. One call uses the counters
// (c, *) only: a generator that hands out offsets in steps of 4 (PyTorch's CUDA generator,
// philox_cuda_state(4)) never gives two calls, or a call and one of PyTorch's own random ops, the
// same counter.
//
// Tensors: x (and residual, y, dx, dy) are contiguous tensors of one shape and one dtype, float32,
// float16 or bfloat16 (bfloat16 needs sm_80+; the reference also takes float64), at any base
// alignment (16-byte vectors when every pointer allows, element accesses otherwise). y may be x
// (in place). numel == 0 launches nothing (rng_state is then left as it is). rng_state is a contiguous int64 tensor of
// 2 elements on x's device: the forward writes the (seed, offset) it used into it (on the device: no host sync, and
// right under CUDA-graph replay, where the offset changes every replay); the backward reads it. Every function launches
// on `stream` and never synchronizes or allocates.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "kernelforge/status.h"
#include "kernelforge/tensor.h"

namespace kernelforge {

// The random stream of one call, as PyTorch's PhiloxCudaState: values, or (under CUDA-graph
// capture) device pointers to the generator's seed and offset plus the offset this call adds to
// it inside the graph. Resolved on the device: seed = *seed_ptr, offset = *offset_ptr +
// offset_intragraph. offset counts 32-bit random values and is a multiple of 4.
struct PhiloxState {
  uint64_t seed = 0;
  uint64_t offset = 0;
  const int64_t* seed_ptr = nullptr;
  const int64_t* offset_ptr = nullptr;
  uint64_t offset_intragraph = 0;
  bool captured = false;
};

// ---- CUDA ------------------------------------------------------------------------------------
// rng_state: nullptr, or the 2-element int64 buffer that receives (seed, offset). mask: nullptr, or
// a contiguous buffer of x.numel() bytes that receives the keep bits (1 = kept; a torch.bool tensor
// of x's shape).
Status dropout(const TensorView& x, double p, const PhiloxState& rng, const TensorView& y, const TensorView* rng_state,
               uint8_t* mask, cudaStream_t stream);
Status dropout_add(const TensorView& x, const TensorView& residual, double p, const PhiloxState& rng,
                   const TensorView& y, const TensorView* rng_state, cudaStream_t stream);
// dx = dy * f with the mask of the forward that wrote rng_state (p must be the forward's).
Status dropout_backward(const TensorView& dy, const TensorView& rng_state, double p, const TensorView& dx,
                        cudaStream_t stream);

// ---- float64 CPU reference -------------------------------------------------------------------
// Same signatures without the stream, for CPU tensors (float64 too): the same Philox on the host,
// the formulas above in double, each output rounded once. rng_state is a CPU int64 tensor here, and
// a captured PhiloxState is rejected (its pointers are device memory). It is the test oracle and the
// CPU implementation of the PyTorch ops.
namespace ref {
Status dropout(const TensorView& x, double p, const PhiloxState& rng, const TensorView& y, const TensorView* rng_state,
               uint8_t* mask);
Status dropout_add(const TensorView& x, const TensorView& residual, double p, const PhiloxState& rng,
                   const TensorView& y, const TensorView* rng_state);
Status dropout_backward(const TensorView& dy, const TensorView& rng_state, double p, const TensorView& dx);

// The 16 random bits of element i (a value in [0, 65536), from the Philox block above), and whether
// the element is kept at drop probability p: the definition every kernel reproduces.
uint32_t dropout_bits(uint64_t seed, uint64_t offset, int64_t i);
bool dropout_keep(uint64_t seed, uint64_t offset, int64_t i, double p);
}  // namespace ref

}  // namespace kernelforge
