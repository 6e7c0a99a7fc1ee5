"""The three products of a grouped_mm training step, timed one by one against torch._grouped_mm:
forward (x w[e]^T), dx (dy w[e]: w's transposed view) and the weight gradient (dy_e^T x_e).

    PYTHONPATH=python python3 dev/grouped_gemm/parts.py [E T N K ...]
"""

import sys

import torch

import kernelforge as kf
from kernelforge.specs.grouped_mm import group_sizes


def ms(fn, iters=20):
    for _ in range(3):
        fn()
    ts = []
    for _ in range(iters):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        ts.append(a.elapsed_time(b))
    return sorted(ts)[len(ts) // 2]


def main(argv):
    shapes = [tuple(int(v) for v in argv[i:i + 4]) for i in range(0, len(argv), 4)] or \
        [(8, 16384, 14336, 4096), (64, 16384, 1536, 4096), (64, 16384, 4096, 1536)]
    for e, t, n, k in shapes:
        x = torch.randn(t, k, device="cuda", dtype=torch.bfloat16)
        w = torch.randn(e, n, k, device="cuda", dtype=torch.bfloat16) / k ** 0.5
        dy = torch.randn(t, n, device="cuda", dtype=torch.bfloat16)
        offs = torch.tensor(group_sizes(e, t), device="cuda").cumsum(0).to(torch.int32)
        tf = 2 * t * n * k / 1e9
        rows = {
            "fwd": (lambda: kf.grouped_mm(x, w, offs), lambda: torch._grouped_mm(x, w.transpose(1, 2), offs=offs)),
            "dx": (lambda: kf.grouped_mm(dy, w.transpose(1, 2), offs), lambda: torch._grouped_mm(dy, w, offs=offs)),
            "wgrad": (lambda: kf.grouped_mm_wgrad(dy, x, offs), lambda: torch._grouped_mm(dy.t(), x, offs=offs)),
        }
        for name, (ours, theirs) in rows.items():
            a, b = ms(ours), ms(theirs)
            print(f"e{e}t{t}n{n}k{k} {name:6s} kernelforge {a:.3f} ms {tf / a:6.1f} TF/s | torch._grouped_mm "
                  f"{b:.3f} ms {tf / b:6.1f} TF/s | {b / a:.2f}x")


if __name__ == "__main__":
    main(sys.argv[1:])
