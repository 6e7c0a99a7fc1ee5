"""`kforge bench`, `kforge check` and the op specs on the CPU: spec consistency, byte and FLOP counts,
shape parsing, the case plan, the command line (--plan, --sweep, --save), the CSV schema, the refusal
without a GPU, and smoke runs through the hidden `--device cpu` (on CPU the kernelforge ops run the
float64 C++ reference, so these check the wiring of inputs, providers and comparisons, not the
kernels)."""

from __future__ import annotations

import argparse
import csv
import dataclasses
import math
import types

import pytest
import torch

from kernelforge import bench, check, cli
from kernelforge.bench import report, runner
from kernelforge.specs import (GROUPS, OPS, SPECS, TOL, AttnShape, BatchedRowsShape, BmmShape, DecodeShape,
                               FlceShape, GroupedShape, LinearShape, RopeShape, shape_label, shape_rows)
from kernelforge.specs.decode import CascadeShape
from kernelforge.specs.graph import GraphShape
from kernelforge.specs.norm import SWEEP_HIDDEN, SWEEP_ROWS
from kernelforge.specs.rope import hf_rope_tables

LLAMA = RopeShape(4, 4096, 32, 8, 128)
CPU = torch.device("cpu")
# one small shape of each kind, for inputs and smoke runs on the CPU
SMALL = {"rows": (8, 64), "rope": RopeShape(2, 5, 4, 2, 16), "flce": FlceShape(9, 16, 101),
         "attn": AttnShape(2, 4, 2, 7, 7, 64, 64, True), "decode": DecodeShape(2, 4, 2, 40, 64, 16),
         "linear": LinearShape(3, 40, 64, True), "graph": GraphShape(50, 400, 16), "bmm": BmmShape(3, 7, 40, 24),
         "grouped": GroupedShape(3, 20, 24, 16), "mla": DecodeShape(2, 4, 1, 40, 576, 16),
         "cascade": CascadeShape(2, 4, 2, 32, 20, 64, 16)}


# ---- the specs ------------------------------------------------------------------------------------


@pytest.mark.parametrize("op", OPS)
def test_spec_is_complete(op):
    """Every spec: a float64 reference and the C++ one, check inputs, shapes and variants, default
    bench shapes of its kind with bytes and FLOPs > 0 in both modes, kernelforge first of its
    providers, and a factory for every peer it lists."""
    s = SPECS[op]
    assert s.name == op and op in GROUPS[s.family]
    for f in ("reference", "cpp_reference", "check_run", "check_inputs", "inputs", "run"):
        assert callable(getattr(s, f)), f"{op}: no {f}"
    backward = "fwdbwd" in s.modes  # a forward-only op would differentiate nothing
    assert s.check_shapes and s.variants and s.shapes and "fwd" in s.modes
    assert not backward or (s.grad_inputs and s.grad_outputs)
    assert s.bound in ("memory", "compute")
    assert all(runner._kind(sh) == s.shape_kind for sh in s.shapes + s.sweep_shapes)
    assert s.shape_applies is None or all(s.shape_applies(sh) for sh in s.shapes + s.sweep_shapes)
    for sh in s.shapes:
        for mode in ("fwd", "fwdbwd", "fwd_graph", "fwd_call"):
            if mode == "fwdbwd" and not backward:
                continue
            for elt in (2, 4):
                assert s.traffic(sh, mode, elt) > 0
            assert s.flop_count(sh, mode) > 0
        if backward:
            assert s.traffic(sh, "fwdbwd", 2) > s.traffic(sh, "fwd", 2)
        assert s.traffic(sh, "fwd", 4) == 2 * s.traffic(sh, "fwd", 2)
        assert s.shape_kind == "rows" or runner.parse_shapes(str(sh)) == [sh]
    assert s.providers[0] == "kernelforge" and set(s.providers) <= set(report.PROVIDERS)
    for p, factory in (("eager", s.eager), ("torch_native", s.torch_native), ("liger", s.liger)):
        assert (p not in s.providers) or factory is not None, f"{op}: lists {p} but has no factory"
    for p in s.providers:
        assert p in ("kernelforge", "eager", "torch_native", "compile", "liger") or p in s.extra_peers, p
    assert ("compile" not in s.providers) or s.eager is not None


@pytest.mark.parametrize("op", OPS)
def test_spec_inputs_cpu(op):
    """The bench inputs hold every differentiated input and incoming gradient, never all zeros, and
    are the same for the same seed."""
    s = SPECS[op]
    sh = SMALL["mla"] if op == "mla_decode" else SMALL[s.shape_kind]
    t = s.inputs(sh, torch.bfloat16, CPU, torch.Generator().manual_seed(0))
    u = s.inputs(sh, torch.bfloat16, CPU, torch.Generator().manual_seed(0))
    for k in s.grad_inputs + s.grad_outputs:
        assert isinstance(t[k], torch.Tensor) and t[k].is_floating_point(), f"{op}: {k}"
        assert torch.equal(t[k], u[k])
    for k in s.grad_inputs:
        assert t[k].count_nonzero() > 0


def test_tolerance_table():
    """One row per dtype; every kind of comparison is tighter in float32 than in the half types."""
    assert set(TOL) == {torch.float32, torch.float16, torch.bfloat16, torch.float64}
    for f in dataclasses.fields(TOL[torch.float32]):
        v32, v16, vbf = (getattr(TOL[d], f.name) for d in (torch.float32, torch.float16, torch.bfloat16))
        assert 0 < v32 <= v16 and v32 <= vbf, f.name


