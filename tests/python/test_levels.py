"""`kforge levels`: small models at several optimization levels on the CPU (and CUDA where there is
one): the table, the CSV, the charts, unavailable levels reported with the reason, argument errors."""

from __future__ import annotations

import csv

import pytest
import torch

from kernelforge import cli
from kernelforge import levels as L


def _run(capsys, argv):
    rc = cli.main(["levels", *argv])
    return rc, capsys.readouterr()


def _rows(path) -> list[dict]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def _has_pyg() -> bool:
    try:
        import torch_geometric  # noqa: F401, PLC0415
    except ImportError:
        return False
    return True


def test_levels_cpu(capsys, tmp_path):
    pytest.importorskip("transformers")
    rc, cap = _run(capsys, ["--models", "lm,gnn", "--size", "small", "--device", "cpu", "--levels",
                            "eager,torchscript,triton,kernelforge", "--iters", "1", "--warmup", "1",
                            "--out", str(tmp_path)])
    assert rc == 0, cap.err
    rows = {(r["model"], r["mode"], r["level"]): r for r in _rows(tmp_path / "levels.csv")}
    assert len(rows) == 2 * 2 * 4
    for mode in ("fwd", "train"):
        eager = rows[("lm", mode, "eager")]
        assert eager["status"] == "ok" and float(eager["speedup_vs_eager"]) == 1.0
        kf = rows[("lm", mode, "kernelforge")]
        assert kf["status"] == "ok", kf
        assert float(kf["ms"]) > 0 and float(kf["rel_err_vs_fp32"]) < 1e-4  # float32: the float64 reference ops
        # the GNN: PyG's SAGEConv patched to gather_scatter where torch_geometric is installed, else a
        # hand-written layer whose kernelforge level is unavailable, with the reason
        gnn = rows[("gnn", mode, "kernelforge")]
        if _has_pyg():
            assert gnn["status"] == "ok", gnn
            assert float(gnn["rel_err_vs_fp32"]) < 1e-4
        else:
            assert gnn["status"].startswith("unavailable: kf.patch finds nothing") and "torch_geometric" in gnn["status"]
        assert rows[("gnn", mode, "eager")]["status"] == "ok"
    assert rows[("lm", "fwd", "triton")]["status"].startswith(("unavailable", "ok"))
    assert "kernelforge" in cap.out and "unavailable" in cap.out
    pytest.importorskip("matplotlib")
    assert (tmp_path / "levels_lm.png").stat().st_size > 0 and (tmp_path / "levels_gnn.png").stat().st_size > 0


def test_triton_level_leaves_transformers_as_it_was():
    """Liger rebinds transformers' modeling globals; the level puts them back, so later levels (and
    models) in the process run without Liger."""
    import sys  # noqa: PLC0415
    import types  # noqa: PLC0415

    mod = types.ModuleType("transformers._kf_levels_probe")
    mod.f = original = object()
    sys.modules[mod.__name__] = mod
    try:
        with L._module_globals_restored("transformers"):
            mod.f = object()
        assert mod.f is original
        with pytest.raises(RuntimeError), L._module_globals_restored("transformers"):
            mod.f = object()
            raise RuntimeError
        assert mod.f is original
    finally:
        del sys.modules[mod.__name__]


@pytest.mark.cuda
def test_triton_level_then_kernelforge_level(tmp_path, capsys):
    """With Liger installed, the triton level runs Liger and the kernelforge level after it runs without."""
    pytest.importorskip("liger_kernel")
    modeling_llama = pytest.importorskip("transformers.models.llama.modeling_llama")
    before = dict(vars(modeling_llama))
    rc, cap = _run(capsys, ["--models", "lm", "--size", "small", "--device", "cuda", "--levels",
                            "eager,triton,kernelforge", "--modes", "fwd", "--iters", "1", "--warmup", "1",
                            "--out", str(tmp_path)])
    assert rc == 0, cap.err
    assert all(vars(modeling_llama)[k] is v for k, v in before.items())
    assert all(r["status"] == "ok" for r in _rows(tmp_path / "levels.csv")), cap.out


@pytest.mark.cuda
def test_levels_cuda(capsys, tmp_path):
    pytest.importorskip("transformers")
    rc, cap = _run(capsys, ["--models", "lm,vit", "--size", "small", "--device", "cuda", "--levels",
                            "eager,kernelforge", "--iters", "2", "--warmup", "1", "--out", str(tmp_path)])
    assert rc == 0, cap.err
    for r in _rows(tmp_path / "levels.csv"):
        assert r["status"] == "ok", r
        assert float(r["peak_mib"]) > 0
        assert float(r["rel_err_vs_fp32"]) < 5e-2  # bfloat16 against the float32 run of the same weights


def test_traced_level_runs_the_model(tmp_path):
    """torchscript: the traced module computes what the model does."""
    model = L.MODELS["gnn"]("small", "cpu", torch.float32)
    fn = L.apply_level("torchscript", model)
    with torch.no_grad():
        assert torch.allclose(fn(*model.inputs), model.forward(model.module, *model.inputs))


def test_gnn_model_pyg_and_hand_written_agree():
    """The PyG GraphSAGE and the index_add_ one compute the same function of the same weights."""
    from kernelforge import models as M  # noqa: PLC0415

    pytest.importorskip("torch_geometric")
    model = M.MODELS["gnn"]("small", "cpu", torch.float64)  # the GNN is float32 whatever is asked
    assert isinstance(model.module, M._PygGnn)
    x, edge_index = model.inputs
    src, dst = edge_index
    assert x.dtype == torch.float32
    hand = M._Gnn(x.shape[1], 3)
    for mine, conv in zip(hand.layers, model.module.layers):
        mine.lin_self.weight.data.copy_(conv.lin_r.weight)
        mine.lin_self.bias.data.copy_(conv.lin_l.bias)
        mine.lin_neigh.weight.data.copy_(conv.lin_l.weight)
    inv_deg = 1.0 / torch.bincount(dst, minlength=x.shape[0]).clamp_min(1).float().unsqueeze(1)
    torch.testing.assert_close(hand(x, src, dst, inv_deg), model.forward(model.module, *model.inputs), rtol=1e-4,
                               atol=1e-5)


@pytest.mark.cuda
def test_levels_gnn_cuda(capsys, tmp_path):
    """On the GPU, the GNN's kernelforge level runs PyG's SAGEConv through gather_scatter."""
    pytest.importorskip("torch_geometric")
    rc, cap = _run(capsys, ["--models", "gnn", "--size", "small", "--device", "cuda", "--levels",
                            "eager,kernelforge", "--iters", "2", "--warmup", "1", "--out", str(tmp_path)])
    assert rc == 0, cap.err
    rows = {(r["mode"], r["level"]): r for r in _rows(tmp_path / "levels.csv")}
    assert all(r["status"] == "ok" for r in rows.values()), rows
    for mode in ("fwd", "train"):  # the GNN runs float32 features (models.py says why)
        assert float(rows[(mode, "kernelforge")]["rel_err_vs_fp32"]) < 1e-4, rows


def test_levels_errors(capsys):
    rc, cap = _run(capsys, ["--models", "gnn", "--size", "small", "--device", "cpu", "--iters", "0"])
    assert rc == 2 and "--iters" in cap.err
    for bad in (["--models", "gpt5"], ["--levels", "fastest"], ["--modes", "infer"]):
        with pytest.raises(SystemExit):
            cli.main(["levels", *bad])
