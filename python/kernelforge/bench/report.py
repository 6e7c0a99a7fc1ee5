"""The report of `kforge bench`: results, the CSV schema, the summary table, the plots and --save.

One CSV row per (op, mode, shape, dtype, provider):
    ms_median, gbps (minimum traffic / time), tflops (nominal FLOPs / time), pct_of_copy_bw (of the
    1 GiB device-to-device copy of the run), speedup_vs_best_peer (best peer time / this time),
    gpu, torch_version, commit, copy_same_bytes_gbps (copy@size: a copy of the same bytes timed the
    same way), pct_of_copy_same_bytes, peak_extra_mib (loss ops: peak memory above inputs/outputs).
"""

from __future__ import annotations

import csv
import math
import os
import re
import subprocess
import sys
from dataclasses import dataclass, field

import torch

from ..specs import SPECS, shape_label

CSV_FIELDS = ("op", "mode", "shape", "dtype", "provider", "ms_median", "gbps", "tflops",
              "pct_of_copy_bw", "speedup_vs_best_peer", "gpu", "torch_version", "commit",
              "copy_same_bytes_gbps", "pct_of_copy_same_bytes", "peak_extra_mib")
MODES = ("fwd", "fwdbwd", "fwd_graph", "fwd_call")
PROVIDERS = ("kernelforge", "eager", "torch_native", "compile", "liger", "flash2", "cudnn", "mem_eff", "flex",
             "cublas", "addmm_act", "torch_sparse_mm", "torch_grouped", "loop", "kf_decode")
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
NAN = float("nan")


@dataclass
class Result:
    op: str
    mode: str
    dims: tuple  # (rows, hidden), a RopeShape or a FlceShape
    dtype: str
    provider: str
    ms: float
    note: str = ""
    peak_mib: float = NAN  # loss ops: peak memory of one call above inputs and outputs

    @property
    def shape(self) -> str:
        return shape_label(self.dims)


@dataclass
class RunInfo:
    gpu: str
    torch_version: str
    commit: str
    copy_gbps: float
    problems: list = field(default_factory=list)
    # GB/s of a device-to-device copy moving the same bytes as one measurement, timed by the same
    # Timer (flush, head start): the ceiling at that size, fixed costs included (see notes/bench.md).
    copy_at: dict = field(default_factory=dict)


def elt_size(dt: str) -> int:
    return torch.empty((), dtype=DTYPES[dt]).element_size()


def gpu_short_name(name: str) -> str:
    """A short lowercase device name for file names: "NVIDIA H100 80GB HBM3" -> h100, "NVIDIA A100-SXM4-
    80GB" -> a100, "Tesla T4" -> t4, "NVIDIA GeForce RTX 4090" -> rtx4090; "cpu" stays cpu."""
    s = name.lower()
    for word in ("nvidia", "tesla", "geforce", "quadro"):
        s = s.replace(word, " ")
    s = re.sub(r"\brtx\s+", "rtx", s)
    for tok in re.split(r"[\s_-]+", s):
        if re.fullmatch(r"[a-z]*\d+[a-z]*", tok) and not re.fullmatch(r"\d+gb", tok):
            return tok
    return re.sub(r"[^a-z0-9]+", "_", s).strip("_") or "gpu"


def git_commit() -> str:
    env = os.environ.get("KF_COMMIT")
    if env:
        return env
    here = os.path.dirname(os.path.realpath(__file__))
    try:
        sha = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=here, capture_output=True,
                             text=True, timeout=10)
        if sha.returncode != 0:
            return ""
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=here,
                               capture_output=True, text=True, timeout=10)
        return sha.stdout.strip() + ("-dirty" if dirty.stdout.strip() else "")
    except (OSError, subprocess.SubprocessError):
        return ""


def _finite(v: float) -> bool:
    return isinstance(v, float) and math.isfinite(v)


