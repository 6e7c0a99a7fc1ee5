"""Developer tool: event-timed softmax / log_softmax (forward, and forward+backward with --bwd) at the
given shapes, L2 flushed, median; GB/s over the minimum bytes (forward 2 passes, fwd+bwd 5).

    PYTHONPATH=python python3 dev/prof_softmax.py [--shapes 16384x2048,...]
        [--peers] [--bwd]
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
    ap.add_argument("--shapes", default="16384x2048,16384x4096,16384x8192,4096x131072")
    ap.add_argument("--peers", action="store_true", help="also torch.softmax, Liger and rms_norm (a ceiling)")
    ap.add_argument("--bwd", action="store_true")
    ap.add_argument("--ops", default="softmax,log_softmax")
    a = ap.parse_args()
    for shp in a.shapes.split(","):
        m, n = (int(v) for v in shp.split("x"))
        x = torch.randn(m, n, device="cuda", dtype=torch.bfloat16)
        nb = 2 * x.numel() * 2
        fns = {}
        for op in a.ops.split(","):
            f = getattr(kf, op)
            fns[f"kf.{op}"] = lambda f=f: f(x, -1)
        if a.peers:
            fns["torch.softmax"] = lambda: torch.softmax(x, -1)
            w = torch.ones(n, device="cuda", dtype=torch.bfloat16)
            fns["kf.rms_norm"] = lambda: kf.rms_norm(x, w)
            try:
                from liger_kernel.ops.softmax import LigerSoftmaxFunction

                if n <= 65536:
                    fns["liger.softmax"] = lambda: LigerSoftmaxFunction.apply(x)
            except Exception as e:  # noqa: BLE001
                print("liger:", type(e).__name__, e)
        with torch.no_grad():
            for name, fn in fns.items():
                t = time_fn(fn, reps=100)
                print(f"fwd    {shp:12s} {name:16s} {t * 1e3:9.1f} us {nb / t / 1e6:7.0f} GB/s", flush=True)
        if a.bwd:
            for op in a.ops.split(","):
                f = getattr(kf, op)
                xg = x.detach().requires_grad_()
                dy = torch.randn_like(x)

                def step(f=f, xg=xg, dy=dy):
                    xg.grad = None
                    f(xg, -1).backward(dy)

                t = time_fn(step, reps=50)
                print(f"fwdbwd {shp:12s} kf.{op:13s} {t * 1e3:9.1f} us {2.5 * nb / t / 1e6:7.0f} GB/s",
                      flush=True)


if __name__ == "__main__":
    main()
