"""`kforge bench`: time the ops of kernelforge against the peers, in one run.

Every case is (op, mode, shape, dtype, provider); the ops, their inputs, minimum bytes, FLOPs and
peers are the specs of kernelforge.specs. Providers:

    kernelforge   kf.<op>
    eager         the code the model libraries run (HF LlamaRMSNorm / LlamaMLP / apply_rotary_pos_emb,
                  diffusers AdaLN and GEGLU, vLLM's native silu_and_mul, the HF causal-LM loss)
    torch_native  a fused PyTorch op where one exists (F.rms_norm, F.layer_norm, F.gelu, torch.softmax)
    compile       torch.compile(eager, dynamic=False), warmed up
    liger         Liger-Kernel's Triton kernels, when `liger_kernel` imports
    flash2, cudnn, mem_eff
                  attention: torch's SDPA pinned to SDPBackend.FLASH_ATTENTION (FlashAttention-2;
                  varlen: torch.nn.attention.varlen.varlen_attn), CUDNN_ATTENTION, EFFICIENT_ATTENTION
    flex          attention: torch.compile(flex_attention) with a causal / document block mask

decode_attention's eager peer is a plain PyTorch paged decode (gather, matmul, softmax, matmul), its
cudnn and flash2 peers SDPA on a contiguous [B, Hkv, kv, D] cache (flash2: one new token per
sequence only, it takes no mask). linear's cublas peer is torch.nn.functional.linear (nn.Linear's
forward), compile torch.compile of it. gemm (kf.linear with an activation) runs against eager (F.linear,
then the activation), compile, and torch._addmm_activation (forward only).

No op list: the norm ops, silu_and_mul, geglu and apply_rope (scripts/gpu_run.sh's budget); name ops
or groups (all, norm, activation, rope, softmax, loss, attention, decode, linear, gemm) for the rest. Shapes: ROWSxHIDDEN
(HIDDEN = the output width; the gated ops read [ROWS, 2I]), b{B}s{S}h{Hq}/{Hk}d{D} for apply_rope (q,
k as HF attention hands them over), t{T}h{H}v{V} for fused_linear_cross_entropy,
b{B}h{Hq}[/{Hkv}]s{Sq}[/{Sk}]d{D}[/{Dv}][c][-varlen] for attention (the anchors' form, c = causal),
b{B}h{Hq}[/{Hkv}]kv{kv}d{D}p{page}[q{Lq}] for decode_attention (p0: a contiguous cache),
m{M}n{N}k{K}[-bias][-relu|-gelu_tanh] for linear and gemm (x [M, K], w [N, K]).

Attention and gemm are compute-bound (their specs' bound="compute"): their rows report TFLOP/s (attention:
the anchors' count, 4 * B * H * Sq * Sk * D, halved when causal; gemm: 2 M N K forward, 6 M N K forward +
backward) in a summary table of their own, no copy@size.

Modes: fwd, fwdbwd, and for decode-sized rows (<= 64; apply_rope: batch * seq tokens;
decode_attention: batch * new tokens; linear: M) fwd_graph (CUDA-graph replay of 100 calls,
divided) and fwd_call (wall clock around ~1000 eager calls + one sync, divided: the host path
included). decode_attention's and linear's copy@size is measured at every shape (their few rows read
the whole KV cache, the whole weight).

Method (bench/timing.py): L2 flushed by a zero fill before each timed run, median of the runs, peers
in the same run; GB/s of the minimum traffic, also as a percentage of the run's 1 GiB device-to-
device copy, and copy@size: a copy of the same bytes timed the same way. Each peer's output (and
gradients) is checked against kernelforge's before it is timed.

--sweep times the norm ops over hidden sizes 1024..16384 (step 512, plus model sizes) at 4096 and
16384 rows; --save merges the rows into benchmarks/<gpu>.csv and draws benchmarks/<gpu>_<op>.png.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time

import torch

from ..specs import GROUPS, OPS, SPECS, shape_label, shape_rows
from . import report
from .report import CSV_FIELDS, DTYPES, MODES, PROVIDERS, Result, RunInfo
from .runner import (DECODE_MAX_ROWS, liger_available, modes_for, op_order, parse_shapes, plan_cases,
                     run_case)
from .timing import QUICK, SWEEP, Budget, Timer, measure_copy_at, measure_copy_gbps

DEFAULT_OPS = GROUPS["norm"] + ("silu_and_mul", "geglu") + GROUPS["rope"]
SWEEP_OPS = GROUPS["norm"]
SWEEP_PROVIDERS = ("kernelforge", "eager", "torch_native", "liger")  # compile: name it (minutes per shape grid)
DEFAULT_SAVE_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.realpath(__file__))))), "benchmarks")

__all__ = ["add_arguments", "main", "parse_shapes", "plan_cases", "eager_provider", "Budget", "Timer",
           "CSV_FIELDS", "DEFAULT_OPS"]


def eager_provider(op: str):
    """The eager peer of `op` (the code the model libraries run): t (the spec's inputs) -> outputs."""
    return SPECS[op].eager()


def _csv_list(allowed, what):
    def parse(text):
        items = [s.strip() for s in text.split(",") if s.strip()]
        bad = [s for s in items if s not in allowed]
        if bad or not items:
            raise argparse.ArgumentTypeError(
                f"unknown {what} {', '.join(bad) or '(none)'}; choose from {', '.join(allowed)}")
        return items
    return parse


def _int_list(text):
    try:
        items = [int(s) for s in text.split(",") if s.strip()]
    except ValueError:
        items = []
    if not items or min(items) <= 0:
        raise argparse.ArgumentTypeError(f"--rows {text!r}: a comma list of positive integers, e.g. 4096,16384")
    return items


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("ops", nargs="*", metavar="OP",
                   help=f"ops to time: {' '.join(OPS)}, or a group: {' '.join(GROUPS)} (default: "
                        f"{' '.join(DEFAULT_OPS)}; with --sweep: {' '.join(SWEEP_OPS)})")
    p.add_argument("--ops", dest="ops_list", default=None,
                   help="the same as a comma list, e.g. --ops activation or --ops rms_norm,swiglu")
    p.add_argument("--shapes", type=parse_shapes, default=None,
                   help="ROWSxHIDDEN list, e.g. 16384x4096,1x4096; apply_rope takes b{B}s{S}h{Hq}/{Hk}d{D} "
                        "items, fused_linear_cross_entropy t{T}h{H}v{V}, linear m{M}n{N}k{K}[-bias]; each op "
                        "runs the items of its kind "
                        "(default: each op's spec shapes)")
    p.add_argument("--dtype", type=_csv_list(tuple(DTYPES), "dtype"), default=["bf16"],
                   help="bf16 | fp16 | fp32 (comma list allowed; default bf16)")
    p.add_argument("--providers", type=_csv_list(PROVIDERS, "provider"), default=None,
                   help=f"comma list of {','.join(PROVIDERS)} (default all; with --sweep "
                        f"{','.join(SWEEP_PROVIDERS)}); kernelforge always runs: it is the reference of "
                        "the peers' check and the speedup")
    p.add_argument("--modes", type=_csv_list(MODES, "mode"), default=list(MODES),
                   help=f"comma list of {','.join(MODES)} (fwd_graph, fwd_call only for rows <= "
                        f"{DECODE_MAX_ROWS}; apply_rope: batch * seq tokens)")
    p.add_argument("--rows", type=_int_list, default=None,
                   help="keep the shapes with these rows (tokens), e.g. --sweep --rows 4096")
    p.add_argument("--sweep", action="store_true",
                   help="the norm hidden-size grid: rows 4096, 16384 x hidden 1024..16384 step 512 plus "
                        "2880, 11008 (and the model sizes on the grid), fwd and fwdbwd, copy@size and the "
                        "best peer per case; filter with --rows and ops")
    p.add_argument("--plan", action="store_true",
                   help="print kf.last_plan() of each kernelforge case after its correctness run")
    p.add_argument("--save", action="store_true",
                   help="merge this run's rows into <out-dir>/<gpu>.csv (gpu: h100, h200, ...) and draw "
                        "<out-dir>/<gpu>_<op>.png per op")
    p.add_argument("--out-dir", default=DEFAULT_SAVE_DIR,
                   help="folder of --save (default: the repository's benchmarks/)")
    p.add_argument("--out", default="bench_out", help="folder of this run's bench.csv, summary.txt and "
                                                      "PNGs (default bench_out)")
    p.add_argument("--quick", action="store_true", help="few repetitions (smoke tests)")
    p.add_argument("--max-seconds", type=float, default=0.0,
                   help="soft time budget: no new case starts after it (outputs still written)")
    p.add_argument("--device", default="cuda", help=argparse.SUPPRESS)  # cpu: smoke tests only


def resolve_ops(args) -> list[str] | None:
    """The ops of the run, or None after printing why the list is bad."""
    named = list(args.ops) + [o.strip() for o in (args.ops_list or "").split(",") if o.strip()]
    bad = [o for o in named if o not in OPS and o not in GROUPS]
    if bad:
        print(f"kforge bench: unknown op {', '.join(bad)}; choose from {' '.join(OPS)} or a group "
              f"({' '.join(GROUPS)})", file=sys.stderr)
        return None
    expanded = [o for n in named for o in GROUPS.get(n, (n,))]
    ops = list(dict.fromkeys(expanded or (SWEEP_OPS if args.sweep else DEFAULT_OPS)))
    if args.sweep:
        no_grid = [o for o in ops if not SPECS[o].sweep_shapes]
        if no_grid:
            print(f"kforge bench: --sweep has no grid for {', '.join(no_grid)} (sweep ops: "
                  f"{' '.join(o for o in OPS if SPECS[o].sweep_shapes)})", file=sys.stderr)
            return None
    return ops


def _device(args):
    device = torch.device(args.device)
    if device.type == "cuda" and device.index is None and torch.cuda.is_available():
        device = torch.device("cuda", torch.cuda.current_device())
    return device


def _ops_loaded() -> str:
    """'' when the kernelforge ops load, else why not."""
    try:
        import kernelforge  # noqa: F401, PLC0415

        torch.ops.kernelforge.rms_norm  # noqa: B018
    except Exception as e:  # noqa: BLE001
        return f"{type(e).__name__}: {e}"
    return ""


def main(args: argparse.Namespace) -> int:
    t_start = time.monotonic()
    ops = resolve_ops(args)
    if ops is None:
        return 2
    args.ops = ops
    device = _device(args)
    if device.type == "cuda" and not torch.cuda.is_available():
        print("kforge bench: no CUDA GPU is visible (torch.cuda.is_available() is False); "
              "the benchmark times CUDA kernels and needs one.", file=sys.stderr)
        return 2
    why = _ops_loaded()
    if why:
        print(f"kforge bench: the kernelforge ops are not loaded ({why}). Build the extension first "
              "(scripts/dev_build.sh copies it to python/kernelforge/).", file=sys.stderr)
        return 2

    wanted = args.providers or list(SWEEP_PROVIDERS if args.sweep else PROVIDERS)
    providers = ["kernelforge"] + [p for p in wanted if p != "kernelforge"]
    if "liger" in providers and not liger_available():
        print("note: liger_kernel is not importable: no liger peer in this run", flush=True)
        providers.remove("liger")
    budget = QUICK if args.quick else SWEEP if args.sweep else Budget()
    cfg = torch._dynamo.config
    for name in ("recompile_limit", "cache_size_limit", "accumulated_recompile_limit",
                 "accumulated_cache_size_limit"):
        if hasattr(cfg, name):
            setattr(cfg, name, max(getattr(cfg, name), 256))

    if device.type == "cuda":
        torch.cuda.set_device(device)
        gpu = torch.cuda.get_device_name(device)
    else:
        gpu = "cpu"
    info = RunInfo(gpu=gpu, torch_version=torch.__version__, commit=report.git_commit(),
                   copy_gbps=measure_copy_gbps(device))
    timer = Timer(device, budget)
    os.makedirs(args.out, exist_ok=True)
    csv_path = os.path.join(args.out, "bench.csv")
    sink = report.CsvSink(csv_path, info)
    cases = plan_cases(args.ops, args.shapes, args.dtype, sweep=args.sweep, rows=args.rows)
    unplanned = [op for op in args.ops if not any(c[0] == op for c in cases)]
    if unplanned:
        print(f"note: no shape for {', '.join(unplanned)} (--shapes items of its kind: ROWSxHIDDEN, "
              "b{B}s{S}h{Hq}/{Hk}d{D} for apply_rope, t{T}h{H}v{V} for fused_linear_cross_entropy, "
              "b{B}h{Hq}[/{Hkv}]kv{kv}d{D}p{page}[q{Lq}] for decode_attention, m{M}n{N}k{K}[-bias] for linear; "
              "--rows): not run", flush=True)
    n_meas = sum(len(modes_for(shape_rows(dims), args.modes, SPECS[op]))
                 * len([p for p in providers if p in SPECS[op].providers
                        and (SPECS[op].peer_applies is None or SPECS[op].peer_applies(p, dims))])
                 for op, dims, _ in cases)
    print(f"kforge bench on {gpu} | torch {info.torch_version} | commit {info.commit or '-'} | "
          f"D2D copy {info.copy_gbps:.0f} GB/s | {len(cases)} cases, {n_meas} measurements | "
          f"providers {','.join(providers)}", flush=True)
    counter = [0]

    def log(res: Result, info: RunInfo):
        counter[0] += 1
        d = report.derived(res, info.copy_gbps, float("nan"))
        if SPECS[res.op].bound == "compute":
            gb = f"{d['tflops']:8.1f} TFLOP/s" if math.isfinite(d["tflops"]) else f"{'-':>8} TFLOP/s"
        else:
            gb = (f"{d['gbps']:8.1f} GB/s {d['pct']:5.1f}%" if math.isfinite(d["gbps"]) and math.isfinite(d["pct"])
                  else f"{d['gbps']:8.1f} GB/s {'-':>5} " if math.isfinite(d["gbps"]) else f"{'-':>8} GB/s {'-':>5} ")
        us = f"{res.ms * 1e3:10.2f} us" if math.isfinite(res.ms) else f"{'nan':>10} us"
        print(f"[{counter[0]:>4}/{n_meas}] {res.op:<12} {res.mode:<9} {res.shape:<17} {res.dtype:<4} "
              f"{res.provider:<12} {us} {gb} {res.note}", flush=True)

    all_groups: list[list[Result]] = []
    skipped = 0
    for op, dims, dt in cases:
        if args.max_seconds and time.monotonic() - t_start > args.max_seconds:
            skipped += 1
            continue
        spec = SPECS[op]
        if device.type == "cuda" and spec.bound == "memory":  # copy@size: a copy of the same bytes, timed the same way
            for m in ("fwd", "fwdbwd"):
                nbytes = spec.traffic(dims, m, report.elt_size(dt))
                # decode_attention reads the whole KV cache, linear the whole weight: their few rows
                # still move megabytes
                sized = shape_rows(dims) > DECODE_MAX_ROWS or spec.shape_kind in ("decode", "cascade", "linear")
                if m in args.modes and sized and nbytes not in info.copy_at:
                    try:
                        info.copy_at[nbytes] = measure_copy_at(nbytes, timer)
                    except torch.OutOfMemoryError:
                        torch.cuda.empty_cache()
        try:
            groups = run_case(op, dims, dt, args.modes, timer, info,
                              [p for p in providers if p in spec.providers], log, show_plan=args.plan)
        except Exception as e:  # noqa: BLE001  (e.g. inputs out of memory: skip the case, go on)
            msg = str(e).strip().splitlines()[0] if str(e).strip() else ""
            line = f"{op} {shape_label(dims)} {dt}: case skipped: {type(e).__name__}: {msg[:200]}"
            info.problems.append(line)
            print(f"!! {line}", flush=True)
            if device.type == "cuda":
                torch.cuda.empty_cache()
            continue
        for g in groups:
            sink.write_group(g)
        all_groups.extend(groups)
    sink.close()
    if skipped:
        info.problems.append(f"time budget --max-seconds {args.max_seconds:.0f} reached: "
                             f"{skipped} case(s) not run")

    title = f"kernelforge on {gpu} (torch {info.torch_version}, {info.commit or 'no commit'})"
    pngs, problems = report.write_pngs(args.ops, sink.rows, title, lambda op: os.path.join(args.out, f"{op}.png"))
    info.problems += problems
    saved = []
    if args.save:
        path, save_pngs, problems = report.save(sink.rows, info, args.out_dir)
        info.problems += problems
        saved = [path] + save_pngs

    lines = [f"kforge bench summary: {gpu}, torch {info.torch_version}, commit {info.commit or '-'}, "
             f"D2D copy {info.copy_gbps:.0f} GB/s; speedup = best peer time / kernelforge time; "
             "copy@size = GB/s of a copy of the same bytes timed the same way, % = kernelforge's share of it", ""]
    ordered = op_order(all_groups, args.ops)
    lines += report.summary_lines(ordered, info)
    lines += report.memory_lines(ordered)
    if info.problems:
        lines += ["", "problems:"] + [f"  {p}" for p in report.merge_problems(info.problems)]
    lines += ["", f"csv: {csv_path}", f"png: {', '.join(pngs) or '-'}"]
    if args.save:
        lines.append(f"saved: {', '.join(saved)}")
    lines.append(f"wall: {time.monotonic() - t_start:.0f} s")
    text = "\n".join(lines)
    with open(os.path.join(args.out, "summary.txt"), "w") as f:
        f.write(text + "\n")
    print("\n" + text, flush=True)
    return 0