def derived(res: Result, copy_gbps: float, best_peer_ms: float, copy_at: dict | None = None) -> dict:
    """gbps (minimum bytes / time), tflops, pct of the 1 GiB copy, speedup, copy@size and its pct."""
    spec = SPECS[res.op]
    ok = _finite(res.ms) and res.ms > 0
    nbytes = spec.traffic(res.dims, res.mode, elt_size(res.dtype))
    gbps = nbytes / (res.ms * 1e-3) / 1e9 if ok else NAN
    tflops = spec.flop_count(res.dims, res.mode) / (res.ms * 1e-3) / 1e12 if ok else NAN
    memory = spec.bound == "memory"  # compute-bound ops (attention): no share of a copy's bandwidth
    pct = 100.0 * gbps / copy_gbps if ok and memory and _finite(copy_gbps) else NAN
    speed = best_peer_ms / res.ms if ok and _finite(best_peer_ms) else NAN
    size_copy = (copy_at or {}).get(nbytes, NAN) if memory and res.mode in ("fwd", "fwdbwd") else NAN
    pct_size = 100.0 * gbps / size_copy if ok and _finite(size_copy) else NAN
    return {"gbps": gbps, "tflops": tflops, "pct": pct, "speedup": speed, "size_copy": size_copy,
            "pct_size": pct_size}


def best_peer(results: list[Result]) -> tuple[str, float]:
    peers = [r for r in results if r.provider != "kernelforge" and _finite(r.ms)]
    if not peers:
        return "", NAN
    b = min(peers, key=lambda r: r.ms)
    return b.provider, b.ms


def _num(v: float, digits: int) -> str:
    return f"{v:.{digits}f}" if _finite(v) else ""


def csv_rows(group: list[Result], info: RunInfo) -> list[dict]:
    """The CSV rows of one group (same op / mode / shape / dtype)."""
    _, peer_ms = best_peer(group)
    rows = []
    for r in group:
        d = derived(r, info.copy_gbps, peer_ms, info.copy_at)
        rows.append(dict(zip(CSV_FIELDS, (
            r.op, r.mode, r.shape, r.dtype, r.provider, "nan" if not _finite(r.ms) else f"{r.ms:.5f}",
            _num(d["gbps"], 1), _num(d["tflops"], 3), _num(d["pct"], 1), _num(d["speedup"], 3), info.gpu,
            info.torch_version, info.commit, _num(d["size_copy"], 1), _num(d["pct_size"], 1),
            _num(r.peak_mib, 1)))))
    return rows


class CsvSink:
    """Writes one group of rows at a time, so a killed run keeps them; collects them for --save."""

    def __init__(self, path: str, info: RunInfo):
        self.info = info
        self.rows: list[dict] = []
        self.f = open(path, "w", newline="")
        self.w = csv.DictWriter(self.f, fieldnames=CSV_FIELDS)
        self.w.writeheader()
        self.f.flush()

    def write_group(self, group: list[Result]) -> None:
        rows = csv_rows(group, self.info)
        self.w.writerows(rows)
        self.rows += rows
        self.f.flush()

    def close(self) -> None:
        self.f.close()


# ---- summary --------------------------------------------------------------------------------------


def merge_problems(problems: list) -> list[str]:
    """One line per (op, shape, dtype, provider, note), listing the modes it happened in."""
    merged: dict = {}
    for p in problems:
        if isinstance(p, tuple):
            merged.setdefault(p[0], []).append(p[1])
        else:
            merged.setdefault((p,), [])
    out = []
    for key, modes in merged.items():
        if len(key) == 1:
            out.append(key[0])
        else:
            op, shape, dt, name, note = key
            out.append(f"{op} {shape} {dt} {name} [{','.join(modes)}]: {note}")
    return out


def summary_lines(groups: list[list[Result]], info: RunInfo) -> list[str]:
    """The memory-bound ops' table (GB/s, % of the copy, copy@size), then the compute-bound ops'
    (TFLOP/s) when the run has any."""
    memory = [g for g in groups if g and SPECS[g[0].op].bound == "memory"]
    compute = [g for g in groups if g and SPECS[g[0].op].bound == "compute"]
    lines = _memory_lines(memory, info) if memory or not compute else []
    if compute:
        lines += ([""] if lines else []) + _compute_lines(compute, info)
    return lines


