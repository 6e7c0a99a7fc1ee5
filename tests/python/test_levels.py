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
        # no kernelforge graph aggregation: the GNN's kernelforge level is unavailable, with the reason
        assert rows[("gnn", mode, "kernelforge")]["status"].startswith("unavailable: kf.patch finds nothing")
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


def test_levels_errors(capsys):
    rc, cap = _run(capsys, ["--models", "gnn", "--size", "small", "--device", "cpu", "--iters", "0"])
    assert rc == 2 and "--iters" in cap.err
    for bad in (["--models", "gpt5"], ["--levels", "fastest"], ["--modes", "infer"]):
        with pytest.raises(SystemExit):
            cli.main(["levels", *bad])
