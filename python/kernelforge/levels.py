"""`kforge levels`: one model at each optimization level, side by side, on this machine.

Levels, each on a fresh copy of the same weights, one after another in this process:
  eager                the model as written
  torchscript          torch.jit.trace of the step's forward (unavailable where tracing fails)
  compile              torch.compile of the model
  triton               Liger-Kernel's Triton kernels (apply_liger_kernel_to_llama) where Liger has the model
  kernelforge          kf.patch(model)
  kernelforge_compile  torch.compile of the patched model

Models: lm, llama, vit, gnn, ltx (kernelforge/models.py; ``--size small``: 2-layer versions, for
smoke tests). The GNN is PyG's SAGEConv where torch_geometric is installed (``kf.patch`` runs its
aggregation as ``gather_scatter``); without it, a hand-written layer that has no kernelforge level.

Modes: ``fwd`` (forward without autograd) and ``train`` (forward and the backward of the mean square
of the output, the same loss at every level, TorchScript included).
Per (model, mode, level): milliseconds per step (median; CUDA events on the GPU), the speed-up over
eager, the peak memory (CUDA), and the error of the output against a float32 eager run of the same
weights (||y - y_fp32|| / ||y_fp32||). Writes OUT/levels.csv and OUT/levels_<model>.png and prints
the table.

    kforge levels [--models lm,llama,vit,gnn] [--levels ...] [--modes fwd,train] [--size full|small]
                  [--device cuda|cpu] [--warmup N] [--iters N] [--quick] [--out DIR]
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import csv
import dataclasses
import os
import statistics
import sys
import warnings
from dataclasses import dataclass
from typing import Callable

import torch
from torch import nn

from .models import MODELS, Model, Progress, add_model_arguments, csv_list, resolve_device, time_step_ms

LEVELS = ("eager", "torchscript", "compile", "triton", "kernelforge", "kernelforge_compile")
MODES = ("fwd", "train")


class Unavailable(Exception):
    """A level that does not apply to a model (the reason is reported, the run goes on)."""


# ---- levels ----------------------------------------------------------------------------------------------


class _Traced(nn.Module):
    """The model's forward on positional tensors, for torch.jit.trace."""

    def __init__(self, model: Model):
        super().__init__()
        self.inner = model.module
        self.fn = model.forward

    def forward(self, *inputs):
        return self.fn(self.inner, *inputs)


def apply_level(level: str, model: Model) -> Callable:
    """(*inputs) -> output of ``model`` at ``level`` (the module copy is modified in place)."""
    import kernelforge as kf  # noqa: PLC0415

    m = model.module
    if level in ("kernelforge", "kernelforge_compile"):
        report = kf.patch(m)
        if not report.patched:
            raise Unavailable("kf.patch finds nothing to patch"
                              + (" (torch_geometric is not installed: the GNN is not built from PyG layers)"
                                 if model.kind == "gnn" else ""))
    if level == "triton":
        if model.kind != "llama":
            raise Unavailable("Liger-Kernel has no kernels for this model")
        if any(p.device.type != "cuda" for p in m.parameters()):
            raise Unavailable("Liger-Kernel's Triton kernels run on CUDA tensors only")
        try:
            from liger_kernel.transformers import apply_liger_kernel_to_llama  # noqa: PLC0415
        except ImportError:
            raise Unavailable("liger_kernel is not installed") from None
        apply_liger_kernel_to_llama(model=m)
    if level == "torchscript":
        try:
            with warnings.catch_warnings():  # TorchScript's deprecation and tracer warnings: the level is measured as is
                warnings.simplefilter("ignore")
                traced = torch.jit.trace(_Traced(model), model.inputs, strict=False, check_trace=False)
        except Exception as e:  # noqa: BLE001  (any tracing failure makes the level unavailable)
            raise Unavailable(f"torch.jit.trace failed: {str(e).splitlines()[0][:120]}") from None
        return lambda *inputs: traced(*inputs)
    if level in ("compile", "kernelforge_compile"):
        compiled = torch.compile(m)
        return lambda *inputs: model.forward(compiled, *inputs)
    return lambda *inputs: model.forward(m, *inputs)