def _compute_lines(groups: list[list[Result]], info: RunInfo) -> list[str]:
    head = (f"{'op':<13} {'mode':<9} {'shape':<24} {'dtype':<5} {'kf us':>10} {'kf TFLOP/s':>10} "
            f"{'best peer':<13} {'peer us':>10} {'peer TFLOP/s':>12} {'speedup':>8}")
    lines = [head, "-" * len(head)]

    def f(v, d):
        return f"{v:.{d}f}" if _finite(v) else "-"

    for group in groups:
        r0 = group[0]
        peer_name, peer_ms = best_peer(group)
        kf = next((r for r in group if r.provider == "kernelforge"), None)
        kf_ms = kf.ms if kf else NAN
        kfd = derived(kf, info.copy_gbps, peer_ms) if kf else {"tflops": NAN, "speedup": NAN}
        flops = SPECS[r0.op].flop_count(r0.dims, r0.mode)
        peer_tf = flops / (peer_ms * 1e-3) / 1e12 if _finite(peer_ms) else NAN
        speed = (f(kfd["speedup"], 2) + "x") if _finite(kfd["speedup"]) else "-"
        lines.append(f"{r0.op:<13} {r0.mode:<9} {r0.shape:<24} {r0.dtype:<5} {f(kf_ms * 1e3, 1):>10} "
                     f"{f(kfd['tflops'], 1):>10} {peer_name or '-':<13} {f(peer_ms * 1e3, 1):>10} "
                     f"{f(peer_tf, 1):>12} {speed:>8}")
    return lines


def _memory_lines(groups: list[list[Result]], info: RunInfo) -> list[str]:
    head = (f"{'op':<13} {'mode':<9} {'shape':<17} {'dtype':<5} {'kf us':>9} {'kf GB/s':>8} "
            f"{'%copy':>6} {'best peer':<13} {'peer us':>9} {'peer GB/s':>9} {'speedup':>8} "
            f"{'copy@size':>9} {'%':>5}")
    lines = [head, "-" * len(head)]

    def f(v, d):
        return f"{v:.{d}f}" if _finite(v) else "-"

    for group in groups:
        if not group:
            continue
        r0 = group[0]
        peer_name, peer_ms = best_peer(group)
        kf = next((r for r in group if r.provider == "kernelforge"), None)
        kf_ms = kf.ms if kf else NAN
        kfd = (derived(kf, info.copy_gbps, peer_ms, info.copy_at) if kf else
               {"gbps": NAN, "pct": NAN, "speedup": NAN, "size_copy": NAN, "pct_size": NAN})
        peer_gbps = (SPECS[r0.op].traffic(r0.dims, r0.mode, elt_size(r0.dtype)) / (peer_ms * 1e-3) / 1e9
                     if _finite(peer_ms) else NAN)
        speed = (f(kfd["speedup"], 2) + "x") if _finite(kfd["speedup"]) else "-"
        lines.append(f"{r0.op:<13} {r0.mode:<9} {r0.shape:<17} {r0.dtype:<5} {f(kf_ms * 1e3, 2):>9} "
                     f"{f(kfd['gbps'], 0):>8} {f(kfd['pct'], 1):>6} {peer_name or '-':<13} "
                     f"{f(peer_ms * 1e3, 2):>9} {f(peer_gbps, 0):>9} {speed:>8} "
                     f"{f(kfd['size_copy'], 0):>9} {f(kfd['pct_size'], 1):>5}")
    return lines


