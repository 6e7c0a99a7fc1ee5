"""The graph entries of the patch table (family "graph"): PyTorch Geometric message passing through
``gather_scatter``; see __init__.py for the machinery.

Patched (these exact classes; subclasses are skipped, their message or aggregation may differ):

- ``torch_geometric.nn.GCNConv``, ``SAGEConv``, ``GINConv`` whose aggregation module is PyG's
  ``SumAggregation`` / ``MeanAggregation`` / ``MaxAggregation`` (``aggr="add" | "sum" | "mean" | "max"``)
  -> ``gather_scatter``

Only the aggregation is replaced. The layer's own forward runs as PyG wrote it (GCN's ``gcn_norm``:
self loops, ``improved``, the symmetric normalization and the cache; SAGE's ``project``, ``lin_l`` /
``lin_r``, root weight and ``normalize``; GIN's ``(1 + eps) * x`` and its ``nn``); while it runs, the
instance's ``propagate`` is the one below, which computes in one kernel what PyG's ``propagate`` computes
with the ``x_j`` messages of these layers (``x_j``, or ``edge_weight * x_j`` for GCN) and an identity
update:

    out[v] = reduce_{e: edge_index[i, e] = v} w_e * x_src[edge_index[j, e]]     (i, j) = (1, 0) for
    flow="source_to_target", (0, 1) for "target_to_source"; v < size_i (PyG's dim_size)

without the ``[E, F]`` message tensor. Calls it cannot reproduce run PyG's ``propagate``, announced
(``KF_STRICT=1``: an error): a ``SparseTensor`` / ``torch.sparse`` / ``EdgeIndex`` adjacency, node
features that are not ``[N, F]`` rows, propagate / message / aggregate hooks, explain mode,
``decomposed_layers > 1``.

torch_geometric stays optional: nothing here imports it. The matchers look its classes up in
``sys.modules``; a model holding a PyG layer has loaded them, a model without one never needs them.
"""

from __future__ import annotations

import sys
import types

import torch

from .. import graph as _graph
from ._match import hooked
from ._registry import Replacement, register_replacement, register_unsupported
from ._runtime import announce_fallback, original, warn_fallback

# class -> (its module, the propagate keyword arguments its forward passes)
_CONVS = {
    "GCNConv": ("torch_geometric.nn.conv.gcn_conv", frozenset({"x", "edge_weight"})),
    "SAGEConv": ("torch_geometric.nn.conv.sage_conv", frozenset({"x"})),
    "GINConv": ("torch_geometric.nn.conv.gin_conv", frozenset({"x"})),
}
_REDUCE = {"SumAggregation": "sum", "MeanAggregation": "mean", "MaxAggregation": "max"}
_AGGR_MODULE = "torch_geometric.nn.aggr.basic"
_MP_MODULE = "torch_geometric.nn.conv.message_passing"
_HOOKS = ("_propagate_forward_pre_hooks", "_propagate_forward_hooks", "_message_forward_pre_hooks",
          "_message_forward_hooks", "_aggregate_forward_pre_hooks", "_aggregate_forward_hooks",
          "_message_and_aggregate_forward_pre_hooks", "_message_and_aggregate_forward_hooks")
_FLOATS = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
_HINT = "Pass edge_index as a [2, E] int32/int64 tensor and [N, F] node features to use the kernel."


def _pyg_class(module_name: str, cls_name: str):
    mod = sys.modules.get(module_name)  # never imports: loaded iff some model uses it
    return getattr(mod, cls_name, None) if mod is not None else None


def _conv_of(m: torch.nn.Module) -> "tuple[str, type] | None":
    """(name, PyG class) of the conv m is an instance of, or None."""
    for name, (mod, _) in _CONVS.items():
        cls = _pyg_class(mod, name)
        if cls is not None and isinstance(m, cls):
            return name, cls
    return None


def _reduce_of(m: torch.nn.Module) -> "str | None":
    """gather_scatter's reduce for the layer's aggregation module, or None."""
    aggr = getattr(m, "aggr_module", None)
    for name, reduce in _REDUCE.items():
        cls = _pyg_class(_AGGR_MODULE, name)
        if cls is not None and type(aggr) is cls:
            return reduce
    return None


def _state_reason(m: torch.nn.Module) -> "str | None":
    """Why the layer's current configuration is not one gather_scatter reproduces (None: it is)."""
    if _reduce_of(m) is None:
        return (f"aggregation {type(getattr(m, 'aggr_module', None)).__name__} (aggr={getattr(m, 'aggr', None)!r}) "
                "is not PyG's sum / mean / max aggregation")
    if getattr(m, "node_dim", None) not in (0, -2):
        return f"node_dim={m.node_dim} (gather_scatter aggregates rows of [N, F] features)"
    if getattr(m, "flow", None) not in ("source_to_target", "target_to_source"):
        return f"flow={getattr(m, 'flow', None)!r}"
    if getattr(m, "explain", None):
        return "explain mode is on"
    if getattr(m, "decomposed_layers", 1) != 1:
        return f"decomposed_layers={m.decomposed_layers}"
    if "propagate" in m.__dict__:
        return "propagate is overridden on this instance"
    if any(getattr(m, h, None) for h in _HOOKS) or hooked(m.aggr_module):
        return "propagate / message / aggregate hooks are registered"
    return None


