"""One launch of each forward kernel of interest (kernelforge and Liger) for Nsight Compute:
    ncu --clock-control none --section SpeedOfLight ... python3 scripts/ncu_fwd.py ROWSxN
"""
import sys

import torch

sys.path.insert(0, __import__("os").environ.get("KF_PYDIR", "python"))
import kernelforge as kf  # noqa: E402

rows, n = (int(v) for v in sys.argv[1].split("x"))
x = torch.randn(rows, n, device="cuda", dtype=torch.bfloat16)
w = torch.randn(n, device="cuda", dtype=torch.bfloat16)
b = torch.randn(n, device="cuda", dtype=torch.bfloat16)
kf.rms_norm(x, w)
kf.layer_norm(x, w, b)
try:
    from liger_kernel.transformers import functional as lf
    lf.liger_rms_norm(x, w, 1e-6, casting_mode="llama")
    lf.liger_layer_norm(x, w, b, 1e-5)
except Exception as e:  # noqa: BLE001
    print("no liger:", e)
torch.cuda.synchronize()
