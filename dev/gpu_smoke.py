"""Quick GPU smoke run for kernel development: every norm op vs the float64 CPU reference on a few
shapes and dtypes, then a short timing table of the acceptance shapes against torch peers.
Not the benchmark (that is `kforge bench`); this exists to iterate on kernels inside one device call.

    PYTHONPATH=python python3 dev/gpu_smoke.py [--time-only] [--check-only]
"""
import argparse
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, __import__("os").environ.get("KF_PYDIR", "python"))
import kernelforge as kf  # noqa: E402

ops = torch.ops.kernelforge
DT = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
TOL = {torch.bfloat16: 2e-2, torch.float16: 4e-3, torch.float32: 1e-4}


def rel(a, b):
    a, b = a.double().cpu(), b.double().cpu()
    if not torch.isfinite(a).all():
        return float("inf")
    # relative, with an absolute floor for ill-conditioned tiny results (e.g. dx of a 1-element row)
    return ((a - b).norm() / (b.norm() + 1e-3 * b.numel() ** 0.5)).item()


def make(shape, dt, dev, seed):
    g = torch.Generator(device="cpu").manual_seed(seed)
    return (torch.randn(shape, generator=g, dtype=torch.float32) * 1.5 + 0.3).to(dt).to(dev)


def check(op, rows, n, dt, ada_shape="b1d"):
    x = make((rows, n), dt, "cuda", 1)
    w = make((n,), dt, "cuda", 2)
    b = make((n,), dt, "cuda", 3)
    dy = make((rows, n), dt, "cuda", 4)
    B = 2 if rows % 2 == 0 and rows > 0 else 1
    if ada_shape == "d":
        sshape = (n,)
    elif ada_shape == "b1d":
        sshape = (B, 1, n)
    else:
        sshape = (B, rows // B, n)
    sc = make(sshape, dt, "cuda", 5) * 0.1
    sh = make(sshape, dt, "cuda", 6) * 0.1
    r = make((rows, n), dt, "cuda", 7)
    torch.cuda.synchronize()
    c = lambda t: t.cpu()  # noqa: E731
    errs = []
    if op == "rms_norm":
        outs = [ops.rms_norm(x, w, 1e-6)] + list(ops.rms_norm_backward(dy, x, w, 1e-6))
        refs = [ops.rms_norm(c(x), c(w), 1e-6)] + list(ops.rms_norm_backward(c(dy), c(x), c(w), 1e-6))
    elif op == "add_rms_norm":
        outs = list(ops.add_rms_norm(x, r, w, 1e-6)) + list(ops.add_rms_norm_backward(dy, r, x, w, 1e-6))
        refs = list(ops.add_rms_norm(c(x), c(r), c(w), 1e-6)) + list(
            ops.add_rms_norm_backward(c(dy), c(r), c(x), c(w), 1e-6))
    elif op == "layer_norm":
        outs = [ops.layer_norm(x, w, b, 1e-5)] + list(ops.layer_norm_backward(dy, x, w, b, 1e-5))
        refs = [ops.layer_norm(c(x), c(w), c(b), 1e-5)] + list(ops.layer_norm_backward(c(dy), c(x), c(w), c(b), 1e-5))
    else:
        kind = "layer" if op == "ada_layer" else "rms"
        x3 = x.view(B, rows // B, n) if rows else x.view(1, 0, n)
        dy3 = dy.view_as(x3)
        outs = [ops.ada_norm(x3, sc, sh, w, b, 1e-6, kind)] + list(
            ops.ada_norm_backward(dy3, x3, sc, sh, w, b, 1e-6, kind))
        refs = [ops.ada_norm(c(x3), c(sc), c(sh), c(w), c(b), 1e-6, kind)] + list(
            ops.ada_norm_backward(c(dy3), c(x3), c(sc), c(sh), c(w), c(b), 1e-6, kind))
    torch.cuda.synchronize()
    for o, rf in zip(outs, refs):
        if rf.numel() == 0:
            continue
        errs.append(rel(o, rf))
    return errs


def time_fn(fn, reps=50):
    flush = torch.empty(256 * 1024 * 1024, dtype=torch.uint8, device="cuda")
    for _ in range(3):
        fn()
    ts = []
    for _ in range(reps):
        flush.zero_()
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        fn()
        e.record()
        e.synchronize()
        ts.append(s.elapsed_time(e))
    ts.sort()
    return ts[len(ts) // 2]


def hf_rms(x, w, eps=1e-6):
    h = x.float()
    v = h.pow(2).mean(-1, keepdim=True)
    h = h * torch.rsqrt(v + eps)
    return w * h.to(x.dtype)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--time-only", action="store_true")
    ap.add_argument("--check-only", action="store_true")
    ap.add_argument("--kf-only", action="store_true", help="time kernelforge only, no peers")
    ap.add_argument("--fwd-only", action="store_true")
    ap.add_argument("--shapes", default="16384x2048,16384x4096,16384x8192,4096x65536,2048x131072")
    a = ap.parse_args()
    fails = 0
    if not a.time_only:
        shapes = [(1, 1), (7, 1000), (3, 4096), (19, 4097), (4, 8191), (2, 65536), (2, 131072), (1, 262144),
                  (64, 4096), (0, 4096), (6, 16384)]
        for op in ["rms_norm", "add_rms_norm", "layer_norm", "ada_layer", "ada_rms"]:
            for dn, dt in DT.items():
                for rows, n in shapes:
                    if op.startswith("ada") and rows == 0:
                        continue
                    for ada_shape in (["d", "b1d", "bsd"] if op.startswith("ada") and rows in (64, 6) else ["b1d"]):
                        try:
                            errs = check(op, rows, n, dt, ada_shape)
                            ok = all(e < TOL[dt] for e in errs)
                            msg = " ".join(f"{e:.1e}" for e in errs)
                        except Exception as ex:  # noqa: BLE001
                            ok, msg = False, f"EXC {type(ex).__name__}: {str(ex)[:200]}"
                        if not ok:
                            fails += 1
                        print(f"{'ok  ' if ok else 'FAIL'} {op:13s} {dn} {rows}x{n} {ada_shape}: {msg}", flush=True)
        print(f"correctness failures: {fails}", flush=True)
    if a.check_only:
        return 1 if fails else 0
    copy_src = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
    copy_dst = torch.empty_like(copy_src)
    t = time_fn(lambda: copy_dst.copy_(copy_src))
    bw = 2 * (1 << 30) / t / 1e6
    print(f"d2d copy: {bw:.0f} GB/s")
    comp = torch.compile(hf_rms)
    for rows, n in [tuple(int(v) for v in sh.split("x")) for sh in a.shapes.split(",")]:
        x = make((rows, n), torch.bfloat16, "cuda", 1)
        w = make((n,), torch.bfloat16, "cuda", 2)
        b = make((n,), torch.bfloat16, "cuda", 3)
        B = 4
        sc = make((B, 1, n), torch.bfloat16, "cuda", 5) * 0.1
        sh = make((B, 1, n), torch.bfloat16, "cuda", 6) * 0.1
        r = make((rows, n), torch.bfloat16, "cuda", 7)
        byt = 2 * rows * n * 2
        cases = {
            "kf_rms": (lambda: kf.rms_norm(x, w), byt),
            "F.rms": (lambda: F.rms_norm(x, (n,), w, 1e-6), byt),
            "compile_rms": (lambda: comp(x, w), byt),
            "kf_add_rms": (lambda: kf.add_rms_norm(x, r, w), 2 * byt),
            "kf_layer": (lambda: kf.layer_norm(x, w, b), byt),
            "F.layer": (lambda: F.layer_norm(x, (n,), w, b, 1e-5), byt),
            "kf_ada": (lambda: kf.ada_norm(x.view(B, -1, n), sc, sh), byt),
        }
        try:
            from liger_kernel.transformers import functional as lf
            cases["liger_rms"] = (lambda: lf.liger_rms_norm(x, w, 1e-6, casting_mode="llama"), byt)
            cases["liger_add"] = (lambda: lf.liger_fused_add_rms_norm(x, r, w, 1e-6, casting_mode="llama",
                                                                      in_place=False), 2 * byt)
            cases["liger_layer"] = (lambda: lf.liger_layer_norm(x, w, b, 1e-5), byt)
        except Exception:  # noqa: BLE001
            pass
        res = {k: (time_fn(f), nb) for k, (f, nb) in cases.items() if k.startswith("kf") or not a.kf_only}
        if n <= 8192 and not a.fwd_only:
            xg = x.clone().requires_grad_(True)
            wg = w.clone().requires_grad_(True)
            dy = make((rows, n), torch.bfloat16, "cuda", 4)

            def fb(fn):
                def run():
                    y = fn()
                    torch.autograd.grad(y, [xg], dy)
                return run
            res["kf_rms_fb"] = (time_fn(fb(lambda: kf.rms_norm(xg, wg))), 5 * rows * n * 2)
            if not a.kf_only:
                res["compile_rms_fb"] = (time_fn(fb(lambda: comp(xg, wg))), 5 * rows * n * 2)
            bg = b.clone().requires_grad_(True)
            res["kf_layer_fb"] = (time_fn(fb(lambda: kf.layer_norm(xg, wg, bg))), 5 * rows * n * 2)
            scg, shg = sc.clone().requires_grad_(True), sh.clone().requires_grad_(True)
            res["kf_ada_fb"] = (time_fn(fb(lambda: kf.ada_norm(xg.view(B, -1, n), scg, shg).view(rows, n))),
                                5 * rows * n * 2)
        line = " ".join(f"{k}={byt_ / t_ / 1e6:.0f}" for k, (t_, byt_) in res.items())
        print(f"{rows}x{n} GB/s: {line}", flush=True)
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
