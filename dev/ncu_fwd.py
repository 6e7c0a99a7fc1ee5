"""One launch of each forward kernel of interest (kernelforge and Liger) for Nsight Compute:
    ncu --clock-control none --section SpeedOfLight ... python3 dev/ncu_fwd.py ROWSxN [OPS]
OPS: comma-separated from rms, layer, layer_plain, ada, ada_d ([N] scale/shift), add, liger, softmax, log_softmax, liger_softmax, the
backward calls rms_bwd, layer_bwd, ada_bwd, and compile_rms, compile_layer, compile_ada (torch.compile of
the bench's eager code, compiled and warmed up before the profiler range; run ncu with
--profile-from-start off to skip the autotuning launches). Default rms,layer,liger. ada is the bench's
case: x [4, rows/4, N], scale/shift [4, 1, N], no weight or bias.
"""
import sys

import torch

sys.path.insert(0, __import__("os").environ.get("KF_PYDIR", "python"))
import kernelforge as kf  # noqa: E402

rows, n = (int(v) for v in sys.argv[1].split("x"))
which = (sys.argv[2] if len(sys.argv) > 2 else "rms,layer,liger").split(",")
x = torch.randn(rows, n, device="cuda", dtype=torch.bfloat16)
w = torch.randn(n, device="cuda", dtype=torch.bfloat16)
b = torch.randn(n, device="cuda", dtype=torch.bfloat16)
compiled = []
if any(o.startswith("compile_") for o in which):
    from kernelforge import bench

    sc4 = torch.randn(4, 1, n, device="cuda", dtype=torch.bfloat16) * 0.1
    t = {"x": x, "weight": w, "bias": b}
    ta = {"x": x.view(4, rows // 4, n), "scale": sc4, "shift": sc4.clone()}
    for name, op, args in (("compile_rms", "rms_norm", t), ("compile_layer", "layer_norm", t),
                           ("compile_ada", "ada_norm", ta)):
        if name in which:
            torch._dynamo.reset()
            fn = torch.compile(bench.eager_provider(op), dynamic=False)
            with torch.no_grad():
                for _ in range(3):
                    fn(args)
            compiled.append((fn, args))
    torch.cuda.synchronize()
torch.cuda.profiler.start()
for fn, args in compiled:
    with torch.no_grad():
        fn(args)
if "rms" in which:
    kf.rms_norm(x, w)
if "layer" in which:
    kf.layer_norm(x, w, b)
if "add" in which:
    kf.add_rms_norm(x, torch.randn_like(x), w)
if "layer_plain" in which:  # no weight, no bias: LayerNorm's part of AdaLN's work
    kf.layer_norm(x, None, None)
if "ada_d" in which:  # scale/shift [N]: one group
    sd = torch.randn(n, device="cuda", dtype=torch.bfloat16) * 0.1
    kf.ada_norm(x, sd, sd.clone())
if "ada" in which:
    sc = torch.randn(4, 1, n, device="cuda", dtype=torch.bfloat16) * 0.1
    kf.ada_norm(x.view(4, rows // 4, n), sc, sc.clone())
if "softmax" in which:
    kf.softmax(x, -1)
if "log_softmax" in which:
    kf.log_softmax(x, -1)
if "liger_softmax" in which:
    try:
        from liger_kernel.ops.softmax import LigerSoftmaxFunction

        LigerSoftmaxFunction.apply(x)
    except Exception as e:  # noqa: BLE001
        print("no liger softmax:", e)
ops = torch.ops.kernelforge
dy = torch.randn_like(x) if any(o.endswith("_bwd") for o in which) else None
if "rms_bwd" in which:
    ops.rms_norm_backward(dy, x, w, 1e-6)
if "layer_bwd" in which:
    ops.layer_norm_backward(dy, x, w, b, 1e-5)
if "ada_bwd" in which:
    sc = torch.randn(4, 1, n, device="cuda", dtype=torch.bfloat16) * 0.1
    ops.ada_norm_backward(dy.view(4, rows // 4, n), x.view(4, rows // 4, n), sc, sc.clone(), None, None, 1e-6, 1)
if "liger" in which:
    try:
        from liger_kernel.transformers import functional as lf
        lf.liger_rms_norm(x, w, 1e-6, casting_mode="llama")
        lf.liger_layer_norm(x, w, b, 1e-5)
    except Exception as e:  # noqa: BLE001
        print("no liger:", e)
torch.cuda.synchronize()
