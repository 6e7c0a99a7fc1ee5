"""`kforge e2e` (also `kforge bench e2e`): end-to-end model steps, each provider in its own process.

Cases (kernelforge/models.py builds the models, random weights):
  llama_prefill  Llama-3.2-1B-shaped prefill, 4 x 2048 tokens (the last position's logits)
  llama_train    the same model, one training step (causal-LM loss, backward)
  vit_train      ViT-B/16-shaped encoder, one training step on 32 images of 224 x 224
  ltx            LTX-Video transformer denoising step: 28 blocks, 2688 video + 128 text tokens, batch 2
  llama_generate the Llama-1B-shaped model generating 128 tokens after a 512-token prompt, batch 1,
                 greedy (HF generate, or kernelforge.generate); reported per generated token, prefill
                 included; llama_generate_b16 / _b64: 16 / 64 prompts of the same length at once
  llama_generate_batch  transformers' continuous batching (generate_batch) of 16 such prompts on its
                 paged cache: eager runs "paged|sdpa", kernelforge "paged|kernelforge"
  moe_train      a Mixtral-8x7B-shaped MoE block (8 experts, 4096 -> 14336, top-2), one training step
                 on 4 x 2048 tokens, experts as written (transformers' per-expert loop)
  moe_grouped_train  the same block with transformers' grouped_mm experts (torch._grouped_mm)
Providers: eager (the model as written), compile (torch.compile), kernelforge (kf.patch), and
kernelforge_compile (torch.compile of the patched model). For llama_generate, the compile providers
use transformers' static cache with the model's forward compiled (HF's recipe for fast generation);
eager and kernelforge its default dynamic cache. Generation cases also take generate
(``kernelforge.generate`` of the unpatched model with the model's forward as the decode step: static
cache, the step in one CUDA graph), kernelforge_generate (the same loop on the patched model) and
kernelforge_generate_fused (the patched model with the fused prefill and decode step of decode_step.py:
10 kernels per layer a step); they report tokens/s and the step's floor
(weights + the average KV cache read once per token, at the device's measured copy bandwidth,
prefill excluded). Each (case, provider) runs in a fresh
Python process (no compile cache, allocator state or patch shared with another provider), which
prints one JSON line: milliseconds per step (median of CUDA-event times after warm-up) and the peak
memory. The parent prints the table (speed-up over eager and over compile), writes OUT/e2e.csv and
OUT/e2e.png and shows a progress bar.

    kforge e2e [--cases llama_train,ltx] [--providers eager,compile,kernelforge,kernelforge_compile,generate,...]
               [--size full|small] [--device cuda|cpu] [--warmup N] [--iters N] [--quick] [--out DIR]
"""

from __future__ import annotations

import argparse
import csv
import functools
import json
import os
import statistics
import subprocess
import sys
import time

from .models import Progress, add_model_arguments, csv_list, resolve_device

CASES = {  # case -> (models.py builder, training step?)
    "llama_prefill": ("llama", False),
    "llama_train": ("llama", True),
    "vit_train": ("vit", True),
    "ltx": ("ltx", False),
    "llama_generate": ("llama_generate", False),
    "llama_generate_b16": ("llama_generate_b16", False),
    "llama_generate_b64": ("llama_generate_b64", False),
    "llama_generate_batch": ("llama_generate_batch", False),
    "moe_train": ("moe", True),
    "moe_grouped_train": ("moe_grouped", True),
}
PROVIDERS = ("eager", "compile", "kernelforge", "kernelforge_compile", "generate", "kernelforge_generate",
             "kernelforge_generate_fused")
# kernelforge.generate: generation cases only; provider -> its fused_step (the model's forward or the fused step)
GENERATE_PROVIDERS = {"generate": False, "kernelforge_generate": False, "kernelforge_generate_fused": True}
GENERATION_CASES = ("llama_generate", "llama_generate_b16", "llama_generate_b64")


# continuous batching (generate_batch): eager ("paged|sdpa") and kernelforge ("paged|kernelforge") only
BATCHING_CASES = ("llama_generate_batch",)


def applies(case: str, provider: str) -> bool:
    """Whether the provider runs the case (kernelforge.generate's providers run generation cases only;
    continuous batching runs eager and kernelforge)."""
    if case in BATCHING_CASES:
        return provider in ("eager", "kernelforge")
    return provider not in GENERATE_PROVIDERS or case in GENERATION_CASES