def _match_pyg_conv(m: torch.nn.Module):
    found = _conv_of(m)
    if found is None:
        return None
    name, cls = found
    if type(m) is not cls:
        return f"subclass of torch_geometric {name}: its message or aggregation may differ"
    return _state_reason(m) or True


def _pyg_conv_forward(self, *args, **kwargs):
    why = _state_reason(self)
    if why is not None:
        warn_fallback(self, why, hint="The layer's PyG forward runs unchanged.")
        return original(self)(*args, **kwargs)
    self.__dict__["propagate"] = types.MethodType(_propagate, self)
    try:
        return original(self)(*args, **kwargs)
    finally:
        self.__dict__.pop("propagate", None)


# ---- the propagate installed while a patched forward runs --------------------------------------------


def _propagate_reason(self, edge_index, kwargs: dict) -> "str | None":
    expected = _CONVS[type(self).__name__][1]
    if set(kwargs) != expected:
        return f"propagate arguments {sorted(kwargs)} (expected {sorted(expected)})"
    if type(edge_index) is not torch.Tensor or edge_index.layout != torch.strided:
        return f"an edge_index of type {type(edge_index).__name__} (SparseTensor / sparse / EdgeIndex adjacency)"
    if edge_index.dim() != 2 or edge_index.shape[0] != 2:
        return f"an edge_index of shape {list(edge_index.shape)}"
    if edge_index.dtype not in (torch.int32, torch.int64):
        return f"an edge_index of dtype {edge_index.dtype}"
    x = kwargs["x"]
    xs = list(x) if isinstance(x, (tuple, list)) else [x]
    if len(xs) not in (1, 2) or not isinstance(xs[0], torch.Tensor) \
            or any(t is not None and not isinstance(t, torch.Tensor) for t in xs):
        return "node features that are not a tensor or a pair of tensors"
    for t in xs:
        if t is not None and (t.dim() != 2 or t.dtype not in _FLOATS or t.device != edge_index.device):
            return f"node features of shape {list(t.shape)}, {t.dtype} on {t.device} (edge_index on {edge_index.device})"
    w = kwargs.get("edge_weight")
    if w is not None and (not isinstance(w, torch.Tensor) or w.dim() != 1 or w.shape[0] != edge_index.shape[1]
                          or w.dtype not in _FLOATS or w.device != edge_index.device):
        return "an edge_weight that is not one float per edge on edge_index's device"
    return None


def _size(given, k: int, t: "torch.Tensor | None") -> "int | None":
    """PyG's _set_size: the given size, else the tensor's rows; None when they disagree."""
    g = given[k] if given is not None else None
    if t is None:
        return g if g is not None else -1
    return t.shape[0] if g is None or g == t.shape[0] else None


def _propagate(self, edge_index, size=None, **kwargs):
    why = _propagate_reason(self, edge_index, kwargs)
    cls_propagate = type(self).propagate
    if why is not None:
        announce_fallback(type(self).__name__, why, "propagate", _HINT, stacklevel=4)
        return cls_propagate(self, edge_index, size=size, **kwargs)
    i, j = (1, 0) if self.flow == "source_to_target" else (0, 1)
    x = kwargs["x"]
    x_src, x_dst = (x[j], x[i]) if isinstance(x, (tuple, list)) else (x, None)
    size_j, size_i = _size(size, j, x_src), _size(size, i, x_dst)
    if size_j is None or size_i is None:  # inconsistent sizes: PyG's propagate raises its error
        return cls_propagate(self, edge_index, size=size, **kwargs)
    num_nodes = size_i if size_i >= 0 else size_j
    w = kwargs.get("edge_weight")
    if w is not None and w.dtype != x_src.dtype:  # PyG's message w * x_j computes in the promoted dtype
        dtype = torch.promote_types(w.dtype, x_src.dtype)
        x_src, w = x_src.to(dtype), w.to(dtype)
    x_src = x_src if x_src.stride(-1) == 1 or x_src.shape[-1] <= 1 else x_src.contiguous()
    return _graph.gather_scatter(x_src, edge_index[j], edge_index[i], num_nodes, _reduce_of(self), w)


def _unsupported_pyg(m: torch.nn.Module) -> "str | None":
    mp = _pyg_class(_MP_MODULE, "MessagePassing")
    if mp is None or not isinstance(m, mp):
        return None
    return f"PyG message-passing layer without a kernelforge entry (patched: {', '.join(_CONVS)})"


register_replacement(Replacement("pyg_conv", "gather_scatter", _match_pyg_conv, _pyg_conv_forward, "graph"))
register_unsupported("graph", _unsupported_pyg)
