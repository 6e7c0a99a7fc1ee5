"""patch() on PyTorch Geometric GCNConv / SAGEConv / GINConv layers: the aggregation runs as one
gather_scatter, outputs and gradients match the unpatched layer (float64 CPU: to rounding; CUDA
bfloat16 / float32: as accurate as the unpatched layer against a float64 oracle), the report names the
patched layers and the skipped ones with reasons, calls the kernel cannot reproduce fall back announced,
unpatch restores, and kernelforge never imports torch_geometric."""

from __future__ import annotations

import copy
import importlib
import subprocess
import sys
import warnings

import pytest
import torch

pyg = pytest.importorskip("torch_geometric")
from torch_geometric.nn import GATConv, GCNConv, GINConv, SAGEConv  # noqa: E402

PG = importlib.import_module("kernelforge.patch.graph")
RT = importlib.import_module("kernelforge.patch._runtime")

N, F_IN, F_OUT = 13, 6, 5


def graph(device="cpu", seed=0):
    """Random edges among nodes 1..10, a hub (node 0) receiving from almost every node, a duplicated
    edge, and isolated nodes 11 and 12 (no edges at all)."""
    g = torch.Generator().manual_seed(seed)
    src = torch.randint(1, 11, (24,), generator=g)
    dst = torch.randint(1, 11, (24,), generator=g)
    hub_src = torch.arange(1, 11)
    src = torch.cat([src, hub_src, torch.tensor([3, 3])])
    dst = torch.cat([dst, torch.zeros(10, dtype=torch.long), torch.tensor([5, 5])])
    return torch.stack([src, dst]).to(device)


CONVS = {
    "gcn": lambda: GCNConv(F_IN, F_OUT),
    "gcn_weighted": lambda: GCNConv(F_IN, F_OUT),
    "gcn_improved_cached": lambda: GCNConv(F_IN, F_OUT, improved=True, cached=True),
    "gcn_unnormalized": lambda: GCNConv(F_IN, F_OUT, normalize=False, bias=False),
    "gcn_mean_reverse_flow": lambda: GCNConv(F_IN, F_OUT, aggr="mean", flow="target_to_source"),
    "sage_mean": lambda: SAGEConv(F_IN, F_OUT),
    "sage_sum": lambda: SAGEConv(F_IN, F_OUT, aggr="sum"),
    "sage_max": lambda: SAGEConv(F_IN, F_OUT, aggr="max"),
    "sage_project_normalize": lambda: SAGEConv(F_IN, F_OUT, project=True, normalize=True),
    "sage_no_root": lambda: SAGEConv(F_IN, F_OUT, root_weight=False),
    "gin": lambda: GINConv(torch.nn.Sequential(torch.nn.Linear(F_IN, 8), torch.nn.ReLU(), torch.nn.Linear(8, F_OUT)),
                           eps=0.25, train_eps=True),
}
WEIGHTED = {"gcn_weighted", "gcn_unnormalized"}


def run(conv, x, ei, w, calls: int = 1):
    """Forward (``calls`` times: a cached GCN uses its cache the second time), then the backward of a
    fixed random projection of the output; returns the output and the gradients."""
    params = [p for p in conv.parameters()]
    for p in params:
        p.grad = None
    x = x.detach().requires_grad_(True)
    w = w.detach().requires_grad_(True) if w is not None else None
    for _ in range(calls):
        y = conv(x, ei, w) if w is not None else conv(x, ei)
    dy = torch.randn(y.shape, generator=torch.Generator().manual_seed(1), dtype=torch.float64).to(y)
    (y * dy).sum().backward()
    grads = [x.grad] + ([w.grad] if w is not None and w.grad is not None else []) + [p.grad for p in params]
    return y.detach(), grads


def inputs(name, device, dtype):
    g = torch.Generator().manual_seed(2)
    x = torch.randn(N, F_IN, generator=g, dtype=torch.float64).to(device, dtype)
    w = (torch.rand(graph().shape[1], generator=g, dtype=torch.float64) + 0.5).to(device, dtype) \
        if name in WEIGHTED else None
    return x, graph(device), w


def counting(monkeypatch):
    calls = []
    real = PG._graph.gather_scatter
    monkeypatch.setattr(PG._graph, "gather_scatter", lambda *a, **k: calls.append(a[4]) or real(*a, **k))
    return calls