# ---- worker: one (case, provider) in this process --------------------------------------------------------


def _kf_generate(m, ids, new_tokens: int, fused_step: bool):
    """The generate providers' step: every token generated (as the HF providers' min_new_tokens)."""
    import kernelforge as kf  # noqa: PLC0415

    return kf.generate(m, ids, new_tokens, ignore_eos=True, fused_step=fused_step)


def run_worker(case: str, provider: str, size: str, device: str, warmup: int, iters: int) -> dict:
    import torch  # noqa: PLC0415

    import kernelforge as kf  # noqa: PLC0415

    from .models import MODELS, time_step_ms  # noqa: PLC0415

    builder, train = CASES[case]
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    model = MODELS[builder](size, device, dtype)
    module = model.module.train(train)
    patched = 0
    if provider.startswith("kernelforge"):
        patched = len(kf.patch(module).patched)
    forward = model.forward
    if provider in GENERATE_PROVIDERS:
        if not model.new_tokens:
            raise ValueError(f"e2e: provider {provider} runs generation cases only ({', '.join(GENERATION_CASES)})")
        run = module
        forward = functools.partial(_kf_generate, new_tokens=model.new_tokens,
                                    fused_step=GENERATE_PROVIDERS[provider])
    elif model.new_tokens and provider.endswith("compile"):  # generation: static cache, compiled forward
        module.generation_config.cache_implementation = "static"
        module.forward = torch.compile(module.forward, mode="reduce-overhead", fullgraph=True)
        run = module
    else:
        run = torch.compile(module) if provider.endswith("compile") else module

    def step():
        if not train:
            with torch.no_grad():
                forward(run, *model.inputs)
            return
        model.train_loss(run, *model.inputs).backward()
        for p in module.parameters():
            p.grad = None

    t0 = time.perf_counter()
    for _ in range(warmup):
        step()
    if device == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    setup_s = time.perf_counter() - t0
    times = [time_step_ms(step, device) for _ in range(iters)]
    peak = torch.cuda.max_memory_allocated() / 2**20 if device == "cuda" else float("nan")
    ms = statistics.median(times) / (model.new_tokens or 1)  # generation: per generated token
    result = {"case": case, "provider": provider, "ms": ms, "peak_mib": peak, "setup_s": setup_s,
              "patched_modules": patched, "what": model.what}
    if model.new_tokens:
        batch = model.inputs[0].shape[0]
        result["tok_s"] = batch * 1e3 / ms
        result["floor_ms"], result["step_mb"], result["copy_gbs"] = decode_floor(module, model.inputs[0],
                                                                                 model.new_tokens, device)
    return result


def decode_floor(module, ids, new_tokens: int, device: str) -> tuple[float, float, float]:
    """The decode step's floor: (ms per token, MB read per step, copy GB/s). A step reads every weight
    once (tied embeddings counted once) and the KV cache of its sequence, on average prompt +
    new_tokens / 2 keys; at the copy bandwidth of a 256 MiB device copy (read + write bytes over its
    median time)."""
    import torch  # noqa: PLC0415

    from .models import time_step_ms  # noqa: PLC0415

    weights = sum(p.numel() * p.element_size() for p in {p.data_ptr(): p for p in module.parameters()}.values())
    cfg = module.config.get_text_config(decoder=True)
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    elem = next(module.parameters()).element_size()
    keys = ids.shape[1] + new_tokens / 2
    kv = 2 * cfg.num_hidden_layers * cfg.num_key_value_heads * head_dim * elem * keys * ids.shape[0]
    src = torch.empty(128 << 20, dtype=torch.int16, device=device)
    dst = torch.empty_like(src)
    times = sorted(time_step_ms(lambda: dst.copy_(src), device) for _ in range(10))
    copy_gbs = 2 * src.numel() * src.element_size() / (times[len(times) // 2] * 1e6)
    step_bytes = weights + kv
    return step_bytes / (copy_gbs * 1e6), step_bytes / 1e6, copy_gbs


# ---- parent: every (case, provider) in its own process -------------------------------------------------


def _spawn(case: str, provider: str, args: argparse.Namespace, device: str) -> dict:
    cmd = [sys.executable, "-m", "kernelforge.e2e", "--worker", case, provider, args.size, device, str(args.warmup),
           str(args.iters)]
    # the child imports the same kernelforge package as this process
    import kernelforge  # noqa: PLC0415

    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (os.path.dirname(os.path.dirname(kernelforge.__file__)),
                                                    env.get("PYTHONPATH", "")) if p)
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout, env=env)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if proc.returncode != 0 or not lines:
        tail = (proc.stderr.strip().splitlines() or ["no output"])[-1][:160]
        return {"case": case, "provider": provider, "error": f"exit {proc.returncode}: {tail}"}
    return json.loads(lines[-1])