def rel_err(y: torch.Tensor, ref: torch.Tensor) -> float:
    y, ref = y.detach().double(), ref.detach().double()
    if not torch.isfinite(y).all():
        return float("inf")
    return ((y - ref).norm() / ref.norm().clamp_min(1e-30)).item()


@dataclass
class Row:
    model: str
    mode: str
    level: str
    ms: float = float("nan")
    speedup: float = float("nan")
    peak_mib: float = float("nan")
    err: float = float("nan")
    status: str = "ok"


@contextlib.contextmanager
def _module_globals_restored(prefix: str):
    """Puts back every global of the ``prefix*`` modules that the block rebinds.

    Liger's apply_liger_kernel_to_* rebinds classes and functions in transformers' modeling modules, not
    only on the model it is given; left in place, every later level in the process would run Liger's
    kernels (and every model built later, CPU ones included)."""
    saved = {name: dict(vars(mod)) for name, mod in list(sys.modules.items())
             if mod is not None and (name == prefix or name.startswith(prefix + "."))}
    try:
        yield
    finally:
        for name, before in saved.items():
            mod = sys.modules.get(name)
            if mod is None:
                continue
            now = vars(mod)
            for key, value in before.items():
                if now.get(key, before) is not value:
                    setattr(mod, key, value)


def run_level(model: Model, level: str, mode: str, ref: torch.Tensor, device: str, warmup: int, iters: int) -> Row:
    if level != "triton":
        return _run_level(model, level, mode, ref, device, warmup, iters)
    with _module_globals_restored("transformers"):
        return _run_level(model, level, mode, ref, device, warmup, iters)


def _run_level(model: Model, level: str, mode: str, ref: torch.Tensor, device: str, warmup: int, iters: int) -> Row:
    row = Row("", mode, level)
    m = dataclasses.replace(model, module=copy.deepcopy(model.module).train(mode == "train"))
    try:
        fn = apply_level(level, m)
    except Unavailable as e:
        row.status = f"unavailable: {e}"
        return row
    params = [p for p in m.module.parameters() if p.requires_grad]

    def step():
        if mode == "fwd":
            with torch.no_grad():
                return fn(*m.inputs)
        y = fn(*m.inputs)
        y.float().square().mean().backward()
        for p in params:
            p.grad = None
        return y

    try:
        if device == "cuda":
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        y = step()
        for _ in range(max(0, warmup - 1)):
            step()
        row.ms = statistics.median(time_step_ms(step, device) for _ in range(iters))
        if device == "cuda":
            row.peak_mib = torch.cuda.max_memory_allocated() / 2**20
        row.err = rel_err(y, ref)
    except Exception as e:  # noqa: BLE001  (a level that fails at run time is reported, not fatal)
        row.status = f"failed: {type(e).__name__}: {str(e).splitlines()[0][:120] if str(e) else ''}"
    return row


# ---- report ----------------------------------------------------------------------------------------------


def table_lines(rows: list[Row]) -> list[str]:
    def num(v: float, fmt: str, width: int) -> str:
        return f"{v:{fmt}}".rjust(width) if v == v else "-".rjust(width)  # NaN: not measured

    lines = [f"{'model':<6} {'mode':<5} {'level':<20} {'ms':>9} {'speedup':>8} {'peak MiB':>9} {'err fp32':>9}  status"]
    for r in rows:
        speedup = num(r.speedup, ".2f", 7) + ("x" if r.speedup == r.speedup else " ")
        lines.append(f"{r.model:<6} {r.mode:<5} {r.level:<20} {num(r.ms, '.2f', 9)} {speedup} "
                     f"{num(r.peak_mib, '.0f', 9)} {num(r.err, '.1e', 9)}  {'' if r.status == 'ok' else r.status}")
    return lines


def write_csv(path: str, rows: list[Row], device_name: str) -> None:
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["model", "mode", "level", "ms", "speedup_vs_eager", "peak_mib", "rel_err_vs_fp32", "status",
                    "device", "torch_version"])
        for r in rows:
            w.writerow([r.model, r.mode, r.level, f"{r.ms:.4f}", f"{r.speedup:.3f}", f"{r.peak_mib:.1f}",
                        f"{r.err:.3e}", r.status, device_name, torch.__version__])


