"""Developer tool: event-timed activation forwards (silu_and_mul, swiglu, geglu) at ROWSxI shapes, L2
flushed, median; GB/s over the minimum bytes (read gate and up, write out: 3·ROWS·I·2 B, bf16).

    PYTHONPATH=python python3 dev/prof_act.py [--shapes 16384x2048,...] [--graph [--compile]]

--graph: per-call time under CUDA-graph replay instead (kforge bench's Timer.graph_ms: 100 calls in
one graph, median of 20 replays), with --compile also for torch.compile of the bench's eager code.
"""
import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import kernelforge as kf  # noqa: E402
from kernelforge import bench  # noqa: E402
from gpu_smoke import time_fn  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", default="16384x2048,16384x4096,16384x8192")
    ap.add_argument("--graph", action="store_true")
    ap.add_argument("--compile", action="store_true")
    a = ap.parse_args()
    graph = None
    if a.graph:  # the bench's own graph timer (kernelforge.bench.Timer.graph_ms)
        graph = bench.Timer(torch.device("cuda"), bench.Budget())
    for shp in a.shapes.split(","):
        m, i = (int(v) for v in shp.split("x"))
        x = torch.randn(m, 2 * i, device="cuda", dtype=torch.bfloat16)
        g, u = torch.randn(m, i, device="cuda", dtype=torch.bfloat16), torch.randn(m, i, device="cuda", dtype=torch.bfloat16)
        nb = 3 * m * i * 2
        fns = {"silu_and_mul": lambda: kf.silu_and_mul(x), "swiglu": lambda: kf.swiglu(g, u),
               "geglu": lambda: kf.geglu(g, u, approximate="tanh")}
        if a.compile:
            args = {"silu_and_mul": {"x": x}, "swiglu": {"gate": g, "up": u}, "geglu": {"hidden": g, "gate": u}}
            for name in list(fns):
                torch._dynamo.reset()
                cf = torch.compile(bench.eager_provider(name), dynamic=False)
                fns["compile_" + name] = (lambda cf=cf, t=args[name]: cf(t))
        with torch.no_grad():
            for name, fn in fns.items():
                us = (graph.graph_ms(fn) if a.graph else time_fn(fn, reps=100)) * 1e3  # both in ms
                print(f"{shp:12s} {name:22s} {us:8.3f} us {nb / us / 1e3:6.0f} GB/s", flush=True)


if __name__ == "__main__":
    main()