def table_lines(results: list[dict]) -> list[str]:
    lines = [f"{'case':<14} {'provider':<26} {'ms/step':>9} {'x eager':>8} {'x compile':>10} {'peak MiB':>9}"]
    by = {(r["case"], r["provider"]): r for r in results}
    for r in results:
        if "error" in r:
            lines.append(f"{r['case']:<14} {r['provider']:<26} failed: {r['error']}")
            continue
        eager, comp = by.get((r["case"], "eager"), {}), by.get((r["case"], "compile"), {})
        ve = f"{eager['ms'] / r['ms']:.2f}x" if "ms" in eager else "-"
        vc = f"{comp['ms'] / r['ms']:.2f}x" if "ms" in comp else "-"
        peak = f"{r['peak_mib']:.0f}" if r["peak_mib"] == r["peak_mib"] else "-"
        lines.append(f"{r['case']:<14} {r['provider']:<26} {r['ms']:>9.2f} {ve:>8} {vc:>10} {peak:>9}"
                     + (f"  {r['tok_s']:.0f} tok/s" if "tok_s" in r else ""))
    floors = {r["case"]: r for r in results if "floor_ms" in r}
    for case, r in floors.items():
        lines.append(f"{case}: decode floor {r['floor_ms']:.3f} ms/token ({r['step_mb']:.0f} MB per step at the "
                     f"copy bandwidth {r['copy_gbs']:.0f} GB/s; prefill excluded)")
    return lines


def write_csv(path: str, results: list[dict], device_name: str, torch_version: str) -> None:
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["case", "provider", "ms_per_step", "peak_mib", "setup_s", "patched_modules", "status", "device",
                    "torch_version", "tokens_per_s", "floor_ms_per_token"])
        for r in results:
            ok = "error" not in r
            w.writerow([r["case"], r["provider"], f"{r['ms']:.4f}" if ok else "", f"{r['peak_mib']:.1f}" if ok else "",
                        f"{r['setup_s']:.1f}" if ok else "", r.get("patched_modules", ""),
                        "ok" if ok else r["error"], device_name, torch_version,
                        f"{r['tok_s']:.1f}" if "tok_s" in r else "", f"{r['floor_ms']:.4f}" if "floor_ms" in r else ""])


def _plot_generation(ax, case: str, rs: list[dict]) -> None:
    """Tokens/s per provider, and the line of the decode floor's tokens/s (every weight and the average
    KV cache read once per token at the copy bandwidth: tok_s * ms / floor_ms)."""
    bars = ax.bar([r["provider"] for r in rs], [r["tok_s"] for r in rs],
                  color=["#c0392b" if r["provider"].startswith("kernelforge") else "#7f8c8d" for r in rs])
    limit = max(r["tok_s"] * r["ms"] / r["floor_ms"] for r in rs)
    ax.axhline(limit, color="#2c3e50", linestyle="--", linewidth=1)
    ax.text(-0.4, limit, f"bandwidth floor {limit:.0f} tok/s", va="bottom", fontsize=7)
    for bar, r in zip(bars, rs):
        ax.text(bar.get_x() + bar.get_width() / 2, bar.get_height(),
                f"{r['tok_s']:.0f}\n{100 * r['floor_ms'] / r['ms']:.0f} %", ha="center", va="bottom", fontsize=7)
    ax.set_ylim(0, limit * 1.15)
    ax.set_title(f"{case}: tokens/s (% of the floor)", fontsize=9)
    ax.tick_params(axis="x", rotation=30, labelsize=7)


