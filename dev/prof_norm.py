"""Developer tool: where the time of each norm op goes, kernel by kernel (torch.profiler / CUPTI).
For every op and shape: event-timed forward and backward alone (L2 flushed, median), their GB/s
(forward 2 passes, backward 3 passes over the activations; add_rms_norm 4 and 4), and the average
duration of each CUDA kernel the backward launches (main kernel, column reduction, AdaLN grads).

    KF_PYDIR=python python3 dev/prof_norm.py [--shapes 16384x2048,...] [--ops rms_norm,...]
(ops: rms_norm, add_rms_norm, layer_norm, ada_norm, and rms_norm_plain / layer_norm_plain without
weight and bias)
"""
import argparse
import os
import sys

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, os.environ.get("KF_PYDIR", "python"))
import kernelforge  # noqa: E402,F401

ops = torch.ops.kernelforge
FLUSH = None
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gpu_smoke import time_fn as timed  # noqa: E402  (median of event-timed calls, L2 flushed)


def kernels(fn, reps=10):
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            FLUSH.zero_()
            fn()
        torch.cuda.synchronize()
    rows = []
    for ev in prof.key_averages():
        if ev.device_type != torch.autograd.DeviceType.CUDA or "fill" in ev.key or "elementwise" in ev.key:
            continue
        t = getattr(ev, "device_time_total", None) or getattr(ev, "cuda_time_total", 0)
        rows.append((t / reps, ev.count // reps, ev.key))
    return sorted(rows, reverse=True)


def calls(op, rows, n):
    dt = torch.bfloat16
    x = torch.randn(rows, n, device="cuda", dtype=dt)
    w = torch.randn(n, device="cuda", dtype=dt)
    b = torch.randn(n, device="cuda", dtype=dt)
    dy = torch.randn(rows, n, device="cuda", dtype=dt)
    if op == "rms_norm_plain":  # no weight: what the weight's reads cost
        return (lambda: ops.rms_norm(x, None, 1e-6)), (lambda: ops.rms_norm_backward(dy, x, None, 1e-6)), 2, 3
    if op == "layer_norm_plain":  # no weight, no bias
        return ((lambda: ops.layer_norm(x, None, None, 1e-5)),
                (lambda: ops.layer_norm_backward(dy, x, None, None, 1e-5)), 2, 3)
    if op == "rms_norm":
        return (lambda: ops.rms_norm(x, w, 1e-6)), (lambda: ops.rms_norm_backward(dy, x, w, 1e-6)), 2, 3
    if op == "add_rms_norm":
        r = torch.randn_like(x)
        return ((lambda: ops.add_rms_norm(x, r, w, 1e-6)), (lambda: ops.add_rms_norm_backward(dy, r, x, w, 1e-6)),
                4, 4)
    if op == "layer_norm":
        return ((lambda: ops.layer_norm(x, w, b, 1e-5)), (lambda: ops.layer_norm_backward(dy, x, w, b, 1e-5)), 2, 3)
    B = 4  # ada_norm as the bench runs it: x [4, rows/4, n], scale/shift [4, 1, n], no weight/bias
    x3, dy3 = x.view(B, rows // B, n), dy.view(B, rows // B, n)
    sc = torch.randn(B, 1, n, device="cuda", dtype=dt) * 0.1
    sh = torch.randn(B, 1, n, device="cuda", dtype=dt) * 0.1
    return ((lambda: ops.ada_norm(x3, sc, sh, None, None, 1e-6, 1)),
            (lambda: ops.ada_norm_backward(dy3, x3, sc, sh, None, None, 1e-6, 1)), 2, 3)


def main():
    global FLUSH
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", default="16384x2048,16384x4096,16384x8192")
    ap.add_argument("--ops", default="rms_norm,add_rms_norm,layer_norm,ada_norm")
    ap.add_argument("--fwd-only", action="store_true")
    a = ap.parse_args()
    FLUSH = torch.empty(256 * 1024 * 1024, dtype=torch.uint8, device="cuda")
    for op in a.ops.split(","):
        for shape in a.shapes.split(","):
            rows, n = (int(v) for v in shape.split("x"))
            fwd, bwd, pf, pb = calls(op, rows, n)
            pass_bytes = rows * n * 2
            tf = timed(fwd)
            line = f"{op:13s} {shape:12s} fwd {tf * 1e3:8.1f} us {pf * pass_bytes / tf / 1e6:7.0f} GB/s"
            if not a.fwd_only:
                tb = timed(bwd)
                line += f" | bwd {tb * 1e3:8.1f} us {pb * pass_bytes / tb / 1e6:7.0f} GB/s"
                line += f" | fwd+bwd {5 * pass_bytes / (tf + tb) / 1e6:7.0f} GB/s (5 passes)"
            print(line, flush=True)
            if not a.fwd_only:
                for t, cnt, name in kernels(bwd)[:4]:
                    print(f"      {t:8.1f} us x{cnt} {name[:110]}", flush=True)


if __name__ == "__main__":
    main()
