"""`kforge bench` and `kforge check` on the CPU: the pure-Python parts (shape parsing, byte and flop
counts, the case plan, the rope inputs), the refusal without a GPU, and smoke runs through the
hidden `--device cpu` (on CPU the kernelforge ops run the float64 C++ reference, so these check the
wiring of inputs, providers and comparisons, not the kernels)."""

from __future__ import annotations

import argparse
import csv
import math
import types

import pytest
import torch

from kernelforge import bench, check, cli
from kernelforge.bench import RopeShape

LLAMA = RopeShape(4, 4096, 32, 8, 128)  # the first acceptance shape


def test_parse_shapes_both_kinds():
    got = bench.parse_shapes("16384x4096, b4s4096h32/8d128,B1S1H32/8D128,")
    assert got == [(16384, 4096), LLAMA, RopeShape(1, 1, 32, 8, 128)]
    assert isinstance(got[1], RopeShape) and not isinstance(got[0], RopeShape)
    assert str(got[1]) == "b4s4096h32/8d128"
    assert [bench.shape_label(s) for s in got] == ["16384x4096", "b4s4096h32/8d128", "b1s1h32/8d128"]


@pytest.mark.parametrize("text", ["b4s4096h32d128", "b4s4096h32/8", "b1s1h32/8d127", "b0s1h32/8d128",
                                  "b1s1h32/0d128", "16384x", "x4096", "16384x4096x2", ","])
def test_parse_shapes_rejects(text):
    with pytest.raises(argparse.ArgumentTypeError):
        bench.parse_shapes(text)


def test_rope_bytes():
    # |q| + |k| = B*S*(Hq + Hk)*D; cos/sin [B, S, D] each
    qk = 4 * 4096 * (32 + 8) * 128
    cs = 4 * 4096 * 128
    # the anchors' rope_fwd rows (and notes/rope.md) count q and k only: 335.5 MB in bf16
    assert 2 * qk * 2 == 335_544_320
    assert bench.traffic_bytes("apply_rope", "fwd", LLAMA, 2) == (2 * qk + 2 * cs) * 2
    assert bench.traffic_bytes("apply_rope", "fwdbwd", LLAMA, 2) == (4 * qk + 4 * cs) * 2
    # the decode modes count the forward's bytes; fp32 doubles everything
    one = RopeShape(1, 1, 32, 8, 128)
    assert bench.traffic_bytes("apply_rope", "fwd_graph", one, 4) == (2 * 40 * 128 + 2 * 128) * 4
    assert bench.traffic_bytes("apply_rope", "fwd_call", one, 4) == bench.traffic_bytes("apply_rope", "fwd", one, 4)
    # ours / the anchors' = (Hq + Hk + 1) / (Hq + Hk)
    assert bench.traffic_bytes("apply_rope", "fwd", LLAMA, 2) / (2 * qk * 2) == pytest.approx(41 / 40)
    assert bench.flop_count("apply_rope", "fwd", LLAMA) == 3 * qk
    assert bench.flop_count("apply_rope", "fwdbwd", LLAMA) == 6 * qk


def test_norm_and_activation_bytes_unchanged():
    M, N = 16384, 4096
    assert bench.traffic_bytes("rms_norm", "fwd", (M, N), 2) == (2 * M * N + N) * 2
    assert bench.traffic_bytes("add_rms_norm", "fwdbwd", (M, N), 2) == (7 * M * N + 3 * N) * 2
    assert bench.traffic_bytes("ada_norm", "fwdbwd", (M, N), 4) == (5 * M * N + 5 * 4 * N) * 4  # B = 4
    assert bench.traffic_bytes("ada_norm", "fwd", (1, N), 2) == (2 * N + 2 * N) * 2  # B = 1
    assert bench.traffic_bytes("silu_and_mul", "fwd_graph", (64, N), 2) == 3 * 64 * N * 2
    assert bench.flop_count("layer_norm", "fwdbwd", (M, N)) == 17 * M * N


