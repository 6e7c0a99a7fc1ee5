"""Kernel-level time split of two ops with torch.profiler (CUDA activity): mla_decode at batch 1
(the main kernel against the split merge) and at b64 x 128 heads, and the fused linear
cross-entropy's forward + backward (its GEMMs and cross-entropy kernels against torch.compile's).
Not the benchmark: this says where the time of one call goes.

    PYTHONPATH=python python3 dev/prof_decode_flce.py [mla] [flce]
"""
import sys

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, __import__("os").environ.get("KF_PYDIR", "python"))
import kernelforge as kf  # noqa: E402


def table(fn, label, iters=5):
    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(iters):
            fn()
        torch.cuda.synchronize()
    print(f"==== {label} (per call, {iters} calls)")
    rows = []
    for e in prof.key_averages():
        t = getattr(e, "device_time_total", None) or getattr(e, "cuda_time_total", 0)
        if t > 0:
            rows.append((t / iters, e.count // iters, e.key[:110]))
    for t, n, k in sorted(rows, reverse=True)[:14]:
        print(f"{t:10.1f} us  x{n:<3d} {k}")


def mla(b, h, kv, lq=1, page=64):
    g = torch.Generator(device="cuda").manual_seed(0)
    q = torch.randn(b, lq, h, 576, device="cuda", dtype=torch.bfloat16, generator=g)
    per = -(-kv // page)
    cache = torch.randn(b * per, page, 576, device="cuda", dtype=torch.bfloat16, generator=g)
    table_ = torch.randperm(b * per, device="cuda", generator=g).view(b, per).to(torch.int32)
    lens = torch.full((b,), kv, dtype=torch.int32, device="cuda")
    table(lambda: kf.mla_decode(q, cache, lens, table_, max_seq_len=kv), f"mla_decode b{b} h{h} kv{kv} lq{lq}")


def flce(t=8192, h=4096, v=128256):
    g = torch.Generator(device="cuda").manual_seed(0)
    x = (torch.randn(t, h, device="cuda", generator=g) * 0.5).bfloat16().requires_grad_()
    w = (torch.randn(v, h, device="cuda", generator=g) * 0.02).bfloat16().requires_grad_()
    y = torch.randint(0, v, (t,), device="cuda", generator=g)

    def kf_step():
        kf.fused_linear_cross_entropy(x, w, y).backward()

    def ref(x, w, y):
        return torch.nn.functional.cross_entropy((x @ w.t()).float(), y)

    comp = torch.compile(ref)

    def comp_step():
        comp(x, w, y).backward()

    table(kf_step, f"kernelforge fused_linear_cross_entropy t{t} h{h} v{v} fwd+bwd", iters=2)
    comp_step()
    table(comp_step, f"torch.compile t{t} h{h} v{v} fwd+bwd", iters=2)


if __name__ == "__main__":
    which = sys.argv[1:] or ["mla", "flce"]
    if "mla" in which:
        mla(1, 128, 16384)
        mla(64, 128, 4096)
        mla(64, 128, 4096, lq=2)
    if "flce" in which:
        flce()
