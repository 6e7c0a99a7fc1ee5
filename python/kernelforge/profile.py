"""`kforge profile`: where a model step's time goes, by op family, before and after ``kf.patch``.

Builds one of the models below (random weights), runs its step under ``torch.profiler`` unpatched,
then patched, and prints per op family the time of the step spent in it and its share: on CUDA the
device time of the kernels (each kernel's own duration), on the CPU the self time of the operators.
Families come from the kernel or operator names (``FAMILIES``): kernelforge's own kernels by their
op, cuBLAS / CUTLASS GEMMs as matmul, FlashAttention / cuDNN / SDPA kernels as attention, Triton
kernels (torch.compile) as triton, torch's elementwise and reduction kernels as elementwise. The
families where the patched step still spends its time are what is left to win.

    kforge profile [--model llama|llama_train|vit|vit_train|ltx] [--size full|small]
                   [--device cuda|cpu] [--steps N] [--top K] [--trace DIR] [--out DIR]

``--out DIR`` also writes DIR/profile_<model>.csv (one row per family: milliseconds per step and share,
unpatched and patched, the patched step's top kernel) and DIR/profile_<model>.png (the two steps as
bars split by family).

Models (kernelforge/models.py; ``--size small`` is a 2-layer model of the same kind, for smoke tests):
  llama        Llama-3.2-1B-shaped prefill, 4 x 2048 tokens (the last position's logits)
  llama_train  the same model, one training step (causal-LM loss, backward)
  vit          ViT-B/16-shaped encoder, 32 images of 224 x 224
  vit_train    the same model, one training step
  ltx          LTX-Video transformer step: 28 blocks, 2688 video tokens, 128 text tokens, CFG batch 2
"""

from __future__ import annotations

import argparse
import csv
import os
import re
import sys
import warnings
from dataclasses import dataclass
import torch

from .models import MODELS as BUILDERS
from .models import Model, add_model_arguments, resolve_device

# (family, pattern on the lowercased kernel or operator name), first match wins.
FAMILIES = (
    ("attention", r"attn|attention|flash|fmha|cudnn|sdpa|kv_append"),
    ("norm", r"rms_?norm|layer_?norm|ada_norm|group_norm|norm_(fwd|bwd)|norm_detail|ada_group_grads"),
    ("rope", r"rope|rotary"),
    ("softmax", r"softmax"),
    ("loss", r"cross_entropy|\bce_|nll_loss|flce"),
    ("activation", r"swiglu|geglu|gelu|silu|act_and_mul|glu|act_(fwd|bwd)|act_detail"),
    ("matmul", r"gemm|nvjet|cutlass|xmma|cublas|\bmm\b|addmm|matmul|linear|bmm|sm90_|sm80_"),
    ("triton", r"^triton_"),
    ("memory", r"memcpy|memset|copy_|\bcat\b|contiguous"),
    ("elementwise", r"elementwise|vectorized|reduce|unrolled|aten::"),
)


def family_of(name: str) -> str:
    n = name.lower()
    for fam, pattern in FAMILIES:
        if re.search(pattern, n):
            return fam
    return "other"


# --model -> (models.py builder, mode): "fwd" runs the forward without autograd, "train" a training
# step (the model's training loss and its backward).
MODELS = {
    "llama": ("llama", "fwd"),
    "llama_train": ("llama", "train"),
    "vit": ("vit", "fwd"),
    "vit_train": ("vit", "train"),
    "ltx": ("ltx", "fwd"),
}


@dataclass
class Case:
    model: Model
    train: bool

    def step(self) -> None:
        m = self.model
        if not self.train:
            m.forward(m.module, *m.inputs)
            return
        m.train_loss(m.module, *m.inputs).backward()
        for p in m.module.parameters():
            p.grad = None


def _self_time_us(evt, cuda: bool) -> float:
    if cuda:
        return float(getattr(evt, "self_device_time_total", getattr(evt, "self_cuda_time_total", 0.0)))
    return float(evt.self_cpu_time_total)