def test_decode_modes_count_tokens():
    modes = list(bench.MODES)
    assert bench.modes_for(bench.case_rows(RopeShape(64, 1, 32, 8, 128)), modes) == modes
    assert bench.modes_for(bench.case_rows(RopeShape(1, 1, 32, 8, 128)), modes) == modes
    assert bench.modes_for(bench.case_rows(RopeShape(65, 1, 32, 8, 128)), modes) == ["fwd", "fwdbwd"]
    assert bench.modes_for(bench.case_rows(RopeShape(1, 16384, 32, 8, 128)), modes) == ["fwd", "fwdbwd"]
    assert bench.case_rows((64, 4096)) == 64


def _bench_args(argv):
    return cli.build_parser().parse_args(["bench", *argv])


def test_plan_rope_last_and_defaults():
    args = _bench_args([])
    args.ops = list(bench.DEFAULT_OPS)
    cases = bench.plan_cases(args)
    assert bench.DEFAULT_OPS[-1] == "apply_rope" and "apply_rope" in bench.OP_GROUPS["all"]
    assert bench.OP_GROUPS["rope"] == ("apply_rope",)
    # the norm plan first (as before the other families), then the activations, then rope
    assert cases[0] == ("rms_norm", (16384, 2048), "bf16")
    families = [0 if op in bench.NORM_OPS else 1 if op in bench.ACT_OPS else 2 for op, _, _ in cases]
    assert families == sorted(families)
    rope = [dims for op, dims, _ in cases if op == "apply_rope"]
    assert rope == list(bench.ROPE_SHAPES)
    assert [str(s) for s in rope] == ["b4s4096h32/8d128", "b1s16384h32/8d128", "b1s1h32/8d128", "b64s1h32/8d128"]


def test_plan_shapes_by_kind():
    args = _bench_args(["--shapes", "8x64,b1s2h2/1d8", "--dtype", "bf16,fp32"])
    args.ops = ["rms_norm", "apply_rope"]
    assert bench.plan_cases(args) == [
        ("rms_norm", (8, 64), "bf16"), ("rms_norm", (8, 64), "fp32"),
        ("apply_rope", RopeShape(1, 2, 2, 1, 8), "bf16"), ("apply_rope", RopeShape(1, 2, 2, 1, 8), "fp32")]
    args = _bench_args(["--shapes", "8x64"])
    args.ops = ["apply_rope"]
    assert bench.plan_cases(args) == []


def test_rope_inputs_are_hf_views():
    dims = RopeShape(2, 5, 4, 2, 16)
    t = bench.make_inputs("apply_rope", dims, torch.bfloat16, torch.device("cpu"))
    for name, h in (("q", 4), ("k", 2), ("dq_out", 4), ("dk_out", 2)):
        x = t[name]
        assert x.shape == (2, h, 5, 16) and x.dtype == torch.bfloat16
        assert not x.is_contiguous() and x.transpose(1, 2).is_contiguous()  # [B, S, H, D] memory
    assert t["cos"].shape == t["sin"].shape == (2, 5, 16) and t["cos"].dtype == torch.bfloat16
    assert t["cos"].is_contiguous() and t["sin"].is_contiguous()


def test_rope_tables_match_llama_rotary_embedding():
    transformers = pytest.importorskip("transformers")
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    pos = torch.tensor([[5, 6, 7], [4000, 4001, 4095]])
    for d in (16, 128):
        cfg = transformers.LlamaConfig(hidden_size=4 * d, num_attention_heads=4, num_key_value_heads=2, head_dim=d)
        emb = LlamaRotaryEmbedding(cfg)
        for dtype in (torch.bfloat16, torch.float32):
            want_cos, want_sin = emb(torch.zeros(1, dtype=dtype), pos)
            cos, sin = bench.hf_rope_tables(pos, d, dtype)
            torch.testing.assert_close(cos, want_cos, rtol=0, atol=0)
            torch.testing.assert_close(sin, want_sin, rtol=0, atol=0)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal without a GPU")
@pytest.mark.parametrize("argv", [["bench"], ["bench", "apply_rope"], ["check"], ["check", "rope"],
                                  ["check", "cross_entropy"], ["check", "loss"]])
