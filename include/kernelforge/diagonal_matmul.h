// kernelforge diagonal_matmul family: y = diag(a) · B (row scaling), batched, forward and backward.
//
// Shapes (B = the product of b's batch dimensions):
//   b  [..., M, N]  at least 2 dimensions; the last dimension contiguous (stride 1) and the leading
//                   dimensions collapsing into one row stride (any contiguous tensor, or a row-strided
//                   view such as big[:, :N]).
//   a  either b.shape[:-1]  one scale per row (per batch and row), or
//             [M]           one scale per row of the matrix, broadcast over b's batch dimensions
//                           (b with 3 or more dimensions; with 2 the two forms are the same).
//      Its dimensions must collapse into one stride (any contiguous a, a strided 1-D view, an expanded
//      scalar of stride 0). Any other shape is an InvalidArgument naming both accepted shapes.
//   y, db  b's shape;  da  a's shape;  dy  b's shape.
// a, b and every output share one dtype: float32, float16 or bfloat16 (bfloat16 needs sm_80+).
//
// Formulas (r = a row of b, m(r) = its row in the matrix, T(v) = round to the dtype, math in float32):
//   forward    y[r, n]  = T(a[r] · b[r, n])                     (a[m(r)] when a is broadcast)
//   backward   db[r, n] = T(a[r] · dy[r, n])
//              da[r]    = T(Σ_n dy[r, n] · b[r, n])             per-row a
//              da[m]    = T(Σ_batch Σ_n dy[r, n] · b[r, n])     broadcast a: float32 per-row sums, then
//                                                               summed over the batch in a fixed order
// Every result is bit-identical run to run (no atomics). Row offsets are 64-bit (M·N > 2^31 works);
// N is at most 2^31 - 1. Rows == 0 or N == 0 launches nothing for y and db; da of an empty sum is
// written as 0. y may be b itself (in place); db may be dy itself.
//
// Every function launches on `stream` and never synchronizes or allocates. The backward follows the
// norm family's workspace convention: call it with workspace == nullptr to get *workspace_bytes (0
// unless a is broadcast over more than one batch and da is requested: 4·B·M bytes of float32 row
// sums), then again with a buffer of at least that size (16-byte aligned, e.g. from cudaMalloc; any
// non-null pointer when the size is 0): a call with workspace == nullptr only writes the size.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>

#include "kernelforge/status.h"
#include "kernelforge/tensor.h"

namespace kernelforge {

// ---- CUDA ------------------------------------------------------------------------------------
Status diagonal_matmul(const TensorView& a, const TensorView& b, const TensorView& y, cudaStream_t stream);

// da and db are optional (nullptr: not computed; at least one must be given). With only db the
// kernel reads dy and a (b is not read); with only da it writes nothing but da.
Status diagonal_matmul_backward(const TensorView& dy, const TensorView& a, const TensorView& b, const TensorView* da,
                                const TensorView* db, void* workspace, size_t* workspace_bytes, cudaStream_t stream);

// ---- float64 CPU reference -------------------------------------------------------------------
// Same signatures without the stream and workspace, for CPU tensors of float64/float32/float16/
// bfloat16: products and sums in double, each output rounded once. It is the test oracle and the
// CPU implementation of the PyTorch ops.
namespace ref {
Status diagonal_matmul(const TensorView& a, const TensorView& b, const TensorView& y);
Status diagonal_matmul_backward(const TensorView& dy, const TensorView& a, const TensorView& b, const TensorView* da,
                                const TensorView* db);
}  // namespace ref

}  // namespace kernelforge