def profile_step(case: Case, cuda: bool, steps: int, trace: str | None = None) -> dict[str, list[tuple[str, float]]]:
    """{family: [(kernel or operator name, microseconds per step), ...]} of ``steps`` steps of the case."""
    from torch.profiler import ProfilerActivity, profile  # noqa: PLC0415

    with torch.enable_grad() if case.train else torch.no_grad():
        case.step()  # warm-up: first-call set-up stays out of the profile
        if cuda:
            torch.cuda.synchronize()
        acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*clears events at the end of each cycle")
            with profile(activities=acts) as prof:
                for _ in range(steps):
                    case.step()
                if cuda:
                    torch.cuda.synchronize()
    if trace:
        prof.export_chrome_trace(trace)
    out: dict[str, list[tuple[str, float]]] = {}
    for evt in prof.key_averages():
        is_kernel = str(getattr(evt, "device_type", "")).endswith("CUDA")
        if cuda != is_kernel:
            continue
        us = _self_time_us(evt, cuda) / steps
        if us <= 0:
            continue
        name = evt.key
        out.setdefault(family_of(name), []).append((name, us))
    for rows in out.values():
        rows.sort(key=lambda r: -r[1])
    return out


def _short(name: str, width: int = 48) -> str:
    name = re.sub(r"<.*>", "<...>", name)  # template arguments of C++ kernel names
    name = re.sub(r"^void ", "", name)
    return name if len(name) <= width else name[: width - 3] + "..."


def report_lines(before: dict, after: dict, top: int) -> list[str]:
    total_b = sum(us for rows in before.values() for _, us in rows)
    total_a = sum(us for rows in after.values() for _, us in rows)
    fams = sorted(set(before) | set(after), key=lambda f: -sum(us for _, us in after.get(f, before.get(f, []))))
    lines = [f"{'family':<12} {'unpatched ms':>12} {'share':>7} {'patched ms':>11} {'share':>7}   top (patched)"]
    for fam in fams:
        b = sum(us for _, us in before.get(fam, [])) / 1e3
        a = sum(us for _, us in after.get(fam, [])) / 1e3
        tops = ", ".join(f"{_short(n)} {us / 1e3:.2f}" for n, us in after.get(fam, [])[:top])
        lines.append(f"{fam:<12} {b:>12.3f} {100 * b * 1e3 / max(total_b, 1e-9):>6.1f}% {a:>11.3f} "
                     f"{100 * a * 1e3 / max(total_a, 1e-9):>6.1f}%   {tops}")
    lines.append(f"{'total':<12} {total_b / 1e3:>12.3f} {'':>7} {total_a / 1e3:>11.3f} {'':>7}   "
                 f"(patched / unpatched: {total_a / max(total_b, 1e-9):.2f})")
    return lines


def _family_ms(prof: dict) -> dict[str, float]:
    return {fam: sum(us for _, us in rows) / 1e3 for fam, rows in prof.items()}


def write_csv(path: str, model: str, before: dict, after: dict, device_name: str) -> None:
    b, a = _family_ms(before), _family_ms(after)
    tb, ta = max(sum(b.values()), 1e-12), max(sum(a.values()), 1e-12)
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["model", "family", "unpatched_ms", "unpatched_share", "patched_ms", "patched_share",
                    "patched_top_kernel", "device", "torch_version"])
        for fam in sorted(set(b) | set(a), key=lambda k: -b.get(k, 0.0)):
            top = after.get(fam, [("", 0.0)])[0][0]
            w.writerow([model, fam, f"{b.get(fam, 0.0):.4f}", f"{b.get(fam, 0.0) / tb:.4f}", f"{a.get(fam, 0.0):.4f}",
                        f"{a.get(fam, 0.0) / ta:.4f}", _short(top, 80), device_name, torch.__version__])
        w.writerow([model, "total", f"{tb:.4f}", "1.0000", f"{ta:.4f}", "1.0000", "", device_name, torch.__version__])


