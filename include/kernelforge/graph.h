// kernelforge graph family: GNN message-passing aggregation over CSR segments, forward and backward.
//
// One primitive carries every forward op: a CSR gather-reduce. Segments v = 0..N-1 own the positions
// k in [rowptr[v], rowptr[v+1]) (rowptr int32 or int64, non-decreasing, rowptr[0] = 0, rowptr[N] =
// nnz); position k reads row col(k) of x [X, F] (col absent: row k) scaled by the edge weight
// w[eid(k)] (eid absent: k; weight absent: 1):
//
//   sum   out[v, f] = T(sum_k w * x[col(k), f])
//   mean  out[v, f] = T(sum_k w * x[col(k), f] / deg(v))         deg(v) = rowptr[v+1] - rowptr[v]
//   max   out[v, f] = T(max_k w * x[col(k), f]),  argmax[v, f] = eid(k) of the first maximum
//   empty segments: out = 0 (max too, as PyG's scatter(reduce="max")), argmax = -1
//
// Users: segment_sum / segment_mean / segment_max (x rows sorted by segment, no col), gather_scatter
// (edges sorted by destination: col = source node, eid = original edge id) and scatter_add.
//
// Deterministic: every output element is a float32 accumulation in a fixed order (no atomics), so
// results are bit-identical run to run. Load-balanced: positions are cut into fixed-size tiles
// (one block row per tile, whatever the segment lengths); a segment inside one tile is finished by
// it, a longer one leaves one float32 partial per tile in the workspace, combined in tile order by a
// second kernel. Math in float32, every output rounded once to T (float32/float16/bfloat16; bfloat16
// needs sm_80+). Every function launches on `stream`, never synchronizes and never allocates.
//
// Index checks: the CUDA path does not read index values on the host (no synchronization). A col
// value outside [0, X) reads nothing and makes its segment's output NaN (never a silent wrong
// value); rowptr must hold the invariants above (gather_scatter builds it itself). The float64 CPU
// reference checks every index and rowptr and returns an error naming the first bad one.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "kernelforge/status.h"
#include "kernelforge/tensor.h"

namespace kernelforge {

enum class GraphReduce : int { kSum = 0, kMean = 1, kMax = 2 };

// A CSR gather-reduce call. x, out: [rows, F] with a row stride and a contiguous last dimension;
// index tensors: contiguous 1-D, all of one dtype (int32 or int64); weight: 1-D, x's dtype.
struct GatherReduceArgs {
  const char* name = "gather_reduce";  // the op named in error messages
  const TensorView* x = nullptr;       // [X, F]
  const TensorView* rowptr = nullptr;  // [N + 1]
  const TensorView* col = nullptr;     // [nnz] or absent (x has nnz rows, read in order)
  const TensorView* eid = nullptr;     // [nnz] or absent (eid(k) = k)
  const TensorView* weight = nullptr;  // [E] (E > every eid) or absent
  GraphReduce reduce = GraphReduce::kSum;
  // Backward terms (a gather-reduce over the transposed CSR: x = the output gradient, col = the
  // forward's destination of each edge); each factor is looked up by the gathered row c = col(k):
  const TensorView* scale_rowptr = nullptr;  // mean backward: term / deg(c), deg from this [X + 1] CSR
  const TensorView* mask_arg = nullptr;      // max backward: int32 [X, F]; term kept where mask_arg[c, f] == eid(k)
  const TensorView* out = nullptr;           // [N, F]
  const TensorView* argmax = nullptr;        // max: int32 [N, F] (contiguous); otherwise absent
};

// Workspace bytes a gather_reduce call needs (the per-tile partials of segments longer than a tile).
size_t gather_reduce_workspace_bytes(int64_t nnz, int64_t features, GraphReduce reduce);
Status gather_reduce(const GatherReduceArgs& a, void* workspace, size_t workspace_bytes, cudaStream_t stream);

// Backward of a segment reduction over rows of x (no col / eid): for every row e of segment v
//   sum dx[e, f] = dout[v, f];  mean dout[v, f] / deg(v);  max dout[v, f] if argmax[v, f] == e, else 0.
// dout [N, F], dx [nnz, F], argmax int32 [N, F] (max only).
Status segment_reduce_backward(const char* name, const TensorView& dout, const TensorView& rowptr, GraphReduce reduce,
                               const TensorView* argmax, const TensorView& dx, cudaStream_t stream);

// Edge-weight gradient of gather_scatter: for every edge e (original order) from src[e] to dst[e]
//   dw[e] = T(sum_f x[src[e], f] * dout[dst[e], f] * m(e, f)),
// m = 1 (sum), 1 / deg(dst[e]) (mean, deg from rowptr [N + 1]), [argmax[dst[e], f] == e] (max).
Status edge_weight_grad(const char* name, const TensorView& dout, const TensorView& x, const TensorView& src,
                        const TensorView& dst, const TensorView& rowptr, GraphReduce reduce, const TensorView* argmax,
                        const TensorView& dw, cudaStream_t stream);

// ---- float64 CPU reference -------------------------------------------------------------------
// The same contracts for CPU tensors (float64 too), computed in double with every output rounded
// once; indices and rowptr are checked. The test oracle and the CPU implementation of the torch ops.
namespace ref {
Status gather_reduce(const GatherReduceArgs& a);
Status segment_reduce_backward(const char* name, const TensorView& dout, const TensorView& rowptr, GraphReduce reduce,
                               const TensorView* argmax, const TensorView& dx);
Status edge_weight_grad(const char* name, const TensorView& dout, const TensorView& x, const TensorView& src,
                        const TensorView& dst, const TensorView& rowptr, GraphReduce reduce, const TensorView* argmax,
                        const TensorView& dw);
}  // namespace ref

}  // namespace kernelforge