def plot(path: str, results: list[dict]) -> bool:
    try:
        import matplotlib  # noqa: PLC0415

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt  # noqa: PLC0415
    except ImportError:
        return False
    cases = list(dict.fromkeys(r["case"] for r in results))
    fig, axes = plt.subplots(1, len(cases), figsize=(4.5 * len(cases), 3.8), squeeze=False)
    for ax, case in zip(axes[0], cases):
        rs = [r for r in results if r["case"] == case and "error" not in r]
        if rs and all("floor_ms" in r for r in rs):  # generation: tokens/s against the bandwidth floor's
            _plot_generation(ax, case, rs)
            continue
        eager = next((r["ms"] for r in rs if r["provider"] == "eager"), None)
        vals = [eager / r["ms"] if eager else 0.0 for r in rs]
        bars = ax.bar([r["provider"] for r in rs], vals,
                      color=["#c0392b" if r["provider"].startswith("kernelforge") else "#7f8c8d" for r in rs])
        for bar, r, v in zip(bars, rs, vals):
            ax.text(bar.get_x() + bar.get_width() / 2, bar.get_height(), f"{v:.2f}x\n{r['ms']:.1f} ms", ha="center",
                    va="bottom", fontsize=7)
        ax.set_title(f"{case}: speed-up over eager", fontsize=9)
        ax.tick_params(axis="x", rotation=30, labelsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--cases", type=csv_list(tuple(CASES)), default=["llama_train", "llama_prefill", "ltx"],
                   help=f"comma-separated, from {', '.join(CASES)}")
    p.add_argument("--providers", type=csv_list(PROVIDERS), default=list(PROVIDERS))
    add_model_arguments(p)
    p.add_argument("--timeout", type=float, default=900, help="seconds for one (case, provider) process")
    p.add_argument("--out", default="e2e_out", help="folder of e2e.csv and e2e.png")
    p.add_argument("--quick", action="store_true",
                   help="2 warm-up and 3 timed steps per process (the compile providers' first step compiles)")


def run_all(runs: list, spawn, args: argparse.Namespace, device: str, desc: str, on_result=None) -> list[dict]:
    """spawn(case, provider, args, device) for every (case, provider) of runs, with a progress bar; a job past
    args.timeout becomes an error row. on_result(results so far) after each job."""
    progress = Progress(len(runs), desc)
    results = []
    for case, provider in runs:
        progress.start(f"{case} {provider}")
        try:
            results.append(spawn(case, provider, args, device))
        except subprocess.TimeoutExpired:
            results.append({"case": case, "provider": provider, "error": f"timed out after {args.timeout:.0f} s"})
        progress.finish(f"{case} {provider}")
        if on_result is not None:
            on_result(results)
    progress.close()
    return results


def main(args: argparse.Namespace) -> int:
    import torch  # noqa: PLC0415

    device = resolve_device("e2e", args)
    if device is None:
        return 2
    if args.quick:
        args.warmup, args.iters = 2, 3
    os.makedirs(args.out, exist_ok=True)
    device_name = torch.cuda.get_device_name() if device == "cuda" else "cpu"
    csv_path = os.path.join(args.out, "e2e.csv")
    runs = [(c, p) for c in args.cases for p in args.providers if applies(c, p)]
    results = run_all(runs, _spawn, args, device, "kforge e2e",
                      lambda rs: write_csv(csv_path, rs, device_name, torch.__version__))  # a cut run keeps them
    write_csv(csv_path, results, device_name, torch.__version__)
    whats = {r["case"]: r["what"] for r in results if "what" in r}
    print(f"kforge e2e on {device_name} (torch {torch.__version__}), each provider in its own process")
    for case, what in whats.items():
        print(f"  {case}: {what}")
    print("\n".join(table_lines(results)))
    if plot(os.path.join(args.out, "e2e.png"), results):
        print(f"png: {os.path.join(args.out, 'e2e.png')}")
    print(f"csv: {os.path.join(args.out, 'e2e.csv')}")
    return 0 if all("error" not in r for r in results) else 1


if __name__ == "__main__":
    if len(sys.argv) == 8 and sys.argv[1] == "--worker":
        c, prov, sz, dev, wu, it = sys.argv[2:]
        print(json.dumps(run_worker(c, prov, sz, dev, int(wu), int(it))))
        sys.exit(0)
    print("kernelforge.e2e: run `kforge e2e` (this module's --worker mode is internal)", file=sys.stderr)
    sys.exit(2)
