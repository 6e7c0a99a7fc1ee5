"""`kforge profile`: where a model step's time goes, by op family, before and after ``kf.patch``.

Builds one of the models below (random weights), runs its step under ``torch.profiler`` unpatched,
then patched, and prints per op family the time of the step spent in it and its share: on CUDA the
device time of the kernels (each kernel's own duration), on the CPU the self time of the operators.
Families come from the kernel or operator names (``FAMILIES``): kernelforge's own kernels by their
op, cuBLAS / CUTLASS GEMMs as matmul, FlashAttention / cuDNN / SDPA kernels as attention, Triton
kernels (torch.compile) as triton, torch's elementwise and reduction kernels as elementwise. The
families where the patched step still spends its time are what is left to win.

    kforge profile [--model llama|llama_train|vit|vit_train|ltx] [--size full|small]
                   [--device cuda|cpu] [--steps N] [--top K] [--trace DIR]

Models (kernelforge/models.py; ``--size small`` is a 2-layer model of the same kind, for smoke tests):
  llama        Llama-3.2-1B-shaped prefill, 4 x 2048 tokens (the last position's logits)
  llama_train  the same model, one training step (causal-LM loss, backward)
  vit          ViT-B/16-shaped encoder, 32 images of 224 x 224
  vit_train    the same model, one training step
  ltx          LTX-Video transformer step: 28 blocks, 2688 video tokens, 128 text tokens, CFG batch 2
"""

from __future__ import annotations

import argparse
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


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", choices=sorted(MODELS), default="llama", help="the model step to profile")
    add_model_arguments(p, timed=False)
    p.add_argument("--steps", type=int, default=3, help="profiled steps (after one warm-up step)")
    p.add_argument("--top", type=int, default=2, help="kernels listed per family")
    p.add_argument("--trace", default=None, metavar="DIR",
                   help="write Chrome traces DIR/<model>-unpatched.json and DIR/<model>-patched.json")


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
    return 0
