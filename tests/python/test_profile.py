"""`kforge profile`: a small model's step profiled before and after kf.patch (CPU: operator self
times; CUDA: kernel times), the family table, Chrome traces, argument errors."""

from __future__ import annotations

import csv
import importlib.util
import json

import pytest
import torch

from kernelforge import cli
from kernelforge import profile as P


def test_family_of():
    assert P.family_of("void kernelforge::attention_fwd_wgmma<__nv_bfloat16, 128, 128, 128>(...)") == "attention"
    assert P.family_of("kernelforge::rms_norm_backward") == "norm"
    assert P.family_of("kernelforge::fused_linear_cross_entropy") == "loss"
    assert P.family_of("void kernelforge::ce_fwd_partial<float>(...)") == "loss"
    assert P.family_of("kernelforge::swiglu") == "activation"
    # the kernels' own names, as the profiler shows them
    assert P.family_of("void kernelforge::norm_detail::norm_fwd_row<__nv_bfloat16, 8>(...)") == "norm"
    assert P.family_of("void kernelforge::norm_detail::reduce_columns<float>(...)") == "norm"
    assert P.family_of("void kernelforge::act_detail::act_bwd<__nv_bfloat16>(...)") == "activation"
    assert P.family_of("void kernelforge::kv_append_kernel<__half>(...)") == "attention"
    assert P.family_of("void kernelforge::skinny::linear_skinny_kernel<__nv_bfloat16>(...)") == "matmul"
    assert P.family_of("nvjet_tst_128x256_64x4_1x2_h_bz_coopA_TNN") == "matmul"
    assert P.family_of("aten::addmm") == "matmul"
    assert P.family_of("cudnn_generated_fort_native_sdpa_sm90_knob_7_64x128x128") == "attention"
    assert P.family_of("triton_poi_fused_add_mul_0") == "triton"
    assert P.family_of("void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<float>>") == \
        "elementwise"
    assert P.family_of("Memcpy DtoD (Device -> Device)") == "memory"
    assert P.family_of("some_unknown_kernel") == "other"


def _run(capsys, argv):
    rc = cli.main(["profile", *argv])
    return rc, capsys.readouterr()


def _table(out: str) -> dict[str, tuple[float, float]]:
    """family -> (unpatched ms, patched ms) from the printed table."""
    rows = {}
    for line in out.splitlines():
        parts = line.split()
        if len(parts) >= 5 and parts[0] in {f for f, _ in P.FAMILIES} | {"other", "total"}:
            rows[parts[0]] = (float(parts[1]), float(parts[3] if parts[0] != "total" else parts[2]))
    return rows


@pytest.mark.parametrize("model", ["llama_train", "vit", "ltx"])
def test_profile_cpu(capsys, tmp_path, model):
    pytest.importorskip("diffusers" if model == "ltx" else "transformers")
    rc, cap = _run(capsys, ["--model", model, "--size", "small", "--device", "cpu", "--steps", "1",
                            "--trace", str(tmp_path), "--out", str(tmp_path)])
    assert rc == 0, cap.err
    rows = _table(cap.out)
    assert "total" in rows and rows["total"][0] > 0 and rows["total"][1] > 0, cap.out
    # the patched step runs kernelforge's ops: their families appear with time, named kernelforge::
    assert rows["norm"][1] > 0 and rows["attention"][1] > 0, cap.out
    assert "kernelforge::" in cap.out
    if model == "llama_train":
        assert rows["activation"][1] > 0 and rows["loss"][1] > 0, cap.out
    for kind in ("unpatched", "patched"):
        with open(tmp_path / f"{model}-{kind}.json") as f:
            assert json.load(f)["traceEvents"]
    # --out: the CSV holds the printed table's numbers, family by family
    with open(tmp_path / f"profile_{model}.csv", newline="") as f:
        csv_rows = {r["family"]: r for r in csv.DictReader(f)}
    for fam, (b, a) in rows.items():
        assert float(csv_rows[fam]["unpatched_ms"]) == pytest.approx(b, abs=1e-3)
        assert float(csv_rows[fam]["patched_ms"]) == pytest.approx(a, abs=1e-3)
    assert sum(float(r["patched_share"]) for k, r in csv_rows.items() if k != "total") == pytest.approx(1.0, abs=1e-3)
    if importlib.util.find_spec("matplotlib") is not None:
        assert (tmp_path / f"profile_{model}.png").stat().st_size > 0


@pytest.mark.cuda
def test_profile_cuda(capsys):
    pytest.importorskip("transformers")
    rc, cap = _run(capsys, ["--model", "llama_train", "--size", "small", "--device", "cuda", "--steps", "1"])
    assert rc == 0, cap.err
    rows = _table(cap.out)
    assert rows["norm"][1] > 0 and rows["attention"][1] > 0 and rows["matmul"][1] > 0, cap.out
    assert "kernelforge::" in cap.out  # kernel names of the patched step


def test_profile_errors(capsys):
    rc, cap = _run(capsys, ["--model", "llama", "--size", "small", "--device", "cpu", "--steps", "0"])
    assert rc == 2 and "--steps" in cap.err
    if not torch.cuda.is_available():
        rc, cap = _run(capsys, ["--model", "llama", "--size", "small", "--device", "cuda"])
        assert rc == 2 and "no CUDA GPU" in cap.err
    with pytest.raises(SystemExit):
        cli.main(["profile", "--model", "gpt5"])
