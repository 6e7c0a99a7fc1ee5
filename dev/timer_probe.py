"""Developer tool: how much of a measured time is the timer. Times the same forward calls with
  bench  kforge bench's Timer (100 MB zero-fill flush, GPU head start, events)
  nosleep  the same without the head start
  dobench  triton.testing.do_bench (256 MB zero-fill flush)
  rdflush  a read-only flush (sum over 256 MB: L2 left clean) + head start
and, as references at the same size, torch's copy_ of x into y (read + write the same bytes as a
norm forward) and an empty kernel between the events (the fixed cost of one timed launch).
    KF_PYDIR=python python3 dev/timer_probe.py [--shapes 16384x2048,16384x8192]
"""
import argparse
import os
import statistics
import sys

import torch

sys.path.insert(0, os.environ.get("KF_PYDIR", "python"))
import kernelforge as kf  # noqa: E402

ops = torch.ops.kernelforge


def timed(fn, flush, sleep, reps=60):
    for _ in range(5):
        fn()
    torch.cuda.synchronize()
    s = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    e = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    for i in range(reps):
        flush()
        if sleep:
            torch.cuda._sleep(1_000_000)
        s[i].record()
        fn()
        e[i].record()
    torch.cuda.synchronize()
    return statistics.median(a.elapsed_time(b) for a, b in zip(s, e))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", default="16384x2048,16384x8192")
    a = ap.parse_args()
    import triton.testing as tt
    buf100 = torch.empty(100 << 20, dtype=torch.uint8, device="cuda")
    buf256 = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
    rd = torch.ones(64 << 20, dtype=torch.float32, device="cuda")
    acc = torch.empty((), device="cuda")
    modes = {
        "bench": lambda f: timed(f, buf100.zero_, True),
        "nosleep": lambda f: timed(f, buf100.zero_, False),
        "dobench": lambda f: tt.do_bench(f, warmup=25, rep=100, return_mode="median"),
        "rdflush": lambda f: timed(f, lambda: acc.copy_(rd.sum()), True),
    }
    try:
        from liger_kernel.transformers import functional as lf
    except Exception:  # noqa: BLE001
        lf = None
    empty = torch.empty(1, device="cuda")
    for shape in a.shapes.split(","):
        rows, n = (int(v) for v in shape.split("x"))
        x = torch.randn(rows, n, device="cuda", dtype=torch.bfloat16)
        y = torch.empty_like(x)
        w = torch.randn(n, device="cuda", dtype=torch.bfloat16)
        b = torch.randn(n, device="cuda", dtype=torch.bfloat16)
        sc = torch.randn(4, 1, n, device="cuda", dtype=torch.bfloat16) * 0.1
        x3 = x.view(4, rows // 4, n)
        calls = {
            "copy_": lambda: y.copy_(x),
            "empty": lambda: empty.zero_(),
            "kf_rms": lambda: ops.rms_norm(x, w, 1e-6),
            "kf_layer": lambda: ops.layer_norm(x, w, b, 1e-5),
            "kf_ada": lambda: ops.ada_norm(x3, sc, sc, None, None, 1e-6, "layer"),
        }
        if lf is not None:
            calls["liger_rms"] = lambda: lf.liger_rms_norm(x, w, 1e-6, casting_mode="llama")
            calls["liger_layer"] = lambda: lf.liger_layer_norm(x, w, b, 1e-5)
        nbytes = 2 * rows * n * 2
        for name, f in calls.items():
            line = f"{shape:12s} {name:12s}"
            for m, t in modes.items():
                ms = t(f)
                gb = "" if name == "empty" else f" {nbytes / ms / 1e6:5.0f}"
                line += f" | {m} {ms * 1e3:7.1f} us{gb}"
            print(line, flush=True)


if __name__ == "__main__":
    main()
