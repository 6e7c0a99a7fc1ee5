"""`kforge e2e` / `kforge bench e2e`: a small model step with each provider in its own process (CPU;
CUDA where there is one): the table, the CSV, the chart, argument errors, the worker's JSON line."""

from __future__ import annotations

import csv

import pytest
import torch

from kernelforge import cli
from kernelforge import e2e as E


def _rows(path) -> list[dict]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.cuda)])
def test_e2e_small(capsys, tmp_path, device):
    pytest.importorskip("transformers")
    rc = cli.main(["bench", "e2e", "--cases", "llama_train", "--providers", "eager,kernelforge", "--size", "small",
                   "--device", device, "--iters", "1", "--warmup", "1", "--out", str(tmp_path)])
    cap = capsys.readouterr()
    assert rc == 0, cap.out + cap.err
    rows = {r["provider"]: r for r in _rows(tmp_path / "e2e.csv")}
    assert set(rows) == {"eager", "kernelforge"}
    assert all(r["status"] == "ok" and float(r["ms_per_step"]) > 0 for r in rows.values()), rows
    assert int(rows["kernelforge"]["patched_modules"]) > 0 and int(rows["eager"]["patched_modules"]) == 0
    assert "llama_train" in cap.out and "x eager" in cap.out
    if device == "cuda":
        assert float(rows["kernelforge"]["peak_mib"]) > 0


def test_worker_generate_per_token():
    """llama_generate: the worker times whole generate calls and reports milliseconds per new token, for
    the eager model and the patched one (whose decode steps run decode_attention)."""
    pytest.importorskip("transformers")
    for provider in ("eager", "kernelforge"):
        r = E.run_worker("llama_generate", provider, "small", "cpu", 1, 1)
        assert r["case"] == "llama_generate" and r["ms"] > 0 and "4 new tokens" in r["what"]
        assert (r["patched_modules"] > 0) == (provider == "kernelforge")


def test_worker_generate_batch():
    """llama_generate_batch: transformers' continuous batching, "paged|sdpa" for eager and
    "paged|kernelforge" for the patched model (its decode-only batches on decode_attention); the other
    providers do not apply."""
    pytest.importorskip("transformers")
    for provider in ("eager", "kernelforge"):
        r = E.run_worker("llama_generate_batch", provider, "small", "cpu", 1, 1)
        assert r["case"] == "llama_generate_batch" and r["ms"] > 0 and "generate_batch" in r["what"]
        assert r["tok_s"] > 0 and (r["patched_modules"] > 0) == (provider == "kernelforge")
    assert not E.applies("llama_generate_batch", "compile") and not E.applies("llama_generate_batch", "generate")


def test_worker_reports_one_step():
    """The worker computes in this process what the parent reads from a child's JSON line."""
    pytest.importorskip("transformers")
    r = E.run_worker("vit_train", "kernelforge", "small", "cpu", 1, 1)
    assert r["case"] == "vit_train" and r["ms"] > 0 and r["patched_modules"] > 0


@pytest.mark.parametrize("case", ["moe_train", "moe_grouped_train"])
def test_worker_moe_block(case):
    """The MoE block: kf.patch routes its experts module to grouped_mm (one patched module); the step runs."""
    pytest.importorskip("transformers")
    for provider in ("eager", "kernelforge"):
        r = E.run_worker(case, provider, "small", "cpu", 1, 1)
        assert r["case"] == case and r["ms"] > 0 and "Mixtral MoE block" in r["what"]
        assert r["patched_modules"] == (1 if provider == "kernelforge" else 0)


def test_e2e_errors(capsys):
    assert cli.main(["e2e", "--size", "small", "--device", "cpu", "--iters", "0"]) == 2
    assert "--iters" in capsys.readouterr().err
    if not torch.cuda.is_available():
        assert cli.main(["e2e", "--device", "cuda"]) == 2
    for bad in (["--cases", "gpt5"], ["--providers", "tensorrt"]):
        with pytest.raises(SystemExit):
            cli.main(["e2e", *bad])