def test_families_and_groups():
    assert tuple(GROUPS) == ("all", "norm", "activation", "rope", "softmax", "loss", "attention", "decode", "linear",
                             "gemm", "diagonal_matmul", "fused_linear_rowsum", "dropout", "graph")
    assert GROUPS["rope"] == ("apply_rope",) and GROUPS["softmax"] == ("softmax", "log_softmax")
    assert GROUPS["attention"] == ("attention",) and GROUPS["decode"] == ("decode_attention", "mla_decode",
                                                                              "cascade_decode_attention")
    assert GROUPS["linear"] == ("linear",) and GROUPS["gemm"] == ("gemm", "bmm", "grouped_mm")
    assert GROUPS["diagonal_matmul"] == ("diagonal_matmul",)
    assert GROUPS["fused_linear_rowsum"] == ("fused_linear_rowsum",)
    assert GROUPS["dropout"] == ("dropout", "dropout_add")
    assert GROUPS["graph"] == ("segment_sum", "segment_mean", "segment_max", "gather_scatter", "scatter_add")
    assert OPS[OPS.index("cross_entropy"):OPS.index("gemm") + 1] == (
        "cross_entropy", "fused_linear_cross_entropy", "attention", "decode_attention", "mla_decode",
        "cascade_decode_attention", "linear", "gemm")
    assert bench.DEFAULT_OPS == GROUPS["norm"] + ("silu_and_mul", "geglu", "apply_rope")


# ---- bytes and FLOPs --------------------------------------------------------------------------------


def test_attention_flops_and_shapes():
    """The anchors' count: 4 * B * H * S^2 * D, halved when causal; 2 * (Dqk + Dv) per pair in general;
    varlen over its ragged lengths; fwdbwd 3.5x the forward (the backward's five GEMMs: 2.5x); the bench
    grid at 16 K tokens per batch; fwd and fwdbwd, bf16 / fp16."""
    s = SPECS["attention"]
    assert s.flop_count(AttnShape(4, 32, 32, 4096, 4096, 64, 64, False), "fwd") == 4 * 4 * 32 * 4096 ** 2 * 64
    assert s.flop_count(AttnShape(4, 32, 32, 4096, 4096, 64, 64, True), "fwd") == 2 * 4 * 32 * 4096 ** 2 * 64
    assert s.flop_count(AttnShape(1, 2, 2, 10, 20, 192, 128, False), "fwd") == 2 * 2 * 10 * 20 * (192 + 128)
    assert s.flop_count(AttnShape(4, 1, 1, 8, 8, 64, 64, False, True), "fwd") == 4 * 64 * (64 + 36 + 16 + 4)
    assert str(AttnShape(4, 32, 8, 4096, 4096, 128, 128, True)) == "b4h32/8s4096d128c"
    assert str(AttnShape(8, 16, 16, 4096, 4096, 128, 128, True, True)) == "b8h16s4096d128c-varlen"
    assert {sh.b * sh.sq for sh in s.shapes if not sh.varlen} == {16384}
    assert {sh.sq for sh in s.shapes} >= {512, 1024, 2048, 4096, 8192, 16384}
    assert {(sh.hq, sh.d) for sh in s.shapes} >= {(16, 128), (32, 64), (8, 256)}
    assert any(sh.hq != sh.hk for sh in s.shapes) and any(sh.varlen for sh in s.shapes)
    for sh in (AttnShape(4, 32, 32, 4096, 4096, 64, 64, True), AttnShape(1, 2, 2, 10, 20, 192, 128, False),
               AttnShape(4, 1, 1, 8, 8, 64, 64, False, True)):
        assert 2 * s.flop_count(sh, "fwdbwd") == 7 * s.flop_count(sh, "fwd")
    assert s.grad_inputs == ("q", "k", "v") and s.grad_outputs == ("dout",)
    assert runner.modes_for(16384, ["fwd", "fwdbwd", "fwd_graph"], s) == ["fwd", "fwdbwd"]
    cases = runner.plan_cases(["attention"], None, ["bf16", "fp32"])
    assert cases and {dt for _, _, dt in cases} == {"bf16"}
    assert not s.peer_applies("cudnn", AttnShape(8, 16, 16, 4096, 4096, 128, 128, True, True))