@pytest.mark.parametrize("name", list(CONVS))
def test_conv_float64_cpu_matches_pyg(kf, name, monkeypatch):
    torch.manual_seed(0)
    ref = CONVS[name]().double()
    conv = copy.deepcopy(ref)
    report = kf.patch(conv)
    assert [(m.path, m.op) for m in report.patched] == [("", "gather_scatter")], report.format()
    calls = counting(monkeypatch)
    x, ei, w = inputs(name, "cpu", torch.float64)
    n_calls = 2 if "cached" in name else 1
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no fallback
        y, grads = run(conv, x, ei, w, n_calls)
    want, want_grads = run(ref, x, ei, w, n_calls)
    assert len(calls) == n_calls
    torch.testing.assert_close(y, want, rtol=1e-10, atol=1e-12)
    assert len(grads) == len(want_grads)
    for g, wg in zip(grads, want_grads):
        torch.testing.assert_close(g, wg, rtol=1e-10, atol=1e-12)
    assert y[11:].abs().sum() == want[11:].abs().sum()  # isolated nodes: same (bias / root term only)


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("name", list(CONVS))
def test_conv_cuda_as_accurate_as_pyg(kf, name, dtype, monkeypatch):
    torch.manual_seed(0)
    oracle = CONVS[name]().double()
    ref = copy.deepcopy(oracle).to("cuda", dtype)
    conv = copy.deepcopy(ref)
    assert kf.patch(conv).patched
    calls = counting(monkeypatch)
    x, ei, w = inputs(name, "cuda", dtype)
    n_calls = 2 if "cached" in name else 1
    y, grads = run(conv, x, ei, w, n_calls)
    assert len(calls) == n_calls
    want, want_grads = run(ref, x, ei, w, n_calls)
    o, o_grads = run(oracle, x.cpu().double(), ei.cpu(), w.cpu().double() if w is not None else None, n_calls)
    tol = {torch.float32: 1e-5, torch.bfloat16: 3e-2}[dtype]
    for a, b, t in [(y, want, o)] + list(zip(grads, want_grads, o_grads)):
        assert a.dtype == b.dtype and a.isfinite().all()
        err = rel_err(a, t)
        assert err <= max(tol, 1.5 * rel_err(b, t)), (err, rel_err(b, t))


def rel_err(a, b) -> float:
    a, b = a.detach().cpu().double(), b.detach().cpu().double()
    return ((a - b).norm() / b.norm().clamp_min(1e-30)).item()


class TwoLayer(torch.nn.Module):
    def __init__(self, kind: str):
        super().__init__()
        mk = (lambda i, o: GCNConv(i, o)) if kind == "gcn" else (lambda i, o: SAGEConv(i, o))
        self.conv1, self.conv2 = mk(F_IN, 16), mk(16, F_OUT)

    def forward(self, x, edge_index):
        return self.conv2(torch.relu(self.conv1(x, edge_index)), edge_index)


@pytest.mark.parametrize("device,dtype", [pytest.param("cpu", torch.float64, id="cpu-float64"),
                                          pytest.param("cuda", torch.bfloat16, id="cuda-bfloat16",
                                                       marks=pytest.mark.cuda)])
@pytest.mark.parametrize("kind", ["gcn", "sage"])
def test_two_layer_model(kf, kind, device, dtype):
    torch.manual_seed(0)
    oracle = TwoLayer(kind).double()
    ref = copy.deepcopy(oracle).to(device, dtype)
    model = copy.deepcopy(ref)
    report = kf.patch(model)
    assert report.patched_paths == ["conv1", "conv2"], report.format()
    assert all(m.qualname == f"torch_geometric.{'GCNConv' if kind == 'gcn' else 'SAGEConv'}" for m in report.patched)
    assert "gather_scatter" in report.format()
    x, ei, _ = inputs(kind, device, dtype)

    def fb(m, x, ei):
        for p in m.parameters():
            p.grad = None
        x = x.detach().requires_grad_(True)
        y = m(x, ei)
        y.float().square().mean().backward()
        return [y.detach(), x.grad] + [p.grad for p in m.parameters()]

    got, want = fb(model, x, ei), fb(ref, x, ei)
    if dtype == torch.float64:
        for a, b in zip(got, want):
            torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)
    else:
        truth = fb(oracle, x.cpu().double(), ei.cpu())
        for a, b, t in zip(got, want, truth):
            assert rel_err(a, t) <= max(5e-2, 1.5 * rel_err(b, t))
    assert kf.unpatch(model) == 2
    assert "forward" not in model.conv1.__dict__ and "propagate" not in model.conv1.__dict__


