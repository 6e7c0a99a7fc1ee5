"""Developer tool: event-timed activation forwards (silu_and_mul, swiglu, geglu) at ROWSxI shapes, L2
flushed, median; GB/s over the minimum bytes (read gate and up, write out: 3·ROWS·I·2 B, bf16). For
KF_TUNE sweeps (read once per process: one process per setting):

    KF_TUNE=act_one_vec=1 PYTHONPATH=python python3 scripts/prof_act.py [--shapes 16384x2048,...]

--graph: per-call time under CUDA-graph replay instead (100 calls in one graph, median of 20 replays,
as `kforge bench` times decode rows), with --compile also for torch.compile of the bench's eager code.
"""
import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import kernelforge as kf  # noqa: E402
from gpu_smoke import time_fn  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", default="16384x2048,16384x4096,16384x8192")
    ap.add_argument("--graph", action="store_true")
    ap.add_argument("--compile", action="store_true")
    a = ap.parse_args()
    tag = os.environ.get("KF_TUNE", "default")
    for shp in a.shapes.split(","):
        m, i = (int(v) for v in shp.split("x"))
        x = torch.randn(m, 2 * i, device="cuda", dtype=torch.bfloat16)
        g, u = torch.randn(m, i, device="cuda", dtype=torch.bfloat16), torch.randn(m, i, device="cuda", dtype=torch.bfloat16)
        nb = 3 * m * i * 2
        fns = {"silu_and_mul": lambda: kf.silu_and_mul(x), "swiglu": lambda: kf.swiglu(g, u),
               "geglu": lambda: kf.geglu(g, u, approximate="tanh")}
        if a.compile:
            from kernelforge import bench

            args = {"silu_and_mul": {"x": x}, "swiglu": {"gate": g, "up": u}, "geglu": {"hidden": g, "gate": u}}
            for name in list(fns):
                torch._dynamo.reset()
                cf = torch.compile(bench.eager_provider(name), dynamic=False)
                fns["compile_" + name] = (lambda cf=cf, t=args[name]: cf(t))
        with torch.no_grad():
            for name, fn in fns.items():
                t = graph_time(fn) if a.graph else time_fn(fn, reps=100)  # seconds (graph) / ms (time_fn)
                us = t * 1e6 if a.graph else t * 1e3
                print(f"{tag:20s} {shp:12s} {name:22s} {us:8.3f} us {nb / us / 1e3:6.0f} GB/s", flush=True)


def graph_time(fn, calls=100, replays=20):
    """Seconds per call: `calls` calls captured in one CUDA graph, median replay / calls."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(calls):
            fn()
    graph.replay()
    torch.cuda.synchronize()
    ts = []
    for _ in range(replays):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        graph.replay()
        e.record()
        torch.cuda.synchronize()
        ts.append(s.elapsed_time(e) / 1e3 / calls)
    return sorted(ts)[len(ts) // 2]


if __name__ == "__main__":
    main()