def test_decode_bytes_and_shapes():
    """Every key and value row once per kv head plus q and out: 2 * B * kv * Hkv * D + 2 * B * Lq * Hq * D
    elements; FLOPs 4 * Hq * D per visible pair (token t of Lq sees kv - Lq + t + 1 keys); the shape
    form b{B}h{Hq}/{Hkv}kv{kv}d{D}p{page}[q{Lq}]; forward only, every default shape decode-sized (fwd_graph,
    fwd_call); flash2 (no mask) only for Lq = 1."""
    s = SPECS["decode_attention"]
    sh = DecodeShape(8, 32, 8, 32768, 128, 16)
    assert s.traffic(sh, "fwd", 2) == (2 * 8 * 32768 * 8 * 128 + 2 * 8 * 32 * 128) * 2
    assert s.traffic(sh, "fwd_graph", 2) == s.traffic(sh, "fwd", 2)
    assert s.flop_count(sh, "fwd") == 4 * 32 * 128 * 8 * 32768
    q4 = DecodeShape(16, 32, 8, 4096, 128, 16, 4)
    assert s.flop_count(q4, "fwd") == 4 * 32 * 128 * 16 * (4093 + 4094 + 4095 + 4096)
    assert str(sh) == "b8h32/8kv32768d128p16" and str(q4) == "b16h32/8kv4096d128p16q4"
    assert str(DecodeShape(2, 8, 8, 100, 64, 0)) == "b2h8kv100d64p0"
    got = runner.parse_shapes("b1h32/8kv8192d128p16,b16h32/8kv4096d128p16q4,B2H8KV100D64P0")
    assert got == [DecodeShape(1, 32, 8, 8192, 128, 16), q4, DecodeShape(2, 8, 8, 100, 64, 0)]
    for text in ("b1h32/8kv8192d128p3", "b1h32/5kv8192d128p16", "b1h32/8kv2d128p16q4", "b0h32/8kv8d128p16"):
        with pytest.raises(argparse.ArgumentTypeError):
            runner.parse_shapes(text)
    assert {(x.b, x.kv, x.page, x.lq) for x in s.shapes} == {
        (1, 8192, 16, 1), (16, 4096, 16, 1), (64, 2048, 16, 1), (8, 32768, 16, 1), (16, 4096, 1, 1), (16, 4096, 16, 4),
        (1, 8192, 0, 1), (16, 4096, 0, 1)}
    assert s.modes == ("fwd",) and s.bound == "memory" and s.dtypes == (torch.bfloat16, torch.float16)
    assert runner.modes_for(shape_rows(q4), list(report.MODES), s) == ["fwd", "fwd_graph", "fwd_call"]
    assert s.peer_applies("flash2", sh) and not s.peer_applies("flash2", q4) and s.peer_applies("cudnn", q4)
    assert [c[0] for c in runner.plan_cases(["decode_attention"], None, ["bf16", "fp32"])] == ["decode_attention"] * 8


