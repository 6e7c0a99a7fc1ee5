"""The graph family: GNN message-passing aggregation (segment reductions, gather_scatter, scatter_add).

The ops (CUDA kernels, the float64 CPU reference, autograd, the CSR construction) live in C++
(`torch/kf_graph.cpp`, which holds the schemas); `_ops` loads the library. Every public function is
one call into the dispatcher; arguments are validated in C++ only.

Semantics (x rows of F features, any trailing shape; float32 math, one rounding per output):

* ``segment_sum / segment_mean / segment_max(x, rowptr)``: x ``[E, ...]`` rows sorted by segment,
  rowptr ``[N + 1]`` (int32/int64 CSR pointers) -> ``[N, ...]``; empty segments give 0 (max too, as
  PyG's ``scatter(reduce="max")``). Max gradients go to the first maximum of each segment.
* ``gather_scatter(x, edge_src, edge_dst, num_nodes, reduce, edge_weight)``:
  ``out[v] = reduce_{e: dst(e) = v} w_e * x[src(e)]``, PyG's message passing with ``x_j`` messages
  (``propagate`` with ``aggr=reduce``), without an ``[E, F]`` message tensor.
* ``scatter_add(src, index, dim_size)``: ``out[index[e]] += src[e]`` along dim 0
  (``torch.zeros(dim_size, ...).index_add_(0, index, src)``, PyG ``scatter(reduce="sum")``).

Deterministic: no float atomics; results are bit-identical run to run. Data-dependent sizes come
only from ``rowptr``'s length, ``num_nodes`` and ``dim_size``, so ``torch.compile(fullgraph=True)``
traces every op without a graph break. Out-of-range indices raise (CPU) or trigger torch's
device-side assertion (CUDA), as ``index_add_`` does.
"""

from __future__ import annotations

import torch

from ._ops import _ops

# ---- fake implementations (shape/dtype propagation for torch.compile, FakeTensor, meta) ----------


def _features(x: torch.Tensor) -> int:
    f = 1
    for s in x.shape[1:]:
        f *= s
    return f


def _arg(x: torch.Tensor, n, reduce: str) -> torch.Tensor:
    return x.new_empty((n if reduce == "max" else 0, _features(x)), dtype=torch.int32)


@torch.library.register_fake("kernelforge::segment_reduce")
def _segment_reduce_fake(x, rowptr, reduce):
    n = rowptr.shape[0] - 1
    return x.new_empty((n, *x.shape[1:])), _arg(x, n, reduce)


@torch.library.register_fake("kernelforge::segment_reduce_backward")
def _segment_reduce_backward_fake(dout, rowptr, reduce, argmax, rows):
    return dout.new_empty((rows, *dout.shape[1:]))


@torch.library.register_fake("kernelforge::gather_scatter")
def _gather_scatter_fake(x, edge_src, edge_dst, num_nodes, reduce, edge_weight):
    torch._check(edge_src.shape == edge_dst.shape,
                 lambda: "gather_scatter: edge_src and edge_dst must have the same length")
    return (x.new_empty((num_nodes, *x.shape[1:])), _arg(x, num_nodes, reduce),
            edge_dst.new_empty((num_nodes + 1,), dtype=torch.int32))


@torch.library.register_fake("kernelforge::gather_scatter_backward")
def _gather_scatter_backward_fake(dout, x, edge_src, edge_dst, rowptr, reduce, edge_weight, argmax, need_x,
                                  need_weight):
    dx = x.new_empty(x.shape) if need_x else x.new_empty((0,))
    dw = edge_weight.new_empty(edge_weight.shape) if need_weight and edge_weight is not None else x.new_empty((0,))
    return dx, dw


@torch.library.register_fake("kernelforge::scatter_add")
def _scatter_add_fake(src, index, dim_size):
    torch._check(src.dim() >= 1 and index.dim() == 1 and index.shape[0] == src.shape[0],
                 lambda: f"scatter_add: index must have one entry per row of src, got {tuple(index.shape)}")
    return src.new_empty((dim_size, *src.shape[1:]))


# ---- functional API ------------------------------------------------------------------------------
_segment_reduce = _ops.segment_reduce.default
_gather_scatter = _ops.gather_scatter.default
_scatter_add = _ops.scatter_add.default


def segment_sum(x: torch.Tensor, rowptr: torch.Tensor) -> torch.Tensor:
    """``out[v] = sum(x[rowptr[v]:rowptr[v+1]])`` (torch_scatter's ``segment_csr(reduce="sum")``)."""
    return _segment_reduce(x, rowptr, "sum")[0]


def segment_mean(x: torch.Tensor, rowptr: torch.Tensor) -> torch.Tensor:
    """``out[v] = mean(x[rowptr[v]:rowptr[v+1]])``; 0 for an empty segment."""
    return _segment_reduce(x, rowptr, "mean")[0]


def segment_max(x: torch.Tensor, rowptr: torch.Tensor) -> torch.Tensor:
    """``out[v] = max(x[rowptr[v]:rowptr[v+1]])`` per feature; 0 for an empty segment. The gradient
    goes to the first row holding the maximum."""
    return _segment_reduce(x, rowptr, "max")[0]


def gather_scatter(x: torch.Tensor, edge_src: torch.Tensor, edge_dst: torch.Tensor, num_nodes: int,
                   reduce: str = "sum", edge_weight: torch.Tensor | None = None) -> torch.Tensor:
    """``out[v] = reduce_{e: edge_dst[e] = v} edge_weight[e] * x[edge_src[e]]`` for v < num_nodes.

    x ``[X, ...]``; edge_src, edge_dst ``[E]`` (int32 or int64, the same dtype; PyG's
    ``edge_index[0]`` and ``edge_index[1]``); edge_weight ``[E]`` in x's dtype or None; reduce
    ``"sum"``, ``"mean"`` or ``"max"``. Differentiable in x and edge_weight.
    """
    return _gather_scatter(x, edge_src, edge_dst, num_nodes, reduce, edge_weight)[0]


def scatter_add(src: torch.Tensor, index: torch.Tensor, dim_size: int) -> torch.Tensor:
    """``out[index[e]] += src[e]`` along dim 0 into ``dim_size`` rows, deterministic (sorted segments,
    no atomics). Differentiable in src."""
    return _scatter_add(src, index, dim_size)
