"""The graph family: segment_sum, segment_mean, segment_max, gather_scatter, scatter_add.

Shapes are GraphShape n{N}e{E}f{F}: N destination nodes, E edges (messages), F features. In-degrees
are power-law (dst = floor(N u^3), u uniform: node 0 receives about E / N^(1/3) edges, 200k on the
1M / 20M graph, and many nodes receive none); sources are uniform over the N nodes. The segment ops
read messages x [E, F] sorted by destination with rowptr [N + 1]; gather_scatter reads node features
x [N, F] and the unsorted edge list; scatter_add reads src [E, F] and the unsorted destinations.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from ._spec import OpSpec, check_out, grads_of, kf, poison, randn


class GraphShape(NamedTuple):
    """N nodes, E edges, F features, written n{N}e{E}f{F}."""

    n: int
    e: int
    f: int

    def __str__(self) -> str:
        return f"n{self.n}e{self.e}f{self.f}"


# ---- graphs --------------------------------------------------------------------------------------


def graph(shape: GraphShape, device, gen: torch.Generator | None = None) -> dict:
    """A power-law edge list (int64): edge_src, edge_dst (random order), and the destination CSR:
    rowptr, perm (the stable order by destination) and seg (the destination of each sorted edge)."""
    n, e = shape.n, shape.e
    u = torch.rand(e, generator=gen, device=device, dtype=torch.float64)
    dst = (u.pow(3) * n).long().clamp_(max=max(n - 1, 0))
    src = torch.randint(0, max(n, 1), (e,), generator=gen, device=device)
    perm = torch.argsort(dst, stable=True)
    seg = dst[perm]
    rowptr = torch.searchsorted(seg, torch.arange(n + 1, device=device))
    return {"edge_src": src, "edge_dst": dst, "rowptr": rowptr, "perm": perm, "seg": seg}


# ---- float64 references --------------------------------------------------------------------------
# torch's scatter_reduce in float64 (include_self=False: empty rows stay 0, as PyG's fill). Its amax
# gradient splits ties evenly; kernelforge routes it to the first maximum (torch_scatter's argmax
# convention), so the max reference takes the value from scatter_reduce and routes the gradient
# through the first maximal message explicitly.

_TORCH_REDUCE = {"sum": "sum", "mean": "mean", "max": "amax"}


def scatter_ref(msg, index, n, reduce):
    """out[v] = reduce_{e: index[e] = v} msg[e] in float64 (msg [E, F]); differentiable in msg."""
    f = msg.shape[1]
    out = msg.new_zeros((n, f))
    if reduce != "max":
        return out.scatter_reduce(0, index[:, None].expand(-1, f), msg, _TORCH_REDUCE[reduce], include_self=False)
    with torch.no_grad():
        top = out.scatter_reduce(0, index[:, None].expand(-1, f), msg, "amax", include_self=False)
        e = torch.arange(msg.shape[0], device=msg.device)[:, None].expand(-1, f)
        cand = torch.where(msg == top[index], e, msg.shape[0])  # ids of maximal messages
        first = torch.full((n, f), msg.shape[0], dtype=torch.long, device=msg.device)
        first = first.scatter_reduce(0, index[:, None].expand(-1, f), cand, "amin", include_self=True)
        chosen = (first[index] == e).to(msg.dtype)  # 1 where message e is its segment's first maximum
    return out.index_add(0, index, msg * chosen)


def _rows(x):
    """x [rows, ...] as [rows, F] (F = the product of the trailing sizes; also for 0 rows)."""
    f = 1
    for s in x.shape[1:]:
        f *= s
    return x.reshape(x.shape[0], f)


def gather_scatter_ref(x, src, dst, n, reduce, w=None):
    """PyG message passing: out[v] = reduce_{e: dst(e) = v} w_e * x[src(e)], float64."""
    x2 = _rows(x)
    msg = x2.index_select(0, src)
    if w is not None:
        msg = msg * w[:, None]
    return scatter_ref(msg, dst, n, reduce).reshape(n, *x.shape[1:])


def segment_ref(x, rowptr, reduce):
    n = rowptr.numel() - 1
    seg = torch.repeat_interleave(torch.arange(n, device=x.device), rowptr.diff())
    return scatter_ref(_rows(x), seg, n, reduce).reshape(n, *x.shape[1:])


# ---- traffic and arithmetic -----------------------------------------------------------------------
# The minimum: every message row read once (E F), the output written once (N F); the backward reads
# dout once per message (E F, most from L2 for the segment ops) and writes the input gradient (E F for
# the segment ops and scatter_add, N F for gather_scatter). Indices are not counted.


def row_bytes(op):
    def count(shape, mode, elt):
        n, e, f = shape
        fwd = (e + n) * f * elt
        if mode == "fwd":
            return fwd
        dx_rows = n if op == "gather_scatter" else e
        return fwd + (e + dx_rows) * f * elt
    return count


def flops(shape, mode):
    n, e, f = shape
    return (1 if mode == "fwd" else 2) * e * f


# ---- bench ----------------------------------------------------------------------------------------
SEGMENT_OPS = ("segment_sum", "segment_mean", "segment_max")
REDUCE = {"segment_sum": "sum", "segment_mean": "mean", "segment_max": "max", "gather_scatter": "sum",
          "scatter_add": "sum"}


def _inputs(op):
    def inputs(shape, dtype, device, gen):
        g = graph(shape, device, gen)
        t = {k: g[k] for k in ("edge_src", "edge_dst", "rowptr", "seg")}
        if op == "gather_scatter":
            t["x"] = randn(gen, device, dtype, shape.n, shape.f)
        else:  # segment ops: messages sorted by destination; scatter_add: unsorted messages
            t["x"] = randn(gen, device, dtype, shape.e, shape.f)
        t["dy"] = randn(gen, device, dtype, shape.n, shape.f)
        return t
    return inputs


def _kf_run(op):
    def run(t):
        k = kf()
        if op in SEGMENT_OPS:
            return (getattr(k, op)(t["x"], t["rowptr"]),)
        if op == "gather_scatter":
            return (k.gather_scatter(t["x"], t["edge_src"], t["edge_dst"], t["dy"].shape[0], "sum"),)
        return (k.scatter_add(t["x"], t["edge_dst"], t["dy"].shape[0]),)
    return run


def _eager(op):
    """PyG's default aggregation (torch_geometric.utils.scatter on the gathered messages x_j): index_add_ /
    scatter_reduce with atomics. torch_geometric itself is used when importable."""
    reduce = REDUCE[op]

    def pyg_or_torch(msg, index, n):
        try:
            from torch_geometric.utils import scatter  # noqa: PLC0415
        except Exception:  # noqa: BLE001
            scatter = None
        if scatter is not None:
            return scatter(msg, index, dim=0, dim_size=n, reduce=reduce)
        if reduce == "sum":
            return msg.new_zeros((n, msg.shape[1])).index_add_(0, index, msg)
        return msg.new_zeros((n, msg.shape[1])).scatter_reduce_(
            0, index[:, None].expand(-1, msg.shape[1]), msg, _TORCH_REDUCE[reduce], include_self=False)

    def run(t):
        n = t["dy"].shape[0]
        if op in SEGMENT_OPS:
            return (pyg_or_torch(t["x"], t["seg"], n),)
        if op == "gather_scatter":  # message passing: x_j = x[src], then the scatter
            return (pyg_or_torch(t["x"].index_select(0, t["edge_src"]), t["edge_dst"], n),)
        return (pyg_or_torch(t["x"], t["edge_dst"], n),)
    return lambda: run


def _torch_native(op):
    """torch.segment_reduce (CSR offsets) for segment_sum. Its empty segments are NaN (mean) or -inf
    (max), and its `initial` value takes part in the reduction, so it is no peer of the other two."""
    if op != "segment_sum":
        return None
    return lambda: (lambda t: (torch.segment_reduce(t["x"], "sum", offsets=t["rowptr"], axis=0, unsafe=True),))


def _sparse_mm(op):
    """cuSPARSE SpMM: the adjacency as a sparse CSR matrix times x (sum only). The matrix is built on
    every call from the sorted edges (the CSR build is part of the op, as it is of kernelforge's)."""
    def factory():
        def run(t):
            x = t["x"]
            n = t["dy"].shape[0]
            if op == "gather_scatter":
                perm = torch.argsort(t["edge_dst"], stable=True)
                col = t["edge_src"][perm]
                ncols = x.shape[0]
            else:  # segment_sum: row v of A holds ones at its message rows
                col = torch.arange(x.shape[0], device=x.device)
                ncols = x.shape[0]
            vals = torch.ones(col.numel(), dtype=x.dtype, device=x.device)
            a = torch.sparse_csr_tensor(t["rowptr"], col, vals, (n, ncols))
            return (torch.sparse.mm(a, x),)
        return run
    return factory if op in ("segment_sum", "gather_scatter") else None


# The 1M-node / 20M-edge / 128-feature power-law graph of the performance target, and a quick one.
SHAPES = (GraphShape(1_000_000, 20_000_000, 128), GraphShape(100_000, 1_000_000, 64))

# ---- kforge check ---------------------------------------------------------------------------------
# One node / one edge, odd feature widths (no 16-byte vectors), a graph whose node 0 takes ~30% of
# 3001 edges (segments over many tiles), no edges at all, F = 1 and F = 1024, a wide bf16 row (128).
CHECK_SHAPES = (GraphShape(1, 1, 1), GraphShape(7, 40, 7), GraphShape(50, 3001, 33), GraphShape(3, 0, 8),
                GraphShape(17, 300, 1024), GraphShape(64, 5000, 128), GraphShape(5, 1000, 1))
VARIANTS = {
    "segment_sum": ({},), "segment_mean": ({},), "segment_max": ({},),
    "gather_scatter": tuple({"reduce": r, "weight": w} for r in ("sum", "mean", "max") for w in (False, True)),
    "scatter_add": ({},),
}


def _check_inputs(op):
    def inputs(shape, v, dtype, device):
        g = graph(shape, device)
        t = {"edge_src": g["edge_src"], "edge_dst": g["edge_dst"], "rowptr": g["rowptr"]}
        rows = shape.n if op == "gather_scatter" else shape.e
        t["x"] = randn(None, device, dtype, rows, shape.f)
        if v.get("weight"):  # magnitudes 0.5 / 1 / 2 with a random sign: exact products, exact maxima
            mag = torch.pow(2.0, torch.randint(-1, 2, (shape.e,), device=device).float())
            sign = torch.where(torch.rand(shape.e, device=device) < 0.5, -1.0, 1.0)
            t["edge_weight"] = (mag * sign).to(dtype)
        t["dy"] = randn(None, device, dtype, shape.n, shape.f)
        return t
    return inputs


def _leaf_names(op, v):
    return ["x", "edge_weight"] if v.get("weight") else ["x"]


def _call(kfm, op, t, v):
    n = t["dy"].shape[0]
    if op in SEGMENT_OPS:
        return getattr(kfm, op)(t["x"], t["rowptr"])
    if op == "gather_scatter":
        return kfm.gather_scatter(t["x"], t["edge_src"], t["edge_dst"], n, v["reduce"], t.get("edge_weight"))
    return kfm.scatter_add(t["x"], t["edge_dst"], n)


def _check_run(op):
    def run(kfm, t, v):
        names = _leaf_names(op, v)
        leaves = {k: t[k].detach().clone().requires_grad_(True) for k in names}
        dy = t["dy"]
        poison([dy.shape] + [leaves[k].shape for k in names], dy.dtype, dy.device)
        y = _call(kfm, op, {**t, **leaves}, v)
        check_out("y", y, dy.shape, dy.dtype)
        return {"y": y.detach(), **grads_of([y], [dy], leaves, names, t)}
    return run


def _cpp_reference(op):
    """The ops' CPU path (the C++ float64 reference), with autograd (its backward ops on CPU)."""
    def ref(a, v):
        return _check_run(op)(kf(), a, v)
    return ref


def _reference(op):
    def ref(a, v):
        names = _leaf_names(op, v)
        for k in names:
            a[k].requires_grad_(True)
        n = a["dy"].shape[0]
        if op in SEGMENT_OPS:
            y = segment_ref(a["x"], a["rowptr"], REDUCE[op])
        elif op == "gather_scatter":
            y = gather_scatter_ref(a["x"], a["edge_src"], a["edge_dst"], n, v["reduce"], a.get("edge_weight"))
        else:
            y = scatter_ref(a["x"], a["edge_dst"], n, "sum")
        grads = torch.autograd.grad([y], [a[k] for k in names], [a["dy"]])
        return {"y": y.detach(), **{"d" + k: g for k, g in zip(names, grads)}}
    return ref


def _spec(op: str) -> OpSpec:
    extra_peers = {}
    sp = _sparse_mm(op)
    if sp is not None:
        extra_peers["torch_sparse_mm"] = sp
    providers = (("kernelforge", "eager", "compile") + (("torch_native",) if op == "segment_sum" else ())
                 + tuple(extra_peers))
    return OpSpec(
        name=op, family="graph", shape_kind="graph",
        inputs=_inputs(op), run=_kf_run(op), grad_inputs=("x",),
        row_bytes=row_bytes(op), flops=flops, shapes=SHAPES,
        eager=_eager(op), torch_native=_torch_native(op), providers=providers, extra_peers=extra_peers,
        check_shapes=CHECK_SHAPES, variants=VARIANTS[op], check_inputs=_check_inputs(op),
        check_run=_check_run(op), cpp_reference=_cpp_reference(op), reference=_reference(op),
        extra={"reduce": REDUCE[op]},
    )


SPECS = tuple(_spec(op) for op in ("segment_sum", "segment_mean", "segment_max", "gather_scatter", "scatter_add"))
