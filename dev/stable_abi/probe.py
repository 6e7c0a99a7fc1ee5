"""What a stable-ABI build would cost on the decode-sized host path: kernelforge's rms_norm through
the regular binding (an unboxed C++ kernel and a C++ autograd kernel) against the same core call
bound with torch's stable ABI (kf_stable.cpp: a boxed kernel, the output allocated through the C
shim) with its autograd registered from Python (the stable ABI has no autograd registration).

    python dev/stable_abi/probe.py [--lib PATH/libkernelforge.a] [--calls N]

Builds kf_stable.cpp with torch.utils.cpp_extension against the static core library (default
_build/dev/libkernelforge.a, as scripts/gpu_run.sh builds it); needs the regular binding importable
(kernelforge on PYTHONPATH). Prints microseconds per call: wall clock around N back-to-back calls and
one synchronize (decode-sized rows, so the host path, not the kernel, sets the time), median of 7.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch
from torch.utils import cpp_extension

import kernelforge  # noqa: F401  (loads the regular binding: torch.ops.kernelforge)

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))


def build(lib: str) -> None:
    cuda_home = cpp_extension.CUDA_HOME or "/usr/local/cuda"
    cpp_extension.load(
        name="kf_stable", sources=[os.path.join(HERE, "kf_stable.cpp")], is_python_module=False, verbose=False,
        extra_include_paths=[os.path.join(ROOT, "include"), os.path.join(cuda_home, "include")],
        extra_cflags=["-O2", "-DUSE_CUDA"], extra_ldflags=[lib, f"-L{cuda_home}/lib64", "-lcudart",
                       f"-L{os.path.join(os.path.dirname(torch.__file__), 'lib')}", "-ltorch_cuda"])


def register_python_autograd() -> None:
    def setup_context(ctx, inputs, output):
        x, w, eps = inputs
        ctx.save_for_backward(x, w)
        ctx.eps = eps

    def backward(ctx, dy):
        x, w = ctx.saved_tensors
        dx, dw = torch.ops.kernelforge.rms_norm_backward(dy, x, w, ctx.eps)
        return dx, dw, None

    torch.library.register_autograd("kf_stable::rms_norm", backward, setup_context=setup_context)


def per_call_us(fn, calls: int) -> float:
    for _ in range(50):
        fn()
    torch.cuda.synchronize()
    runs = []
    for _ in range(7):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
        runs.append((time.perf_counter() - t0) / calls * 1e6)
    return statistics.median(runs)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--lib", default=os.path.join(ROOT, "_build", "dev", "libkernelforge.a"))
    p.add_argument("--calls", type=int, default=2000)
    args = p.parse_args()
    build(os.path.abspath(args.lib))
    register_python_autograd()
    regular, stable = torch.ops.kernelforge.rms_norm, torch.ops.kf_stable.rms_norm
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}; rms_norm bfloat16, us per call")
    print(f"{'rows x hidden':<14} {'grad':<5} {'regular':>8} {'stable':>8} {'extra':>7}")
    for rows in (1, 64):
        x = torch.randn(rows, 4096, device="cuda", dtype=torch.bfloat16)
        w = torch.randn(4096, device="cuda", dtype=torch.bfloat16)
        torch.testing.assert_close(stable(x, w, 1e-6), regular(x, w, 1e-6), rtol=0, atol=0)
        for grad in (False, True):
            xg, wg = x.clone().requires_grad_(grad), w.clone().requires_grad_(grad)
            if grad:  # the Python autograd's backward computes what the C++ one does
                y1, y2 = stable(xg, wg, 1e-6), regular(xg, wg, 1e-6)
                dy = torch.randn_like(y1)
                g1 = torch.autograd.grad(y1, (xg, wg), dy)
                g2 = torch.autograd.grad(y2, (xg, wg), dy)
                for a, b in zip(g1, g2):
                    torch.testing.assert_close(a, b, rtol=0, atol=0)
            t_reg = per_call_us(lambda: regular(xg, wg, 1e-6), args.calls)
            t_st = per_call_us(lambda: stable(xg, wg, 1e-6), args.calls)
            print(f"{rows:>5} x 4096   {'yes' if grad else 'no':<5} {t_reg:>8.2f} {t_st:>8.2f} {t_st - t_reg:>+7.2f}")


if __name__ == "__main__":
    main()