def test_no_gpu_fails_clearly(argv, capsys):
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert "no CUDA GPU is visible" in err and "needs one" in err


@pytest.mark.parametrize("argv", [["bench", "rope_x"], ["check", "rope_x"]])
def test_unknown_op(argv, capsys):
    assert cli.main(argv) == 2
    assert "unknown op" in capsys.readouterr().err


def test_bench_smoke_cpu(tmp_path):
    """apply_rope and a norm op through the whole bench on the CPU: every peer agrees with kernelforge
    (forward and gradients), one CSV schema, the summary lists no problem."""
    pytest.importorskip("transformers")
    out = tmp_path / "bench"
    rc = cli.main(["bench", "rms_norm", "apply_rope", "--device", "cpu", "--quick", "--shapes",
                   "8x64,b2s5h4/2d16", "--modes", "fwd,fwdbwd", "--providers", "eager", "--out", str(out)])
    assert rc == 0
    with open(out / "bench.csv") as f:
        rows = list(csv.DictReader(f))
    assert [(r["op"], r["mode"], r["shape"], r["provider"]) for r in rows] == [
        (op, mode, shape, p)
        for op, shape in (("rms_norm", "8x64"), ("apply_rope", "b2s5h4/2d16"))
        for mode in ("fwd", "fwdbwd") for p in ("kernelforge", "eager")]
    assert list(rows[0]) == list(bench.CSV_FIELDS)
    summary = (out / "summary.txt").read_text()
    assert "problems:" not in summary
    assert "b2s5h4/2d16" in summary


def _rope_tally(kf, dtype):
    tally = check.Tally()
    for shape in ((1, 3, 2, 1, 16, 8), (2, 4, 3, 3, 10, 10)):
        for v in check.VARIANTS["apply_rope"]:
            check.check_case(kf, "apply_rope", shape, v, dtype, torch.device("cpu"), tally)
    return tally


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=str)
def test_check_rope_cpu(kf, dtype):
    tally = _rope_tally(kf, dtype)
    assert tally.cases == 2 * len(check.VARIANTS["apply_rope"])
    assert not tally.failures, tally.failures[:4]


@pytest.mark.parametrize("broken", ["pairing", "sin_sign", "inplace_skipped"])
def test_check_rope_catches(kf, broken):
    """The oracles catch a wrong pairing, a wrong sign and an in-place call that writes nothing."""

    def apply_rope(q, k, cos, sin, **kw):
        if broken == "pairing":
            kw["interleaved"] = not kw["interleaved"]
        if broken == "sin_sign":
            sin = -sin
        if broken == "inplace_skipped" and kw.get("inplace"):
            return q, k
        return kf.apply_rope(q, k, cos, sin, **kw)

    tally = _rope_tally(types.SimpleNamespace(apply_rope=apply_rope), torch.float32)
    assert tally.failures
    if broken == "inplace_skipped":
        assert all("_inplace vs" in f for f in tally.failures)


def test_softmax_ops_in_the_plan():
    """softmax / log_softmax: their own group, the default shapes plus the 4096x131072 acceptance
    rows, 2 (fwd) and 5 (fwd+bwd) passes over M*N elements."""
    assert bench.OP_GROUPS["softmax"] == ("softmax", "log_softmax")
    assert set(bench.SOFTMAX_OPS) <= set(bench.OP_GROUPS["all"])
    assert (4096, 131072) in bench.default_shapes("softmax")
    assert bench.traffic_bytes("softmax", "fwd", (16384, 4096), 2) == 2 * 16384 * 4096 * 2
    assert bench.traffic_bytes("log_softmax", "fwdbwd", (16384, 4096), 2) == 5 * 16384 * 4096 * 2
    args = _bench_args([])
    args.ops = ["rms_norm", "softmax"]
    cases = bench.plan_cases(args)
    assert cases[-1] == ("softmax", (4096, 131072), "bf16")


