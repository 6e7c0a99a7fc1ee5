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

Models (``--size full``; ``small`` is a 2-layer model of the same kind, for smoke tests):
  llama        Llama-3.2-1B-shaped prefill (16 layers, hidden 2048, 32/8 heads x 64), 4 x 2048 tokens
  llama_train  the same model, one training step (causal-LM loss, backward)
  vit          ViT-B/16-shaped encoder (12 layers, hidden 768, 12 heads), 32 images of 224 x 224
  vit_train    the same model, one training step (a squared-output loss, backward)
  ltx          LTX-Video transformer step: 28 blocks, 2688 video tokens, 128 text tokens, CFG batch 2
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import warnings
from dataclasses import dataclass
from typing import Callable

import torch

# (family, pattern on the lowercased kernel or operator name), first match wins.
FAMILIES = (
    ("attention", r"attn|attention|flash|fmha|cudnn|sdpa"),
    ("norm", r"rms_?norm|layer_?norm|ada_norm|group_norm"),
    ("rope", r"rope|rotary"),
    ("softmax", r"softmax"),
    ("loss", r"cross_entropy|\bce_|nll_loss|flce"),
    ("activation", r"swiglu|geglu|gelu|silu|act_and_mul|glu"),
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


@dataclass
class Case:
    model: torch.nn.Module
    step: Callable[[torch.nn.Module], None]
    what: str


def _llama(size: str, device: str, dtype: torch.dtype, train: bool) -> Case:
    from transformers import LlamaConfig, LlamaForCausalLM  # noqa: PLC0415

    if size == "full":
        cfg = LlamaConfig(hidden_size=2048, intermediate_size=8192, num_hidden_layers=16, num_attention_heads=32,
                          num_key_value_heads=8, head_dim=64, vocab_size=128256, max_position_embeddings=4096,
                          rope_theta=500000.0, tie_word_embeddings=True)
        batch, seq = 4, 2048
    else:
        cfg = LlamaConfig(hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=2,
                          num_key_value_heads=1, head_dim=64, vocab_size=512, max_position_embeddings=256)
        batch, seq = 2, 64
    torch.manual_seed(0)
    model = LlamaForCausalLM(cfg).to(device, dtype).train(train)
    ids = torch.randint(0, cfg.vocab_size, (batch, seq), device=device)
    what = f"Llama-shaped ({cfg.num_hidden_layers} layers, hidden {cfg.hidden_size}), {batch} x {seq} tokens"
    if not train:
        return Case(model, lambda m: m(input_ids=ids, logits_to_keep=1), what + ", prefill")

    def step(m):
        m(input_ids=ids, labels=ids).loss.backward()
        for p in m.parameters():
            p.grad = None

    return Case(model, step, what + ", training step")


def _vit(size: str, device: str, dtype: torch.dtype, train: bool) -> Case:
    from transformers import ViTConfig, ViTModel  # noqa: PLC0415

    if size == "full":
        cfg = ViTConfig(hidden_size=768, num_hidden_layers=12, num_attention_heads=12, intermediate_size=3072,
                        image_size=224, patch_size=16)
        batch = 32
    else:
        cfg = ViTConfig(hidden_size=128, num_hidden_layers=2, num_attention_heads=2, intermediate_size=256,
                        image_size=32, patch_size=8)
        batch = 2
    torch.manual_seed(0)
    model = ViTModel(cfg, add_pooling_layer=False).to(device, dtype).train(train)
    x = torch.randn(batch, 3, cfg.image_size, cfg.image_size, device=device, dtype=dtype)
    what = f"ViT ({cfg.num_hidden_layers} layers, hidden {cfg.hidden_size}), {batch} images of {cfg.image_size}"
    if not train:
        return Case(model, lambda m: m(pixel_values=x), what + ", forward")

    def step(m):
        m(pixel_values=x).last_hidden_state.float().square().mean().backward()
        for p in m.parameters():
            p.grad = None

    return Case(model, step, what + ", training step")


def _ltx(size: str, device: str, dtype: torch.dtype, train: bool) -> Case:
    from diffusers import LTXVideoTransformer3DModel  # noqa: PLC0415

    torch.manual_seed(0)
    if size == "full":
        model = LTXVideoTransformer3DModel(num_layers=28)
        b, f, h, w, text = 2, 7, 16, 24, 128
    else:
        model = LTXVideoTransformer3DModel(in_channels=8, out_channels=8, num_attention_heads=2, attention_head_dim=64,
                                           cross_attention_dim=128, num_layers=2, caption_channels=16)
        b, f, h, w, text = 2, 2, 4, 4, 6
    model = model.to(device, dtype).eval()
    cfg = model.config
    inputs = dict(hidden_states=torch.randn(b, f * h * w, cfg.in_channels, device=device, dtype=dtype),
                  encoder_hidden_states=torch.randn(b, text, cfg.caption_channels, device=device, dtype=dtype),
                  timestep=torch.full((b,), 500, device=device, dtype=torch.long), num_frames=f, height=h, width=w,
                  return_dict=False)
    what = f"LTX-Video transformer ({cfg.num_layers} blocks), {f * h * w} video + {text} text tokens, batch {b}"
    return Case(model, lambda m: m(**inputs), what)


MODELS = {
    "llama": lambda s, d, t: _llama(s, d, t, False),
    "llama_train": lambda s, d, t: _llama(s, d, t, True),
    "vit": lambda s, d, t: _vit(s, d, t, False),
    "vit_train": lambda s, d, t: _vit(s, d, t, True),
    "ltx": lambda s, d, t: _ltx(s, d, t, False),
}


def _self_time_us(evt, cuda: bool) -> float:
    if cuda:
        return float(getattr(evt, "self_device_time_total", getattr(evt, "self_cuda_time_total", 0.0)))
    return float(evt.self_cpu_time_total)


def profile_step(case: Case, cuda: bool, steps: int, trace: str | None = None) -> dict[str, list[tuple[str, float]]]:
    """{family: [(kernel or operator name, microseconds per step), ...]} of ``steps`` steps of the case."""
    from torch.profiler import ProfilerActivity, profile  # noqa: PLC0415

    grad = torch.enable_grad() if case.model.training else torch.no_grad()
    with grad:
        case.step(case.model)  # warm-up: first-call set-up stays out of the profile
        if cuda:
            torch.cuda.synchronize()
        acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*clears events at the end of each cycle")
            with profile(activities=acts) as prof:
                for _ in range(steps):
                    case.step(case.model)
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
    p.add_argument("--size", choices=("full", "small"), default="full",
                   help="full: the shapes above; small: a 2-layer model of the same kind")
    p.add_argument("--device", choices=("cuda", "cpu"), default=None,
                   help="default: cuda when available (bfloat16), else cpu (float32, operator self times)")
    p.add_argument("--steps", type=int, default=3, help="profiled steps (after one warm-up step)")
    p.add_argument("--top", type=int, default=2, help="kernels listed per family")
    p.add_argument("--trace", default=None, metavar="DIR",
                   help="write Chrome traces DIR/<model>-unpatched.json and DIR/<model>-patched.json")


def main(args: argparse.Namespace) -> int:
    import kernelforge as kf  # noqa: PLC0415

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    if device == "cuda" and not torch.cuda.is_available():
        print("kforge profile: --device cuda but no CUDA GPU is available", file=sys.stderr)
        return 2
    if args.steps < 1:
        print("kforge profile: --steps must be at least 1", file=sys.stderr)
        return 2
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    try:
        case = MODELS[args.model](args.size, device, dtype)
    except ImportError as e:
        print(f"kforge profile: model {args.model} needs {e.name or e}", file=sys.stderr)
        return 2
    cuda = device == "cuda"
    traces = [None, None]
    if args.trace:
        os.makedirs(args.trace, exist_ok=True)
        traces = [os.path.join(args.trace, f"{args.model}-{k}.json") for k in ("unpatched", "patched")]
    print(f"kforge profile: {case.what}; {device} {str(dtype).replace('torch.', '')}, "
          f"{'kernel device time' if cuda else 'operator self CPU time'} per step, {args.steps} step(s)")
    before = profile_step(case, cuda, args.steps, traces[0])
    report = kf.patch(case.model)
    after = profile_step(case, cuda, args.steps, traces[1])
    print("\n".join(report_lines(before, after, args.top)))
    print(f"patched: {len(report.patched)} module(s), skipped {len(report.skipped)}")
    if args.trace:
        print(f"traces: {traces[0]}, {traces[1]}")
    return 0
