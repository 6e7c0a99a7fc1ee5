"""Forward + backward time of kernelforge.attention with each option against the plain call (and
cuDNN's SDPA for the plain call), CUDA events, median of N runs:
    python3 dev/attn_bwd_options.py [b4h16s4096d128 ...]
Options: plain, causal, softcap 30, sinks, window 1024 (left), deterministic, deterministic causal.
TFLOP/s: forward 4 B H Sq Sk D (causal halved), backward 2.5x that.
"""
import re
import sys

import torch

sys.path.insert(0, __import__("os").environ.get("KF_PYDIR", "python"))
import kernelforge as kf  # noqa: E402

N = 20


def timed(fn):
    for _ in range(3):
        fn()
    ts = []
    for _ in range(N):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        torch.cuda.synchronize()
        ts.append(a.elapsed_time(b))
    return sorted(ts)[N // 2]


def case(shape):
    m = re.fullmatch(r"b(\d+)h(\d+)s(\d+)d(\d+)", shape)
    b, h, s, d = (int(m.group(i)) for i in range(1, 5))
    q, k, v = (torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    dout = torch.randn_like(q)
    sinks = torch.randn(h, device="cuda", dtype=torch.float32, requires_grad=True)
    flops = 4 * b * h * s * s * d * 3.5
    opts = {
        "plain": {},
        "causal": {"causal": True},
        "softcap30": {"softcap": 30.0},
        "sinks": {"sinks": sinks},
        "window1024": {"window": (1024, -1)},
        "deterministic": {"deterministic": True},
        "deterministic_causal": {"causal": True, "deterministic": True},
    }
    base = None
    for name, kw in opts.items():
        def run(kw=kw):
            out = kf.attention(q, k, v, **kw)
            torch.autograd.grad(out, (q, k, v), dout)
        ms = timed(run)
        f = flops / (2 if kw.get("causal") else 1)
        base = base or ms
        print(f"{shape:18s} {name:22s} {ms * 1e3:9.1f} us {f / ms / 1e9:7.1f} TFLOP/s  {ms / base:5.2f}x plain", flush=True)
    qt, kt, vt = (t.detach().transpose(1, 2).requires_grad_() for t in (q, k, v))
    dt = dout.transpose(1, 2)
    for causal in (False, True):
        def run_cudnn(causal=causal):
            with torch.nn.attention.sdpa_kernel(torch.nn.attention.SDPBackend.CUDNN_ATTENTION):
                out = torch.nn.functional.scaled_dot_product_attention(qt, kt, vt, is_causal=causal)
            torch.autograd.grad(out, (qt, kt, vt), dt)
        ms = timed(run_cudnn)
        f = flops / (2 if causal else 1)
        print(f"{shape:18s} {'cudnn' + (' causal' if causal else ''):22s} {ms * 1e3:9.1f} us {f / ms / 1e9:7.1f} TFLOP/s",
              flush=True)


for sh in sys.argv[1:] or ["b4h16s4096d128", "b4h32s4096d64"]:
    case(sh)