def memory_lines(groups: list[list[Result]]) -> list[str]:
    """Loss ops: peak memory above inputs and outputs per provider, and kernelforge's share of eager's."""
    lines = []
    for group in groups:
        if not group or not SPECS[group[0].op].measure_memory or group[0].mode not in ("fwd", "fwdbwd"):
            continue
        r0 = group[0]
        by = {r.provider: r.peak_mib for r in group if _finite(r.peak_mib)}
        if not by:
            continue
        share = (f" (kernelforge = {100 * by['kernelforge'] / by['eager']:.1f}% of eager)"
                 if by.get("kernelforge") is not None and by.get("eager") else "")
        lines.append(f"{r0.op} {r0.mode} {r0.shape} {r0.dtype}: "
                     + ", ".join(f"{k} {v:.0f} MiB" for k, v in by.items()) + share)
    return (["", "peak memory above inputs and outputs (one call):"] + lines) if lines else []


# ---- plots ----------------------------------------------------------------------------------------

PROVIDER_COLORS = {"kernelforge": "#d62728", "eager": "#7f7f7f", "torch_native": "#1f77b4",
                   "compile": "#2ca02c", "liger": "#ff7f0e", "flash2": "#9467bd", "cudnn": "#8c564b",
                   "mem_eff": "#e377c2", "flex": "#17becf", "cublas": "#bcbd22",
                   "addmm_act": "#aec7e8", "torch_grouped": "#1f77b4", "loop": "#bcbd22"}
MAX_BARS = 16  # more shapes than this in a mode: lines instead of bars


def have_matplotlib() -> bool:
    try:
        import matplotlib  # noqa: F401, PLC0415
    except ImportError:
        return False
    return True


def _float(row: dict, key: str) -> float:
    try:
        return float(row.get(key) or "nan")
    except ValueError:
        return NAN