def plot(path: str, title: str, before: dict, after: dict, xlabel: str = "kernel time per step, ms") -> bool:
    """Two horizontal bars (unpatched, patched), each split into its families' milliseconds."""
    try:
        import matplotlib  # noqa: PLC0415

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt  # noqa: PLC0415
    except ImportError:
        return False
    b, a = _family_ms(before), _family_ms(after)
    fams = sorted(set(b) | set(a), key=lambda k: -b.get(k, 0.0))
    fig, ax = plt.subplots(figsize=(10, 2.8))
    cmap = plt.get_cmap("tab20")
    for y, ms in ((1, b), (0, a)):
        left = 0.0
        for i, fam in enumerate(fams):
            v = ms.get(fam, 0.0)
            ax.barh(y, v, left=left, color=cmap(i % 20), label=fam if y == 1 else None)
            if v > 0.04 * max(sum(b.values()), 1e-12):
                ax.text(left + v / 2, y, fam, ha="center", va="center", fontsize=7)
            left += v
    ax.set_yticks([1, 0], [f"unpatched {sum(b.values()):.1f} ms", f"kf.patch {sum(a.values()):.1f} ms"])
    ax.set_xlabel(xlabel)
    ax.legend(fontsize=7, ncol=6, loc="upper center", bbox_to_anchor=(0.5, -0.35))
    ax.set_title(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", choices=sorted(MODELS), default="llama", help="the model step to profile")
    add_model_arguments(p, timed=False)
    p.add_argument("--steps", type=int, default=3, help="profiled steps (after one warm-up step)")
    p.add_argument("--top", type=int, default=2, help="kernels listed per family")
    p.add_argument("--trace", default=None, metavar="DIR",
                   help="write Chrome traces DIR/<model>-unpatched.json and DIR/<model>-patched.json")
    p.add_argument("--out", default=None, metavar="DIR",
                   help="write DIR/profile_<model>.csv (per family, unpatched and patched) and DIR/profile_<model>.png")


def main(args: argparse.Namespace) -> int:
    import kernelforge as kf  # noqa: PLC0415

    device = resolve_device("profile", args)
    if device is None:
        return 2
    if args.steps < 1:
        print("kforge profile: --steps must be at least 1", file=sys.stderr)
        return 2
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    builder, mode = MODELS[args.model]
    try:
        case = Case(BUILDERS[builder](args.size, device, dtype), mode == "train")
        case.model.module.train(case.train)
    except ImportError as e:
        print(f"kforge profile: model {args.model} needs {e.name or e}", file=sys.stderr)
        return 2
    cuda = device == "cuda"
    traces = [None, None]
    if args.trace:
        os.makedirs(args.trace, exist_ok=True)
        traces = [os.path.join(args.trace, f"{args.model}-{k}.json") for k in ("unpatched", "patched")]
    print(f"kforge profile: {case.model.what}{', training step' if case.train else ', forward'}; {device} {str(dtype).replace('torch.', '')}, "
          f"{'kernel device time' if cuda else 'operator self CPU time'} per step, {args.steps} step(s)")
    before = profile_step(case, cuda, args.steps, traces[0])
    report = kf.patch(case.model.module)
    after = profile_step(case, cuda, args.steps, traces[1])
    print("\n".join(report_lines(before, after, args.top)))
    print(f"patched: {len(report.patched)} module(s), skipped {len(report.skipped)}")
    if args.trace:
        print(f"traces: {traces[0]}, {traces[1]}")
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        device_name = torch.cuda.get_device_name() if cuda else "cpu"
        csv_path = os.path.join(args.out, f"profile_{args.model}.csv")
        write_csv(csv_path, args.model, before, after, device_name)
        png = os.path.join(args.out, f"profile_{args.model}.png")
        what = "kernel time" if cuda else "operator self CPU time"
        drawn = plot(png, f"{case.model.what}: {what} per step by family ({device_name})", before, after,
                     f"{what} per step, ms")
        print(f"wrote {csv_path}" + (f", {png}" if drawn else " (no matplotlib: no chart)"))
    return 0
