"""Probe: the linear layer's backward GEMMs, kernelforge.gemm against torch, one piece at a time.

    PYTHONPATH=python python3 dev/gemm_bwd_probe.py

Per shape (tokens M, outputs N, inputs K; bfloat16, CUDA events, median of 30 after 5 warm-up calls):
dx = g W (torch mm; kf.gemm with W^T as a column-major view), dW = g^T x with and without the bias
gradient in cuBLASLt's epilogue (a_sum), and torch's g.sum(0) for db.
"""

from __future__ import annotations

import statistics

import torch

import kernelforge as kf


def ms(fn, reps=30, warmup=5):
    for _ in range(warmup):
        fn()
    ts = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        ts.append(a.elapsed_time(b))
    return statistics.median(ts)


def main():
    torch.manual_seed(0)
    for m, n, k in ((16384, 4096, 4096), (4096, 14336, 4096), (4096, 4096, 14336)):
        x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16) / k**0.5
        g = torch.randn(m, n, device="cuda", dtype=torch.bfloat16)
        tf = 2 * m * n * k / 1e9
        rows = {
            "dx torch g @ w": lambda: g @ w,
            "dx kf gemm(g, w.t())": lambda: kf.gemm(g, w.t()),
            "dW torch g.t() @ x": lambda: g.t() @ x,
            "dW kf gemm(g.t(), x.t())": lambda: kf.gemm(g.t(), x.t()),
            "dW+db kf gemm(.., a_sum)": lambda: kf.gemm(g.t(), x.t(), a_sum=True),
            "db torch g.sum(0)": lambda: g.sum(0),
        }
        print(f"M={m} N={n} K={k}")
        for name, fn in rows.items():
            t = ms(fn)
            print(f"  {name:28s} {t * 1e3:9.1f} us  {tf / t:7.1f} TFLOP/s" if "sum(0)" not in name
                  else f"  {name:28s} {t * 1e3:9.1f} us")


if __name__ == "__main__":
    main()