def test_decode_bench_inputs_cpu():
    """The paged bench cache holds the static cache's rows, page by page through the block table (a
    permutation); p0 passes the static cache's transpose view; the eager peer and the reference agree."""
    from kernelforge.specs.decode import decode_ref

    s = SPECS["decode_attention"]
    for sh in (DecodeShape(2, 4, 2, 40, 64, 16), DecodeShape(2, 4, 2, 40, 64, 0), DecodeShape(2, 4, 1, 9, 64, 4, 3)):
        t = s.inputs(sh, torch.float32, CPU, torch.Generator().manual_seed(0))
        k = t["k_static"].transpose(1, 2)
        if sh.page:
            table = t["block_table"]
            assert sorted(table.flatten().tolist()) == list(range(table.numel()))
            for b in range(sh.b):
                for j in range(sh.kv):
                    assert torch.equal(t["k_cache"][table[b, j // sh.page], j % sh.page], k[b, j])
        else:
            assert t["block_table"] is None and t["k_cache"].data_ptr() == t["k_static"].data_ptr()
        want, _ = decode_ref(t["q"], t["k_cache"], t["v_cache"], t["seq_lens"], t["block_table"])
        got = s.peer("eager")(t)[0]
        assert got.shape == (sh.b, sh.lq, sh.hq, sh.d)
        assert (got.double() - want).abs().max().item() < 1e-5


def test_linear_bytes_and_shapes():
    """The weight once, x read, y written (and the bias): (N * K + M * (K + N) [+ N]) elements; FLOPs
    2 * M * N * K; the shape form m{M}n{N}k{K}[-bias]; forward only, every default shape decode-sized
    (fwd_graph, fwd_call) with the cublas and compile peers."""
    s = SPECS["linear"]
    sh = LinearShape(1, 4096, 4096)
    assert s.traffic(sh, "fwd", 2) == (4096 * 4096 + 1 * (4096 + 4096)) * 2
    assert s.traffic(LinearShape(16, 14336, 4096, True), "fwd", 2) == (14336 * 4096 + 16 * (4096 + 14336) + 14336) * 2
    assert s.traffic(sh, "fwd_graph", 2) == s.traffic(sh, "fwd", 2)
    assert s.flop_count(LinearShape(8, 6144, 4096), "fwd") == 2 * 8 * 6144 * 4096
    assert str(sh) == "m1n4096k4096" and str(LinearShape(2, 3, 5, True)) == "m2n3k5-bias"
    got = runner.parse_shapes("m1n4096k4096,M16N14336K4096-bias,m3n5k7")
    assert got == [sh, LinearShape(16, 14336, 4096, True), LinearShape(3, 5, 7)]
    assert shape_rows(got[1]) == 16 and shape_label(got[1]) == "m16n14336k4096-bias"
    for text in ("m0n4096k4096", "m1n0k4", "m1n4k0", "m1n4096", "m1n4k4-bias2"):
        with pytest.raises(argparse.ArgumentTypeError):
            runner.parse_shapes(text)
    assert {(x.m, x.n, x.k) for x in s.shapes} == {
        (1, 4096, 4096), (16, 14336, 4096), (1, 14336, 4096), (4, 4096, 4096), (16, 4096, 14336), (1, 128256, 2048),
        (8, 6144, 4096)}
    assert s.modes == ("fwd",) and s.bound == "memory" and s.dtypes == (torch.bfloat16, torch.float16)
    assert s.providers == ("kernelforge", "cublas", "compile")
    assert all(runner.modes_for(shape_rows(x), list(report.MODES), s) == ["fwd", "fwd_graph", "fwd_call"]
               for x in s.shapes)
    assert [c[0] for c in runner.plan_cases(["linear"], None, ["bf16", "fp32"])] == ["linear"] * 7


def test_linear_bench_inputs_cpu():
    """x, w at nn.Linear's scale (y of std ~1), the bias with -bias; the cublas peer is F.linear and
    agrees with the float64 reference."""
    from kernelforge.specs.linear import linear_ref

    s = SPECS["linear"]
    for sh in (LinearShape(3, 40, 64), LinearShape(1, 7, 5, True)):
        t = s.inputs(sh, torch.float32, CPU, torch.Generator().manual_seed(0))
        assert t["x"].shape == (sh.m, sh.k) and t["w"].shape == (sh.n, sh.k)
        assert (t["bias"] is not None) == sh.bias and (not sh.bias or t["bias"].shape == (sh.n,))
        got = s.peer("cublas")(t)[0]
        assert got.shape == (sh.m, sh.n)
        assert (got.double() - linear_ref(t["x"], t["w"], t["bias"])).abs().max().item() < 1e-5


def test_rope_bytes():
    # |q| + |k| = B*S*(Hq + Hk)*D; cos/sin [B, S, D] each
    qk = 4 * 4096 * (32 + 8) * 128
    cs = 4 * 4096 * 128
    s = SPECS["apply_rope"]
    assert 2 * qk * 2 == 335_544_320  # q and k only: 335.5 MB in bf16
    assert s.traffic(LLAMA, "fwd", 2) == (2 * qk + 2 * cs) * 2
    assert s.traffic(LLAMA, "fwdbwd", 2) == (4 * qk + 4 * cs) * 2
    one = RopeShape(1, 1, 32, 8, 128)  # the decode modes count the forward's bytes
    assert s.traffic(one, "fwd_graph", 4) == (2 * 40 * 128 + 2 * 128) * 4
    assert s.traffic(one, "fwd_call", 4) == s.traffic(one, "fwd", 4)
    assert s.traffic(LLAMA, "fwd", 2) / (2 * qk * 2) == pytest.approx(41 / 40)
    assert s.flop_count(LLAMA, "fwd") == 3 * qk and s.flop_count(LLAMA, "fwdbwd") == 6 * qk


def test_row_op_bytes():
    M, N = 16384, 4096
    assert SPECS["rms_norm"].traffic((M, N), "fwd", 2) == (2 * M * N + N) * 2
    assert SPECS["add_rms_norm"].traffic((M, N), "fwdbwd", 2) == (7 * M * N + 3 * N) * 2
    assert SPECS["ada_norm"].traffic((M, N), "fwdbwd", 4) == (5 * M * N + 5 * 4 * N) * 4  # B = 4
    assert SPECS["ada_norm"].traffic((1, N), "fwd", 2) == (2 * N + 2 * N) * 2  # B = 1
    assert SPECS["silu_and_mul"].traffic((64, N), "fwd_graph", 2) == 3 * 64 * N * 2
    assert SPECS["gelu"].traffic((64, N), "fwdbwd", 2) == 5 * 64 * N * 2
    assert SPECS["layer_norm"].flop_count((M, N), "fwdbwd") == 17 * M * N
    assert SPECS["softmax"].traffic((M, N), "fwd", 2) == 2 * M * N * 2
    assert SPECS["log_softmax"].traffic((M, N), "fwdbwd", 2) == 5 * M * N * 2
    assert SPECS["cross_entropy"].traffic((4096, 128256), "fwdbwd", 2) == 3 * 4096 * 128256 * 2
    f = FlceShape(8192, 4096, 128256)
    assert SPECS["fused_linear_cross_entropy"].traffic(f, "fwd", 2) == (8192 + 128256) * 4096 * 2
    assert SPECS["fused_linear_cross_entropy"].flop_count(f, "fwdbwd") == 3 * 2 * 8192 * 4096 * 128256


# ---- shapes and the case plan -----------------------------------------------------------------------


def test_parse_shapes_all_kinds():
    got = runner.parse_shapes("16384x4096, b4s4096h32/8d128,B1S1H32/8D128,t8h4v7")
    assert got == [(16384, 4096), LLAMA, RopeShape(1, 1, 32, 8, 128), FlceShape(8, 4, 7)]
    assert [shape_label(s) for s in got] == ["16384x4096", "b4s4096h32/8d128", "b1s1h32/8d128", "t8h4v7"]
    got = runner.parse_shapes("e8t16384n14336k4096-even,e64t9n8k8")
    assert got == [GroupedShape(8, 16384, 14336, 4096, True), GroupedShape(64, 9, 8, 8)]
    assert [shape_label(s) for s in got] == ["e8t16384n14336k4096-even", "e64t9n8k8"]
    assert [runner._kind(s) for s in got] == ["grouped", "grouped"] and shape_rows(got[0]) == 16384
    got = runner.parse_shapes("b32m1024n1024k128,m1n4096k4096-bias")
    assert got == [BmmShape(32, 1024, 1024, 128), LinearShape(1, 4096, 4096, True)]
    assert [shape_label(s) for s in got] == ["b32m1024n1024k128", "m1n4096k4096-bias"]
    assert [runner._kind(s) for s in got] == ["bmm", "linear"] and shape_rows(got[0]) == 32 * 1024


@pytest.mark.parametrize("text", ["b4s4096h32d128", "b4s4096h32/8", "b1s1h32/8d127", "b0s1h32/8d128",
                                  "b1s1h32/0d128", "16384x", "x4096", "16384x4096x2", ",", "t0h1v1", "b0m1n1k1", "e0t1n1k1"])
def test_parse_shapes_rejects(text):
    with pytest.raises(argparse.ArgumentTypeError):
        runner.parse_shapes(text)


def test_decode_modes_count_tokens():
    modes = list(report.MODES)
    rows = shape_rows
    assert runner.modes_for(rows(RopeShape(64, 1, 32, 8, 128)), modes) == modes
    assert runner.modes_for(rows(RopeShape(65, 1, 32, 8, 128)), modes) == ["fwd", "fwdbwd"]
    assert runner.modes_for(rows(RopeShape(1, 16384, 32, 8, 128)), modes) == ["fwd", "fwdbwd"]
    assert runner.modes_for(rows((64, 4096)), modes) == modes


def test_plan_defaults():
    cases = runner.plan_cases(bench.DEFAULT_OPS, None, ["bf16"])
    assert cases[0] == ("rms_norm", (16384, 2048), "bf16")
    fam = {op: i for i, f in enumerate(GROUPS[k] for k in ("norm", "activation", "rope")) for op in f}
    assert [fam[op] for op, _, _ in cases] == sorted(fam[op] for op, _, _ in cases)  # family by family
    rope = [dims for op, dims, _ in cases if op == "apply_rope"]
    assert [str(s) for s in rope] == ["b4s4096h32/8d128", "b1s16384h32/8d128", "b1s1h32/8d128", "b64s1h32/8d128"]
    assert ("rms_norm", (2048, 131072), "bf16") in cases and ("add_rms_norm", (2048, 131072), "bf16") not in cases
    assert runner.plan_cases(["rms_norm", "softmax"], None, ["bf16"])[-1] == ("softmax", (4096, 131072), "bf16")


def test_plan_shapes_by_kind_and_rows():
    shapes = [(8, 64), RopeShape(1, 2, 2, 1, 8), (16, 64)]
    assert runner.plan_cases(["rms_norm", "apply_rope"], shapes, ["bf16", "fp32"]) == [
        ("rms_norm", (8, 64), "bf16"), ("rms_norm", (8, 64), "fp32"),
        ("rms_norm", (16, 64), "bf16"), ("rms_norm", (16, 64), "fp32"),
        ("apply_rope", RopeShape(1, 2, 2, 1, 8), "bf16"), ("apply_rope", RopeShape(1, 2, 2, 1, 8), "fp32")]
    assert runner.plan_cases(["apply_rope"], [(8, 64)], ["bf16"]) == []
    assert runner.plan_cases(["rms_norm"], shapes, ["bf16"], rows=[16]) == [("rms_norm", (16, 64), "bf16")]


def test_sweep_grid():
    """Rows {4096, 16384} x hidden 1024..16384 in steps of 512 plus the model sizes, per norm op."""
    assert SWEEP_ROWS == (4096, 16384)
    assert set(range(1024, 16385, 512)) <= set(SWEEP_HIDDEN)
    assert {2880, 3584, 5120, 6144, 7168, 10240, 11008, 13824, 14336} <= set(SWEEP_HIDDEN)
    assert len(SWEEP_HIDDEN) == 31 + 2 and list(SWEEP_HIDDEN) == sorted(SWEEP_HIDDEN)
    cases = runner.plan_cases(GROUPS["norm"], None, ["bf16"], sweep=True, rows=[4096])
    assert len(cases) == 4 * len(SWEEP_HIDDEN) and all(dims[0] == 4096 for _, dims, _ in cases)
    assert {op for op, _, _ in cases} == set(GROUPS["norm"])
    assert [op for op in OPS if SPECS[op].sweep_shapes] == list(GROUPS["norm"])


# ---- the command line ----------------------------------------------------------------------------


def _bench_args(argv):
    return cli.build_parser().parse_args(["bench", *argv])


def test_cli_parses_new_options():
    a = _bench_args(["rms_norm", "--plan", "--sweep", "--rows", "4096,16384", "--save", "--out-dir", "/tmp/x"])
    assert a.plan and a.sweep and a.save and a.rows == [4096, 16384] and a.out_dir == "/tmp/x"
    a = _bench_args([])
    assert not (a.plan or a.sweep or a.save) and a.rows is None and a.out == "bench_out"
    assert a.out_dir.endswith("benchmarks")
    # the options scripts/gpu_run.sh passes
    a = _bench_args(["--out", "o/bench", "--max-seconds", "300", "--quick", "--dtype", "bf16,fp32",
                     "--modes", "fwd,fwdbwd", "--providers", "eager", "--shapes", "8x64"])
    assert a.max_seconds == 300 and a.quick and a.dtype == ["bf16", "fp32"] and a.shapes == [(8, 64)]
    with pytest.raises(SystemExit):
        _bench_args(["--rows", "0"])


def test_sweep_rejects_ops_without_grid(capsys):
    assert cli.main(["bench", "--sweep", "apply_rope"]) == 2
    assert "--sweep has no grid for apply_rope" in capsys.readouterr().err


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal without a GPU")
@pytest.mark.parametrize("argv", [["bench"], ["bench", "apply_rope"], ["bench", "--sweep"], ["check"],
                                  ["check", "rope"], ["check", "cross_entropy"], ["check", "loss"]])
def test_no_gpu_fails_clearly(argv, capsys):
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert "no CUDA GPU is visible" in err and "needs one" in err


@pytest.mark.parametrize("argv", [["bench", "rope_x"], ["check", "rope_x"]])
def test_unknown_op(argv, capsys):
    assert cli.main(argv) == 2
    assert "unknown op" in capsys.readouterr().err


@pytest.mark.parametrize("name,short", [("NVIDIA H100 80GB HBM3", "h100"), ("NVIDIA H200", "h200"),
                                        ("NVIDIA A100-SXM4-80GB", "a100"), ("Tesla T4", "t4"),
                                        ("NVIDIA GeForce RTX 4090", "rtx4090"), ("cpu", "cpu")])
def test_gpu_short_name(name, short):
    assert report.gpu_short_name(name) == short


# ---- the CSV and --save -------------------------------------------------------------------------


def _info():
    return report.RunInfo(gpu="NVIDIA H100 80GB HBM3", torch_version="2.x", commit="abc", copy_gbps=3000.0,
                          copy_at={})


def test_csv_rows_schema():
    info = _info()
    group = [report.Result("rms_norm", "fwd", (16384, 4096), "bf16", "kernelforge", 0.1),
             report.Result("rms_norm", "fwd", (16384, 4096), "bf16", "eager", 0.3),
             report.Result("rms_norm", "fwd", (16384, 4096), "bf16", "liger", float("nan"), "FAILED: x")]
    info.copy_at[SPECS["rms_norm"].traffic((16384, 4096), "fwd", 2)] = 2800.0
    rows = report.csv_rows(group, info)
    assert [list(r) for r in rows] == [list(report.CSV_FIELDS)] * 3
    kf = rows[0]
    nbytes = (2 * 16384 * 4096 + 4096) * 2
    assert float(kf["gbps"]) == pytest.approx(nbytes / 1e-4 / 1e9, abs=0.1)
    assert float(kf["speedup_vs_best_peer"]) == pytest.approx(3.0)
    assert float(kf["pct_of_copy_bw"]) == pytest.approx(100 * float(kf["gbps"]) / 3000, abs=0.1)
    assert float(kf["copy_same_bytes_gbps"]) == 2800.0 and kf["gpu"] == info.gpu and kf["commit"] == "abc"
    assert rows[2]["ms_median"] == "nan" and rows[2]["gbps"] == ""


def test_save_merges_and_plots(tmp_path):
    info = _info()
    g1 = [report.Result("rms_norm", m, (4096, h), "bf16", p, ms) for m in ("fwd", "fwdbwd")
          for h in (1024, 1536) for p, ms in (("kernelforge", 0.02), ("eager", 0.05))]
    path, pngs, problems = report.save(report.csv_rows(g1, info), info, str(tmp_path))
    assert path == str(tmp_path / "h100.csv") and not problems
    g2 = [report.Result("rms_norm", "fwd", (4096, 1024), "bf16", "kernelforge", 0.01),
          report.Result("layer_norm", "fwd", (4096, 1024), "bf16", "kernelforge", 0.03)]
    report.save(report.csv_rows(g2, info), info, str(tmp_path))
    with open(path) as f:
        r = csv.DictReader(f)
        assert tuple(r.fieldnames) == report.CSV_FIELDS
        rows = list(r)
    assert len(rows) == len(g1) + 1  # one row replaced, one added
    kf = [x for x in rows if (x["op"], x["mode"], x["shape"], x["provider"]) == ("rms_norm", "fwd", "4096x1024", "kernelforge")]
    assert len(kf) == 1 and float(kf[0]["ms_median"]) == 0.01
    if report.have_matplotlib():
        assert (tmp_path / "h100_rms_norm.png").exists() and (tmp_path / "h100_layer_norm.png").exists()


# ---- smoke runs on the CPU --------------------------------------------------------------------------


def test_bench_smoke_cpu(tmp_path, capsys):
    """A norm op and apply_rope through the whole bench on the CPU with --plan and --save: every peer
    agrees with kernelforge (forward and gradients), one CSV schema, the summary lists no problem."""
    pytest.importorskip("transformers")
    out, saved = tmp_path / "bench", tmp_path / "benchmarks"
    rc = cli.main(["bench", "rms_norm", "apply_rope", "--device", "cpu", "--quick", "--shapes",
                   "8x64,b2s5h4/2d16", "--modes", "fwd,fwdbwd", "--providers", "eager", "--out", str(out),
                   "--plan", "--save", "--out-dir", str(saved)])
    assert rc == 0
    text = capsys.readouterr().out
    assert "plan rms_norm fwd 8x64 bf16: " in text and "plan apply_rope fwdbwd b2s5h4/2d16 bf16: " in text
    want = [(op, mode, shape, p) for op, shape in (("rms_norm", "8x64"), ("apply_rope", "b2s5h4/2d16"))
            for mode in ("fwd", "fwdbwd") for p in ("kernelforge", "eager")]
    for path in (out / "bench.csv", saved / "cpu.csv"):
        with open(path) as f:
            r = csv.DictReader(f)
            assert tuple(r.fieldnames) == report.CSV_FIELDS
            assert [(x["op"], x["mode"], x["shape"], x["provider"]) for x in r] == want
    summary = (out / "summary.txt").read_text()
    assert "problems:" not in summary and "b2s5h4/2d16" in summary and "saved: " in summary


def test_bench_smoke_cpu_every_family(tmp_path):
    """One small shape of every op, kernelforge against the eager / native peers: no mismatch (attention
    has neither: kernelforge alone, its compute-bound TFLOP/s table)."""
    shapes = ",".join(shape_label(SMALL[k]) for k in ("rows", "rope", "flce", "attn", "decode", "mla", "linear",
                                                                    "graph", "bmm", "grouped", "cascade"))
    try:
        import transformers  # noqa: F401  (apply_rope's eager peer)
        ops = OPS
    except ImportError:
        ops = tuple(o for o in OPS if o != "apply_rope")
    argv = ["bench", "--ops", ",".join(ops), "--device", "cpu", "--quick", "--shapes", shapes, "--modes",
            "fwd,fwdbwd", "--providers", "eager,torch_native", "--out", str(tmp_path)]
    assert cli.main(argv) == 0
    summary = (tmp_path / "summary.txt").read_text()
    assert "problems:" not in summary, summary
    for op in ops:
        assert f"{op} " in summary
    assert "kf TFLOP/s" in summary


def test_hf_rope_tables_match_llama_rotary_embedding():
    transformers = pytest.importorskip("transformers")
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    pos = torch.tensor([[5, 6, 7], [4000, 4001, 4095]])
    for d in (16, 128):
        cfg = transformers.LlamaConfig(hidden_size=4 * d, num_attention_heads=4, num_key_value_heads=2, head_dim=d)
        emb = LlamaRotaryEmbedding(cfg)
        for dtype in (torch.bfloat16, torch.float32):
            want_cos, want_sin = emb(torch.zeros(1, dtype=dtype), pos)
            cos, sin = hf_rope_tables(pos, d, dtype)
            torch.testing.assert_close(cos, want_cos, rtol=0, atol=0)
            torch.testing.assert_close(sin, want_sin, rtol=0, atol=0)


def test_rope_inputs_are_hf_views():
    t = SPECS["apply_rope"].inputs(RopeShape(2, 5, 4, 2, 16), torch.bfloat16, CPU, torch.Generator().manual_seed(0))
    for name, h in (("q", 4), ("k", 2), ("dq_out", 4), ("dk_out", 2)):
        x = t[name]
        assert x.shape == (2, h, 5, 16) and x.dtype == torch.bfloat16
        assert not x.is_contiguous() and x.transpose(1, 2).is_contiguous()  # [B, S, H, D] memory
    assert t["cos"].shape == t["sin"].shape == (2, 5, 16) and t["cos"].dtype == torch.bfloat16


# ---- kforge check on the CPU ------------------------------------------------------------------------

CPU_CHECK_SHAPES = {"rms_norm": ((3, 1), (7, 100)), "add_rms_norm": ((4, 33),), "layer_norm": ((5, 64),),
                    "ada_norm": ((4, 40), (3, 7)), "silu_and_mul": ((3, 17),), "swiglu": ((3, 17),),
                    "gelu_and_mul": ((2, 9),), "geglu": ((2, 9),), "gelu": ((2, 9),), "softmax": ((3, 50),),
                    "log_softmax": ((3, 50),), "apply_rope": ((1, 3, 2, 1, 16, 8), (2, 4, 3, 3, 10, 10)),
                    "cross_entropy": ((1, 7), (9, 301)), "fused_linear_cross_entropy": ((13, 16, 101), (1, 8, 7)),
                    "attention": ((2, 41, 41, 2, 1, 64, 64), (1, 7, 4, 2, 2, 192, 128)),  # windows of 16..32
                    "decode_attention": ((3, 1, 4, 2, 64, 37), (2, 3, 6, 2, 128, 20)),
                    "mla_decode": ((3, 1, 4, 37), (2, 3, 7, 20)),
                    "cascade_decode_attention": ((3, 1, 4, 2, 64, 37, 20), (2, 3, 6, 2, 128, 16, 9)),
                    "linear": ((1, 1, 8), (3, 40, 64), (20, 17, 9)), "gemm": ((1, 8, 8), (20, 17, 9)),
                    "bmm": ((1, 1, 1, 1), (3, 7, 17, 9)), "grouped_mm": ((1, 1, 8, 8), (3, 20, 17, 9)),
                    "diagonal_matmul": ((3, 17), BatchedRowsShape(2, 3, 9, True)),
                    "fused_linear_rowsum": ((1, 1, 1), (7, 33, 5)),
                    "dropout": ((1, 7), (3, 17)), "dropout_add": ((2, 9),),
                    **{op: (GraphShape(1, 1, 1), GraphShape(20, 300, 9)) for op in GROUPS["graph"]}}


def _tally(kf, op, dtype):
    tally = check.Tally()
    for shape in CPU_CHECK_SHAPES[op]:
        for v in SPECS[op].variants:
            check.check_case(kf, op, shape, v, dtype, CPU, tally)
    return tally


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=str)
@pytest.mark.parametrize("op", OPS)
def test_check_cpu(kf, op, dtype):
    """Every spec's check path on CPU tensors: both oracles agree with the op."""
    if SPECS[op].dtypes is not None and dtype not in SPECS[op].dtypes:
        pytest.skip(f"{op} takes {SPECS[op].dtypes}")
    tally = _tally(kf, op, dtype)
    assert tally.cases == len(CPU_CHECK_SHAPES[op]) * len(SPECS[op].variants)
    assert not tally.failures, tally.failures[:4]


@pytest.mark.parametrize("broken", ["causal", "window", "sinks", "dq"])
def test_check_attention_catches(kf, broken):
    """The oracles catch a dropped causal mask, a shifted window, ignored sinks and a gradient 5% off
    (the forward exact)."""

    def attention(q, k, v, **kw):
        if broken == "dq":
            q = q.clone()
            q.register_hook(lambda g: g * 1.05)
        if broken == "causal" and kw["causal"]:
            kw["causal"] = False
        if broken == "window" and kw["window"] != (-1, -1):
            kw["window"] = (kw["window"][0] + 1, kw["window"][1])
        if broken == "sinks":
            kw["sinks"] = None
        return kf.attention(q, k, v, **kw)

    tally = _tally(types.SimpleNamespace(attention=attention), "attention", torch.bfloat16)
    assert tally.failures


@pytest.mark.parametrize("broken", ["window", "sinks", "block_table"])
def test_check_decode_catches(kf, broken):
    """The oracles catch a shifted window, ignored sinks and a block table read as the identity (NaN
    pages)."""

    def decode_attention(q, k_cache, v_cache, seq_lens, block_table, **kw):
        if broken == "window" and kw["window_left"] >= 0:
            kw["window_left"] += 1
        if broken == "sinks":
            kw["sinks"] = None
        if broken == "block_table" and block_table is not None:
            block_table = torch.arange(block_table.numel(), dtype=torch.int32).view_as(block_table) % k_cache.shape[0]
        return kf.decode_attention(q, k_cache, v_cache, seq_lens, block_table, **kw)

    tally = _tally(types.SimpleNamespace(decode_attention=decode_attention), "decode_attention", torch.bfloat16)
    assert tally.failures


@pytest.mark.parametrize("broken", ["bias_dropped", "transposed_rows", "weight_grad_scaled"])
def test_check_linear_catches(kf, broken):
    """The oracles catch a dropped bias, x's rows read in the wrong order and a weight gradient 1% off
    (the forward exact)."""

    def linear(x, w, bias=None):
        if broken == "bias_dropped" and bias is not None:
            bias = bias * 0
        if broken == "transposed_rows" and x.shape[0] > 1:
            x = x.flip(0)
        if broken == "weight_grad_scaled":
            w = w * 1.01 - (w * 0.01).detach()
        return kf.linear(x, w, bias)

    tally = _tally(types.SimpleNamespace(linear=linear), "linear", torch.bfloat16)
    assert tally.failures
    if broken == "weight_grad_scaled":
        assert all("dw vs" in f for f in tally.failures), tally.failures[:4]


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

    tally = _tally(types.SimpleNamespace(apply_rope=apply_rope), "apply_rope", torch.float32)
    assert tally.failures
    if broken == "inplace_skipped":
        assert all("_inplace vs" in f for f in tally.failures)


@pytest.mark.parametrize("broken", ["eps", "weight_ignored", "dweight_scaled"])
def test_check_norm_catches(kf, broken):
    """A wrong eps, a dropped weight and a wrong weight gradient fail."""

    def rms_norm(x, weight, eps):
        if broken == "eps":
            eps = 1e-2
        if broken == "weight_ignored":
            weight = None
        if broken == "dweight_scaled" and weight is not None:
            weight = weight * 1.01 - (weight * 0.01).detach()
        return kf.rms_norm(x, weight, eps)

    tally = _tally(types.SimpleNamespace(rms_norm=rms_norm), "rms_norm", torch.float32)
    assert tally.failures
    if broken == "dweight_scaled":
        assert all("dweight vs" in f for f in tally.failures), tally.failures[:4]


def test_errors_nan_rule():
    """NaN never passes, except where the reference is NaN too (then the positions must match)."""
    nan = float("nan")
    assert check.errors(torch.tensor(nan), torch.tensor(nan, dtype=torch.float64)) == (0.0, 0.0)
    assert check.errors(torch.tensor([nan, 1.0]), torch.tensor([nan, 1.0])) == (0.0, 0.0)
    assert check.errors(torch.tensor([nan, 1.5]), torch.tensor([nan, 1.0]))[0] == pytest.approx(0.5)
    assert check.errors(torch.tensor([0.0, 1.0]), torch.tensor([nan, 1.0]))[0] == math.inf  # NaN expected
    assert check.errors(torch.tensor([nan, 1.0]), torch.tensor([1.0, 1.0]))[0] == math.inf  # NaN got
    assert check.errors(torch.tensor([nan, nan]), torch.tensor([nan, 1.0]))[0] == math.inf


def test_check_tolerance_from_the_table():
    t = TOL[torch.bfloat16]
    assert check.tolerance(SPECS["rms_norm"], "dx", torch.bfloat16) == (t.max_err, t.rel_l2)
    assert check.tolerance(SPECS["fused_linear_cross_entropy"], "dweight", torch.bfloat16) == (2 * t.max_err, 2 * t.rel_l2)
    assert check.tolerance(SPECS["fused_linear_cross_entropy"], "loss", torch.bfloat16) == (t.max_err, t.rel_l2)


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

    tally = _tally(types.SimpleNamespace(cross_entropy=cross_entropy), "cross_entropy", torch.float32)
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

    tally = _tally(types.SimpleNamespace(fused_linear_cross_entropy=fused_linear_cross_entropy),
                   "fused_linear_cross_entropy", torch.float32)
    assert tally.failures
    if broken == "weight_grad_scaled":
        assert all("dweight vs" in f for f in tally.failures), tally.failures[:4]
