"""Where a decode step's time goes in kernelforge.generate's fused step (Llama-1B shape, bf16).

Runs generate twice without a CUDA graph under torch.profiler, with N1 and N2 new tokens; the
difference of the two runs' kernel times is (N2 - N1) decode steps with the prefill cancelled out.
Prints per kernel its time per step and launches per step, the sum (the GPU busy time of a step),
and the CUDA-graph time per step of the same loop: graph time minus busy time is what launch gaps
and kernel ramps between kernels cost. Then a one-token call's wall time and kernels: the setup and
the prefill that kforge e2e spreads over the new tokens, through the patched forward and through
DecodeStep.prefill (generate's FUSED_PREFILL). Then the graph time per step of step
variants, in KF_PROF_ROUNDS (default 3) interleaved rounds, the median of each: the default projections
(decode_linear: kernelforge.linear's GEMV kernel at one row, cuBLAS for more), all projections on cuBLAS,
all on kernelforge.linear, RoPE + the cache append as one rope_kv_append launch, and the L2 prefetch
branch (DecodeStep's l2_prefetch: 40 MB of the o and gate/up weights a layer).
KF_PDL=0/1 in the environment sets programmatic dependent launch for the process. Not the benchmark.

    PYTHONPATH=python python3 dev/prof_generate.py [batch ...]      (default: 1 16)
"""
import importlib
import os
import sys
import time

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, os.environ.get("KF_PYDIR", "python"))
import kernelforge as kf  # noqa: E402
from kernelforge.models import MODELS  # noqa: E402

N1, N2 = 8, 40


def kernel_times(model, ids, new: int) -> dict:
    """Kernel name -> (total microseconds, launches) of one uncaptured generate call."""
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        kf.generate(model, ids, new, ignore_eos=True, cuda_graph=False)
        torch.cuda.synchronize()
    out = {}
    for e in prof.key_averages():
        t = getattr(e, "device_time_total", None) or getattr(e, "cuda_time_total", 0)
        if t > 0:
            out[e.key] = (t, e.count)
    return out


def wall_ms(fn, reps: int = 5) -> float:
    """The fastest of `reps` calls of fn, in milliseconds (after one untimed call)."""
    fn()
    ts = []
    for _ in range(reps):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        ts.append(time.perf_counter() - t0)
    return min(ts) * 1e3


def graph_ms_per_token(model, ids, step=None, new: int = 128, reps: int = 3) -> float:
    """Milliseconds per decode step in CUDA-graph replay: generate with `new` and with N1 new tokens, both
    graphs captured first (each cache length has its own), the fastest of `reps` calls each; the
    difference over new - N1 steps cancels the prefill."""
    def run(n):
        return kf.generate(model, ids, n, ignore_eos=True, fused_step=step)

    def best(n):
        ts = []
        for _ in range(reps):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            run(n)
            torch.cuda.synchronize()
            ts.append(time.perf_counter() - t0)
        return min(ts)

    run(new)
    run(N1)
    return (best(new) - best(N1)) / (new - N1) * 1e3


def main(batch: int) -> None:
    m = MODELS["llama_generate"]("full", "cuda", torch.bfloat16, batch)
    model, ids = m.module.eval(), m.inputs[0]
    kf.patch(model)
    with torch.no_grad():
        kernel_times(model, ids, N1)  # warm-up: plans, allocator
        a, b = kernel_times(model, ids, N1), kernel_times(model, ids, N2)
        steps = N2 - N1
        rows = []
        for k, (t, n) in b.items():
            t0, n0 = a.get(k, (0.0, 0))
            if n - n0 > 0:
                rows.append(((t - t0) / steps, (n - n0) / steps, k[:100]))
        busy = sum(r[0] for r in rows)
        print(f"==== batch {batch}: {steps} decode steps, kernel time per step {busy:.1f} us")
        for t, n, k in sorted(rows, reverse=True)[:24]:
            print(f"{t:9.1f} us {t / busy * 100:5.1f} %  x{n:<5.1f} {k}")
        print(f"launches per step: {sum(r[1] for r in rows):.0f}")
        g = graph_ms_per_token(model, ids)
        print(f"graph replay: {g * 1e3:.1f} us per step; busy {busy:.1f} us ({busy / (g * 1e3) * 100:.0f} %)")
        # A call that generates one token: the loop's setup, the cache reset and the prefill (the fixed cost
        # that kforge e2e spreads over the new tokens), and its kernels under the profiler.
        gen = importlib.import_module("kernelforge.generate")
        gen.FUSED_PREFILL = False  # the prompt through the patched model's forward
        one = wall_ms(lambda: kf.generate(model, ids, 1, ignore_eos=True))
        pre = kernel_times(model, ids, 1)
        pre_busy = sum(t for t, _ in pre.values())
        print(f"one-token call (setup + prefill of {ids.shape[1]} tokens): {one:.2f} ms wall, {pre_busy / 1e3:.2f} ms "
              f"of kernels in {sum(n for _, n in pre.values()):.0f} launches")
        for k, (t, n) in sorted(pre.items(), key=lambda kv: -kv[1][0])[:10]:
            print(f"{t:9.1f} us {t / pre_busy * 100:5.1f} %  x{n:<5.0f} {k[:100]}")
        gen.FUSED_PREFILL = True  # the prompt through DecodeStep.prefill instead of the patched forward
        one_fused = wall_ms(lambda: kf.generate(model, ids, 1, ignore_eos=True))
        pre = kernel_times(model, ids, 1)
        print(f"one-token call with FUSED_PREFILL: {one_fused:.2f} ms wall ({one_fused / one:.3f}x), "
              f"{sum(t for t, _ in pre.values()) / 1e3:.2f} ms of kernels in {sum(n for _, n in pre.values()):.0f} "
              f"launches; 128 new tokens: {(one + 127 * g) / 128:.3f} -> {(one_fused + 127 * g) / 128:.3f} ms a token")
        ds = importlib.import_module("kernelforge.decode_step")
        cublas = torch.nn.functional.linear
        default = ds.decode_linear
        variants = (("decode_linear projections (the default)", default, False, 0, False),
                    ("cuBLAS projections", cublas, False, 0, False),
                    ("kernelforge.linear projections", kf.linear, False, 0, False),
                    ("default + rope_kv_append", default, True, 0, False),
                    ("default, L2 prefetch 40 MB a layer", default, False, 40 << 20, False))
        # Rounds over the variants, interleaved, so that a drift of the clocks or of the host's load
        # spreads over all of them; the median of the rounds per variant.
        rounds = int(os.environ.get("KF_PROF_ROUNDS", "3"))
        times = {v[0]: [] for v in variants}
        for _ in range(rounds):
            for name, proj, rope_append, pf, pf_kv in variants:
                ds.FUSED_ROPE_APPEND = rope_append
                step = ds.decode_step(model, proj_linear=proj, l2_prefetch=pf, l2_prefetch_kv=pf_kv)
                times[name].append(graph_ms_per_token(model, ids, step) * 1e3)
        base = sorted(times[variants[0][0]])[rounds // 2]
        for name, ts in times.items():
            med = sorted(ts)[rounds // 2]
            runs = " ".join(f"{t:7.1f}" for t in ts)
            print(f"  {name:44s} {med:8.1f} us per step  ({med / base:5.3f}x; rounds {runs})  "
                  f"PDL={os.environ.get('KF_PDL', 'default')}")
        ds.FUSED_ROPE_APPEND = False


if __name__ == "__main__":
    for b in [int(x) for x in sys.argv[1:]] or [1, 16]:
        main(b)
