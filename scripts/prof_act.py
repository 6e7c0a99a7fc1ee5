"""Developer tool: event-timed activation forwards (silu_and_mul, swiglu, geglu) at ROWSxI shapes, L2
flushed, median; GB/s over the minimum bytes (read gate and up, write out: 3·ROWS·I·2 B, bf16). For
KF_TUNE sweeps (read once per process: one process per setting):

    KF_TUNE=act_one_vec=1 PYTHONPATH=python python3 scripts/prof_act.py [--shapes 16384x2048,...]
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
    a = ap.parse_args()
    tag = os.environ.get("KF_TUNE", "default")
    for shp in a.shapes.split(","):
        m, i = (int(v) for v in shp.split("x"))
        x = torch.randn(m, 2 * i, device="cuda", dtype=torch.bfloat16)
        g, u = torch.randn(m, i, device="cuda", dtype=torch.bfloat16), torch.randn(m, i, device="cuda", dtype=torch.bfloat16)
        nb = 3 * m * i * 2
        fns = {"silu_and_mul": lambda: kf.silu_and_mul(x), "swiglu": lambda: kf.swiglu(g, u),
               "geglu": lambda: kf.geglu(g, u, approximate="tanh")}
        with torch.no_grad():
            for name, fn in fns.items():
                t = time_fn(fn, reps=100)
                print(f"{tag:20s} {shp:12s} {name:14s} {t * 1e3:8.2f} us {nb / t / 1e6:6.0f} GB/s", flush=True)


if __name__ == "__main__":
    main()