def test_check_ops_and_groups():
    """The loss ops are in the default list (last) and selectable by name or as the group "loss"."""
    assert check.OPS[-2:] == ("cross_entropy", "fused_linear_cross_entropy")
    assert check.op_shapes("cross_entropy") == check.CE_SHAPES
    assert check.op_shapes("fused_linear_cross_entropy") == check.FLCE_SHAPES
    assert check.op_shapes("rms_norm") == check.SHAPES


def test_errors_nan_rule():
    """NaN never passes, except where the reference is NaN too (then the positions must match)."""
    nan = float("nan")
    assert check.errors(torch.tensor(nan), torch.tensor(nan, dtype=torch.float64)) == (0.0, 0.0)
    assert check.errors(torch.tensor([nan, 1.0]), torch.tensor([nan, 1.0])) == (0.0, 0.0)
    assert check.errors(torch.tensor([nan, 1.5]), torch.tensor([nan, 1.0]))[0] == pytest.approx(0.5)
    assert check.errors(torch.tensor([0.0, 1.0]), torch.tensor([nan, 1.0]))[0] == math.inf  # NaN expected
    assert check.errors(torch.tensor([nan, 1.0]), torch.tensor([1.0, 1.0]))[0] == math.inf  # NaN got
    assert check.errors(torch.tensor([nan, nan]), torch.tensor([nan, 1.0]))[0] == math.inf


CE_CPU_SHAPES = {"cross_entropy": ((1, 7), (9, 301)), "fused_linear_cross_entropy": ((13, 16, 101), (1, 8, 7))}


def _ce_tally(kf, op, dtype):
    tally = check.Tally()
    for shape in CE_CPU_SHAPES[op]:
        for v in check.VARIANTS[op]:
            check.check_case(kf, op, shape, v, dtype, torch.device("cpu"), tally)
    return tally


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=str)
@pytest.mark.parametrize("op", ["cross_entropy", "fused_linear_cross_entropy"])
def test_check_ce_cpu(kf, op, dtype):
    tally = _ce_tally(kf, op, dtype)
    assert tally.cases == 2 * len(check.VARIANTS[op])
    assert not tally.failures, tally.failures[:4]


@pytest.mark.parametrize("broken", ["label_smoothing", "z_loss", "softcap", "all_ignored_zero"])
def test_check_ce_catches(kf, broken):
    """The oracles catch a dropped option, and a mean over no valid rows that is not NaN."""

    def cross_entropy(logits, target, **kw):
        if broken == "label_smoothing":
            kw["label_smoothing"] = 0.0
        if broken == "z_loss":
            kw["z_loss_scale"] = 0.0
        if broken == "softcap":
            kw["softcap"] = None
        loss, lse = kf.cross_entropy(logits, target, **kw)
        if broken == "all_ignored_zero":
            loss = torch.nan_to_num(loss)
        return loss, lse

    tally = _ce_tally(types.SimpleNamespace(cross_entropy=cross_entropy), "cross_entropy", torch.float32)
    want = {"label_smoothing": "ls=0.1", "z_loss": "z=0.0001", "softcap": "softcap=30",
            "all_ignored_zero": "all_ignored"}[broken]
    assert tally.failures
    assert all(want in f for f in tally.failures), tally.failures[:4]


@pytest.mark.parametrize("broken", ["bias_dropped", "weight_grad_scaled"])
def test_check_flce_catches(kf, broken):
    def fused_linear_cross_entropy(hidden, weight, target, bias=None, **kw):
        if broken == "bias_dropped" and bias is not None:
            bias = bias * 0
        if broken == "weight_grad_scaled":  # the forward is right, the weight gradient is 1.01x
            weight = weight * 1.01 - (weight * 0.01).detach()
        return kf.fused_linear_cross_entropy(hidden, weight, target, bias, **kw)

    tally = _ce_tally(types.SimpleNamespace(fused_linear_cross_entropy=fused_linear_cross_entropy),
                      "fused_linear_cross_entropy", torch.float32)
    assert tally.failures
    if broken == "weight_grad_scaled":
        assert all("dweight vs" in f for f in tally.failures), tally.failures[:4]
