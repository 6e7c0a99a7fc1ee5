"""`kforge dist`: multi-GPU training steps and the vocabulary-parallel loss, each (case, provider) in its own
torchrun job (one process per GPU).

Cases:
  fsdp_train  the Llama-3.2-1B-shaped model (kernelforge/models.py), one training step (causal-LM loss,
              backward) under FSDP2 (``fully_shard`` on every decoder layer and the root), 4 x 2048 tokens
              per GPU
  fsdp_train_keep  the same with reshard_after_forward=False: the parameters gathered in the forward
              are kept for the backward (half the all-gathers, more memory)
  tp_train    the same model with tensor parallelism over all the GPUs (llama_tp_plan: q/k/v/gate/up
              column-parallel, o/down row-parallel, the lm_head column-parallel), 4 x 2048 tokens per step
  vp_ce       the loss of a vocabulary-parallel lm_head (hidden 2048, vocabulary 128256 split over the
              GPUs), 8192 tokens, forward + backward (gradients of the hidden states and the weight shard)
Providers, train cases: eager (the model as written), compile (torch.compile of each decoder layer, the
FSDP2 / torchtitan recipe), kernelforge (kf.patch), kernelforge_compile (both). vp_ce: eager (the logits
all-gathered and F.cross_entropy, what a column-parallel lm_head with replicated output and HF's loss do),
loss_parallel (torch's vocab-parallel cross-entropy on DTensor logits), kernelforge
(kernelforge.vocab_parallel_fused_linear_cross_entropy: no logits in memory).

Each job prints one JSON line from rank 0: milliseconds per step (the slowest rank's median of CUDA-event
times after warm-up), tokens per second over all GPUs and the largest per-GPU peak memory. The parent
prints the table (speed-up over eager and over compile), writes OUT/dist.csv and OUT/dist.png.

    kforge dist [--gpus 2] [--cases fsdp_train,fsdp_train_keep,tp_train,vp_ce] [--providers ...] [--size full|small]
                [--device cuda|cpu] [--warmup N] [--iters N] [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import time

from .e2e import plot, run_all, table_lines, write_csv
from .models import add_model_arguments, csv_list, resolve_device

TRAIN_PROVIDERS = ("eager", "compile", "kernelforge", "kernelforge_compile")
CE_PROVIDERS = ("eager", "loss_parallel", "kernelforge")
CASES = {"fsdp_train": TRAIN_PROVIDERS, "fsdp_train_keep": TRAIN_PROVIDERS, "tp_train": TRAIN_PROVIDERS,
         "vp_ce": CE_PROVIDERS}


def llama_tp_plan(model, loss_parallel: bool = False) -> dict:
    """A tensor-parallel plan for a transformers Llama-style causal LM (``parallelize_module``): attention
    q/k/v and MLP gate/up column-parallel, o/down row-parallel (one all-reduce after each), the lm_head
    column-parallel with its logits gathered (or, loss_parallel=True, left sharded by vocabulary as DTensors
    for ``torch.distributed.tensor.parallel.loss_parallel``). Norms, embeddings and RoPE run replicated."""
    from torch.distributed.tensor import Replicate, Shard  # noqa: PLC0415
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel  # noqa: PLC0415

    plan = {"lm_head": ColwiseParallel(output_layouts=Shard(-1), use_local_output=False) if loss_parallel
            else ColwiseParallel(output_layouts=Replicate())}
    for i in range(len(model.model.layers)):
        p = f"model.layers.{i}."
        for name in ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "mlp.gate_proj", "mlp.up_proj"):
            plan[p + name] = ColwiseParallel()
        for name in ("self_attn.o_proj", "mlp.down_proj"):
            plan[p + name] = RowwiseParallel()
    return plan


def _llama(size: str, device, dtype):
    """The Llama-1B-shaped model of models.py, or (small) a 2-layer one whose 2 KV heads split over 2 GPUs."""
    from .models import MODELS  # noqa: PLC0415

    if size == "full":
        m = MODELS["llama"]("full", device, dtype)
        return m.module, m.inputs[0], m.what
    import torch  # noqa: PLC0415
    from transformers import LlamaConfig, LlamaForCausalLM  # noqa: PLC0415

    torch.manual_seed(0)
    cfg = LlamaConfig(hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, head_dim=64, vocab_size=512, max_position_embeddings=128)
    ids = torch.randint(0, 512, (2, 64), device=device)
    return LlamaForCausalLM(cfg).to(device, dtype), ids, "Llama (2 layers, hidden 128), 2 x 64 tokens"


# ---- worker: one (case, provider) on every rank ---------------------------------------------------------------


def _train_step(case, provider, size, device, dtype, world):
    from torch.distributed.device_mesh import init_device_mesh  # noqa: PLC0415

    import kernelforge as kf  # noqa: PLC0415

    model, ids, what = _llama(size, device, dtype)
    model.train()
    patched = len(kf.patch(model).patched) if provider.startswith("kernelforge") else 0
    if provider.endswith("compile"):
        for layer in model.model.layers:
            layer.compile()
    mesh = init_device_mesh(device.type, (world,))
    if case.startswith("fsdp_train"):
        from torch.distributed.fsdp import fully_shard  # noqa: PLC0415

        keep = case == "fsdp_train_keep"
        for layer in model.model.layers:
            fully_shard(layer, mesh=mesh, reshard_after_forward=not keep)
        fully_shard(model, mesh=mesh, reshard_after_forward=not keep)
        tokens = ids.numel() * world
        what = f"{what} per GPU, FSDP2 over {world} GPUs" + (" (reshard_after_forward=False)" if keep else "")
    else:
        from torch.distributed.tensor.parallel import parallelize_module  # noqa: PLC0415

        parallelize_module(model, mesh, llama_tp_plan(model))
        tokens = ids.numel()
        what = f"{what}, tensor-parallel over {world} GPUs"

    def step():
        model(input_ids=ids, labels=ids).loss.backward()
        for p in model.parameters():
            p.grad = None

    return step, tokens, what, patched


def _ce_step(provider, size, device, dtype, world, rank):
    import torch  # noqa: PLC0415
    import torch.distributed as dist  # noqa: PLC0415
    import torch.nn.functional as F  # noqa: PLC0415

    import kernelforge as kf  # noqa: PLC0415

    tokens, hidden, vocab = (8192, 2048, 128256) if size == "full" else (64, 32, 512)
    local = vocab // world
    g = torch.Generator(device=device).manual_seed(0)
    h = (torch.randn(tokens, hidden, device=device, generator=g, dtype=torch.float32) * 0.5).to(dtype)
    w_full = (torch.randn(local * world, hidden, device=device, generator=g, dtype=torch.float32) * 0.02).to(dtype)
    w = w_full[rank * local:(rank + 1) * local].clone()
    del w_full
    target = torch.randint(0, local * world, (tokens,), device=device, generator=g)
    h.requires_grad_(), w.requires_grad_()
    what = f"{tokens} tokens, hidden {hidden}, vocabulary {local * world} over {world} GPUs ({local} each)"

    if provider == "eager":
        def loss_fn():
            logits = h @ w.t()
            parts = [torch.empty_like(logits) for _ in range(world)]
            dist.all_gather(parts, logits)  # not differentiable: the gradient of the own part flows below
            parts[rank] = logits
            return F.cross_entropy(torch.cat(parts, dim=-1).float(), target)
    elif provider == "loss_parallel":
        from torch.distributed.device_mesh import init_device_mesh  # noqa: PLC0415
        from torch.distributed.tensor import DTensor, Shard  # noqa: PLC0415
        from torch.distributed.tensor.parallel import loss_parallel  # noqa: PLC0415

        mesh = init_device_mesh(device.type, (world,))

        def loss_fn():
            logits = DTensor.from_local(h @ w.t(), mesh, [Shard(1)], run_check=False)
            with loss_parallel():
                return F.cross_entropy(logits.float(), target)
    else:
        def loss_fn():
            return kf.vocab_parallel_fused_linear_cross_entropy(h, w, target)

    def step():
        loss = loss_fn()
        if type(loss).__name__ == "DTensor":
            from torch.distributed.tensor.parallel import loss_parallel  # noqa: PLC0415

            with loss_parallel():
                loss.backward()
        else:
            loss.backward()
        if provider != "kernelforge":  # the replicated hidden states' gradient sums the ranks (as kernelforge's)
            dist.all_reduce(h.grad)
        h.grad = w.grad = None

    return step, tokens, what, 0


def run_worker(case: str, provider: str, size: str, device_type: str, warmup: int, iters: int) -> dict | None:
    import torch  # noqa: PLC0415
    import torch.distributed as dist  # noqa: PLC0415

    from .models import time_step_ms  # noqa: PLC0415

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    if device_type == "cuda":
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", rank)))
        torch.cuda.set_device(device)
        dist.init_process_group("nccl", device_id=device)
        dtype = torch.bfloat16
    else:
        device = torch.device("cpu")
        dist.init_process_group("gloo")
        dtype = torch.float32
    try:
        if case == "vp_ce":
            step, tokens, what, patched = _ce_step(provider, size, device, dtype, world, rank)
        else:
            step, tokens, what, patched = _train_step(case, provider, size, device, dtype, world)
        t0 = time.perf_counter()
        for _ in range(warmup):
            step()
        if device_type == "cuda":
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        setup_s = time.perf_counter() - t0
        times = [time_step_ms(step, device_type) for _ in range(iters)]
        peak = torch.cuda.max_memory_allocated() / 2**20 if device_type == "cuda" else 0.0
        worst = torch.tensor([statistics.median(times), peak], dtype=torch.float64, device=device)
        dist.all_reduce(worst, op=dist.ReduceOp.MAX)  # the slowest rank sets the step time
        ms, peak = worst.tolist()
    finally:
        dist.destroy_process_group()
    if rank != 0:
        return None
    return {"case": case, "provider": provider, "ms": ms, "tokens_per_s": tokens / ms * 1e3,
            "peak_mib": peak if device_type == "cuda" else float("nan"), "setup_s": setup_s,
            "patched_modules": patched, "what": what, "gpus": world}


# ---- parent ------------------------------------------------------------------------------------------------------


def _spawn(case: str, provider: str, args: argparse.Namespace, device: str) -> dict:
    import kernelforge  # noqa: PLC0415

    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={args.gpus}", "-m",
           "kernelforge.e2e_dist", "--worker", case, provider, args.size, device, str(args.warmup), str(args.iters)]
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (os.path.dirname(os.path.dirname(kernelforge.__file__)),
                                                    env.get("PYTHONPATH", "")) if p)
    env.setdefault("OMP_NUM_THREADS", "1")
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout, env=env)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if proc.returncode != 0 or not lines:
        # the ranks' own exceptions first (torchrun's ChildFailedError summary says only that one failed)
        text = proc.stderr.splitlines()
        own = [ln.strip() for ln in text if re.match(r"\s*(\[rank\d+\]:\s*)?[\w.]*(Error|Exception)\b", ln)
               and "ChildFailedError" not in ln]
        died = [ln.strip() for ln in text if ln.strip().startswith(("traceback :", "terminate called"))]
        err = own or died or [ln for ln in text if "Error" in ln or "error" in ln] or (text or ["no output"])
        return {"case": case, "provider": provider, "error": f"exit {proc.returncode}: {' | '.join(err[-3:])[:600]}"}
    return json.loads(lines[-1])


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--gpus", type=int, default=2, help="processes (GPUs) per job")
    p.add_argument("--cases", type=csv_list(tuple(CASES)), default=list(CASES),
                   help=f"comma-separated, from {', '.join(CASES)}")
    p.add_argument("--providers", type=csv_list(tuple(dict.fromkeys(TRAIN_PROVIDERS + CE_PROVIDERS))), default=None,
                   help="comma-separated (default: every provider of each case)")
    add_model_arguments(p)
    p.add_argument("--timeout", type=float, default=900, help="seconds for one (case, provider) job")
    p.add_argument("--out", default="dist_out", help="folder of dist.csv and dist.png")


def main(args: argparse.Namespace) -> int:
    import torch  # noqa: PLC0415

    device = resolve_device("dist", args)
    if device is None:
        return 2
    if device == "cuda" and torch.cuda.device_count() < args.gpus:
        print(f"kforge dist: --gpus {args.gpus} but this machine has {torch.cuda.device_count()} GPU(s)",
              file=sys.stderr)
        return 2
    os.makedirs(args.out, exist_ok=True)
    runs = [(c, p) for c in args.cases for p in CASES[c] if args.providers is None or p in args.providers]
    results = run_all(runs, _spawn, args, device, "kforge dist")
    device_name = torch.cuda.get_device_name() if device == "cuda" else "cpu"
    write_csv(os.path.join(args.out, "dist.csv"), results, f"{args.gpus} x {device_name}", torch.__version__)
    print(f"kforge dist on {args.gpus} x {device_name} (torch {torch.__version__}), each provider in its own job")
    for case, what in {r["case"]: r["what"] for r in results if "what" in r}.items():
        print(f"  {case}: {what}")
    lines = table_lines(results)
    print(lines[0] + f" {'tokens/s':>10}")
    for ln, r in zip(lines[1:], results):
        print(ln + (f" {r['tokens_per_s']:>10.0f}" if "tokens_per_s" in r else ""))
    if plot(os.path.join(args.out, "dist.png"), results):
        print(f"png: {os.path.join(args.out, 'dist.png')}")
    print(f"csv: {os.path.join(args.out, 'dist.csv')}")
    return 0 if all("error" not in r for r in results) else 1


if __name__ == "__main__":
    if len(sys.argv) == 8 and sys.argv[1] == "--worker":
        c, prov, sz, dev, wu, it = sys.argv[2:]
        out = run_worker(c, prov, sz, dev, int(wu), int(it))
        if out is not None:
            print(json.dumps(out), flush=True)
        sys.stderr.flush()
        # The process group is destroyed and the result printed. Leave without interpreter finalization:
        # on the CPU, gloo's worker threads can still be joinable when torch's static objects are torn
        # down, and the rank then dies of std::terminate (SIGABRT) after a complete, correct run.
        os._exit(0)
    print("kernelforge.e2e_dist: run `kforge dist` (this module's --worker mode is internal)", file=sys.stderr)
    sys.exit(2)