def test_unsupported_configs_are_reported(kf):
    class MyGCN(GCNConv):
        pass

    model = torch.nn.ModuleDict({
        "lstm": SAGEConv(F_IN, F_OUT, aggr="lstm"),
        "multi": SAGEConv(F_IN, F_OUT, aggr=["mean", "max"]),
        "sub": MyGCN(F_IN, F_OUT),
        "gat": GATConv(F_IN, F_OUT),
        "ok": GINConv(torch.nn.Linear(F_IN, F_OUT)),
    })
    report = kf.patch(model)
    assert report.patched_paths == ["ok"]
    reasons = {m.path: m.reason for m in report.skipped}
    assert "LSTMAggregation" in reasons["lstm"] and "sum / mean / max" in reasons["lstm"]
    assert "MultiAggregation" in reasons["multi"]
    assert "subclass of torch_geometric GCNConv" in reasons["sub"]
    assert "without a kernelforge entry" in reasons["gat"]
    assert kf.patch(torch.nn.ModuleDict({"lstm": SAGEConv(F_IN, F_OUT, aggr="lstm")}), graph=False).skipped == []


def test_sparse_adjacency_and_hooks_fall_back_announced(kf, monkeypatch):
    monkeypatch.setattr(RT, "warned", set())
    monkeypatch.delenv("KF_STRICT", raising=False)
    torch.manual_seed(0)
    ref = SAGEConv(F_IN, F_OUT).double()
    conv = copy.deepcopy(ref)
    assert kf.patch(conv).patched
    x, ei, _ = inputs("sage", "cpu", torch.float64)
    adj_t = torch.sparse_coo_tensor(ei.flip(0), torch.ones(ei.shape[1], dtype=torch.float64), (N, N)).coalesce()
    with pytest.warns(UserWarning, match="SparseTensor / sparse / EdgeIndex adjacency"):
        y = conv(x, adj_t)
    torch.testing.assert_close(y, ref(x, adj_t))
    assert "propagate" not in conv.__dict__
    monkeypatch.setenv("KF_STRICT", "1")
    with pytest.raises(RuntimeError, match="KF_STRICT"):
        conv(x, adj_t)
    assert "propagate" not in conv.__dict__  # restored after the error too
    monkeypatch.delenv("KF_STRICT")

    conv.register_propagate_forward_hook(lambda m, inputs, out: out * 2)
    ref.register_propagate_forward_hook(lambda m, inputs, out: out * 2)
    with pytest.warns(UserWarning, match="hooks are registered"):
        y = conv(x, ei)
    torch.testing.assert_close(y, ref(x, ei))


def test_bipartite_sage_and_explicit_size(kf):
    torch.manual_seed(0)
    ref = SAGEConv((F_IN, 4), F_OUT).double()
    conv = copy.deepcopy(ref)
    assert kf.patch(conv).patched
    g = torch.Generator().manual_seed(3)
    x_src = torch.randn(N, F_IN, generator=g, dtype=torch.float64)
    x_dst = torch.randn(7, 4, generator=g, dtype=torch.float64)
    ei = torch.stack([torch.randint(0, N, (30,), generator=g), torch.randint(0, 5, (30,), generator=g)])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        y = conv((x_src, x_dst), ei)
        y2 = conv((x_src, None), ei, size=(N, 7))
    torch.testing.assert_close(y, ref((x_src, x_dst), ei), rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(y2, ref((x_src, None), ei, size=(N, 7)), rtol=1e-10, atol=1e-12)
    assert y.shape == (7, F_OUT) and y2.shape == (7, F_OUT)


def test_kernelforge_never_imports_torch_geometric():
    code = ("import sys, torch\n"
            "import kernelforge as kf\n"
            "r = kf.patch(torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.LayerNorm(2)))\n"
            "assert 'torch_geometric' not in sys.modules, 'imported torch_geometric'\n"
            "sys.modules['torch_geometric'] = None  # absent: importing it would fail\n"
            "r = kf.patch(torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.LayerNorm(2)))\n"
            "assert r.patched_paths == ['1'], r\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