def plot_op(op: str, rows: list[dict], title: str, path: str) -> bool:
    """GB/s per shape and provider of one op's CSV rows, one panel per mode, with the speed of light:
    copy@size (a copy of the same bytes timed the same way) per shape where measured, else the run's
    1 GiB copy bandwidth. Compute-bound ops (attention): TFLOP/s, no speed-of-light line. Returns
    False when there is nothing to plot."""
    import matplotlib  # noqa: PLC0415

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    rows = [r for r in rows if r["op"] == op]
    compute = op in SPECS and SPECS[op].bound == "compute"
    metric = "tflops" if compute else "gbps"
    modes = [m for m in MODES if any(r["mode"] == m for r in rows)]
    if not modes:
        return False
    keys = {m: list(dict.fromkeys((r["shape"], r["dtype"]) for r in rows if r["mode"] == m)) for m in modes}
    n_max = max(len(k) for k in keys.values())
    fig, axes = plt.subplots(len(modes), 1, figsize=(min(max(8.0, 0.9 * n_max + 4), 30), 3.8 * len(modes)),
                             squeeze=False)
    for ax, mode in zip(axes[:, 0], modes):
        mk = keys[mode]
        mrows = [r for r in rows if r["mode"] == mode]
        provs = [p for p in PROVIDERS if any(r["provider"] == p for r in mrows)]
        bars = len(mk) <= MAX_BARS
        width = 0.8 / max(len(provs), 1)
        vals_all = []
        for j, p in enumerate(provs):
            by = {(r["shape"], r["dtype"]): _float(r, metric) for r in mrows if r["provider"] == p}
            xs = [i for i, k in enumerate(mk) if k in by]
            vals = [by[mk[i]] if math.isfinite(by[mk[i]]) else 0.0 for i in xs]
            vals_all += [v for v in vals if v > 0]
            if bars:
                xb = [i - 0.4 + width * (j + 0.5) for i in xs]
                ax.bar(xb, vals, width, label=p, color=PROVIDER_COLORS.get(p))
                for x, v in zip(xb, vals):
                    if v == 0.0:  # failed or not run: mark the empty slot
                        ax.text(x, 0.01, "x", transform=ax.get_xaxis_transform(), ha="center", va="bottom",
                                fontsize=8, color=PROVIDER_COLORS.get(p))
            else:
                ax.plot(xs, [v if v > 0 else math.nan for v in vals], marker=".", label=p,
                        color=PROVIDER_COLORS.get(p))
        sol = [NAN if compute else
               max((_float(r, "copy_same_bytes_gbps") for r in mrows if (r["shape"], r["dtype"]) == k), default=NAN)
               for k in mk]
        sol = [v if math.isfinite(v) else math.nan for v in sol]
        if any(math.isfinite(v) for v in sol):
            ax.plot(range(len(mk)), sol, "k--", linewidth=1, marker="_" if bars else None,
                    label="speed of light (copy@size)")
            vals_all += [v for v in sol if math.isfinite(v)]
        else:
            copy = [] if compute else [_float(r, "gbps") * 100 / _float(r, "pct_of_copy_bw") for r in mrows
                                       if _float(r, "pct_of_copy_bw") > 0]
            if copy:
                ax.axhline(copy[0], color="k", linestyle="--", linewidth=1,
                           label=f"speed of light (D2D copy {copy[0]:.0f} GB/s)")
                vals_all.append(copy[0])
        if vals_all and max(vals_all) / min(vals_all) > 50:
            ax.set_yscale("log")
        step = max(1, len(mk) // 40)
        ax.set_xticks(range(0, len(mk), step))
        ax.set_xticklabels([f"{s}\n{d}" if bars else s for s, d in mk[::step]], fontsize=7,
                           rotation=0 if bars else 90)
        ax.set_ylabel("TFLOP/s" if compute else "GB/s (minimum traffic)")
        ax.set_title(f"{op} {mode}", fontsize=10)
        ax.legend(fontsize=7, ncol=1, loc="upper left", bbox_to_anchor=(1.0, 1.0))
        ax.grid(axis="y", alpha=0.3)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def write_pngs(ops, rows: list[dict], title: str, path_of) -> tuple[list[str], list[str]]:
    """One PNG per op (path_of(op)); returns (paths written, problems). Without matplotlib: none, with
    a warning."""
    if not have_matplotlib():
        print("warning: matplotlib is not importable: no PNGs (the CSV and the summary are written)",
              file=sys.stderr, flush=True)
        return [], []
    paths, problems = [], []
    for op in ops:
        path = path_of(op)
        try:
            if plot_op(op, rows, title, path):
                paths.append(path)
        except Exception as e:  # noqa: BLE001  (a plot must not lose the CSV and the summary)
            problems.append(f"plot {op}: {type(e).__name__}: {e}")
    return paths, problems


# ---- --save: benchmarks/<gpu>.csv and benchmarks/<gpu>_<op>.png -------------------------------------

KEY = ("op", "mode", "shape", "dtype", "provider")


def save(rows: list[dict], info: RunInfo, out_dir: str) -> tuple[str, list[str], list[str]]:
    """Rewrites out_dir/<gpu>.csv: the rows of this run replace the rows of the same (op, mode, shape,
    dtype, provider), the others stay; then one PNG per op of the file, out_dir/<gpu>_<op>.png.
    Returns (csv path, png paths, problems)."""
    os.makedirs(out_dir, exist_ok=True)
    gpu = gpu_short_name(info.gpu)
    path = os.path.join(out_dir, f"{gpu}.csv")
    merged: dict = {}
    if os.path.exists(path):
        with open(path, newline="") as f:
            for r in csv.DictReader(f):
                if all(k in r for k in KEY):
                    merged[tuple(r[k] for k in KEY)] = {k: r.get(k, "") for k in CSV_FIELDS}
    for r in rows:
        merged[tuple(r[k] for k in KEY)] = r
    all_rows = list(merged.values())
    tmp = path + ".tmp"
    with open(tmp, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=CSV_FIELDS)
        w.writeheader()
        w.writerows(all_rows)
    os.replace(tmp, path)
    ops = [op for op in SPECS if any(r["op"] == op for r in all_rows)]
    title = f"kernelforge on {info.gpu} (torch {info.torch_version}, {info.commit or 'no commit'})"
    pngs, problems = write_pngs(ops, all_rows, title, lambda op: os.path.join(out_dir, f"{gpu}_{op}.png"))
    return path, pngs, problems