def plot(path: str, model_name: str, what: str, rows: list[Row]) -> bool:
    try:
        import matplotlib  # noqa: PLC0415

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt  # noqa: PLC0415
    except ImportError:
        return False
    modes = [m for m in MODES if any(r.mode == m for r in rows)]
    fig, axes = plt.subplots(1, len(modes), figsize=(6 * len(modes), 4), squeeze=False)
    for ax, mode in zip(axes[0], modes):
        rs = [r for r in rows if r.mode == mode]
        vals = [r.speedup if r.status == "ok" else 0.0 for r in rs]
        bars = ax.bar([r.level for r in rs], vals, color=["#c0392b" if "kernelforge" in r.level else "#7f8c8d"
                                                           for r in rs])
        for bar, r in zip(bars, rs):
            ax.text(bar.get_x() + bar.get_width() / 2, bar.get_height(),
                    f"{r.speedup:.2f}x" if r.status == "ok" else "n/a", ha="center", va="bottom", fontsize=8)
        ax.set_title(f"{mode}: speed-up over eager")
        ax.tick_params(axis="x", rotation=30)
    fig.suptitle(f"{model_name}: {what}", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


# ---- command ---------------------------------------------------------------------------------------------


def add_arguments(p: argparse.ArgumentParser) -> None:
    steps = tuple(m for m in MODELS if not m.startswith("llama_generate"))  # forward / training steps (not generate loops)
    p.add_argument("--models", type=csv_list(steps), default=["lm", "vit", "gnn"],
                   help=f"comma-separated, from {', '.join(steps)} (default lm,vit,gnn)")
    p.add_argument("--levels", type=csv_list(LEVELS), default=list(LEVELS), help="comma-separated levels")
    p.add_argument("--modes", type=csv_list(MODES), default=list(MODES), help="fwd, train or both")
    add_model_arguments(p)
    p.add_argument("--out", default="levels_out", help="folder of levels.csv and levels_<model>.png")
    p.add_argument("--quick", action="store_true",
                   help="1 warm-up step (the one that compiles) and 3 timed steps: the whole default run in a few minutes")


def main(args: argparse.Namespace) -> int:
    device = resolve_device("levels", args)
    if device is None:
        return 2
    if args.quick:
        args.warmup, args.iters = 1, 3
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    device_name = torch.cuda.get_device_name() if device == "cuda" else "cpu"
    os.makedirs(args.out, exist_ok=True)
    total = len(args.models) * len(args.modes) * len(args.levels)
    progress = Progress(total, "kforge levels")
    rows: list[Row] = []
    for name in args.models:
        try:
            model = MODELS[name](args.size, device, dtype)
        except ImportError as e:
            print(f"kforge levels: model {name} needs {e.name or e}; skipped", file=sys.stderr)
            continue
        ref_module = copy.deepcopy(model.module).float().eval()
        ref_inputs = tuple(t.float() if t.is_floating_point() else t for t in model.inputs)
        with torch.no_grad():
            ref = model.forward(ref_module, *ref_inputs).detach()
        del ref_module
        model_rows = []
        for mode in args.modes:
            eager_ms = None
            for level in args.levels:
                progress.start(f"{name} {mode} {level}")
                row = run_level(model, level, mode, ref, device, args.warmup, args.iters)
                row.model = name
                if level == "eager" and row.status == "ok":
                    eager_ms = row.ms
                if eager_ms and row.status == "ok":
                    row.speedup = eager_ms / row.ms
                model_rows.append(row)
                write_csv(os.path.join(args.out, "levels.csv"), rows + model_rows, device_name)  # a cut run keeps it
                torch._dynamo.reset()
                if device == "cuda":
                    torch.cuda.empty_cache()
                progress.finish(f"{name} {mode} {level}: {row.status}")
        rows += model_rows
        if plot(os.path.join(args.out, f"levels_{name}.png"), name, model.what, model_rows):
            print(f"png: {os.path.join(args.out, f'levels_{name}.png')}")
        print(f"{name}: {model.what}")
    progress.close()
    write_csv(os.path.join(args.out, "levels.csv"), rows, device_name)
    print(f"kforge levels on {device_name} ({str(dtype).replace('torch.', '')}, torch {torch.__version__})")
    print("\n".join(table_lines(rows)))
    print(f"csv: {os.path.join(args.out, 'levels.csv')}")
    return 0
