"""One attention backward call for Nsight Compute (the forward runs before the profiler range):
    ncu --profile-from-start off --kernel-name regex:attention_bwd_wgmma ... \
        python3 dev/ncu_attn_bwd.py b4h32s4096d64[c] [deterministic]
The shape is the bench's b{B}h{H}s{S}d{D}[c] form (bshd layout, bfloat16).
"""
import re
import sys

import torch

sys.path.insert(0, __import__("os").environ.get("KF_PYDIR", "python"))
import kernelforge as kf  # noqa: E402

m = re.fullmatch(r"b(\d+)h(\d+)s(\d+)d(\d+)(c?)", sys.argv[1])
b, h, s, d = (int(m.group(i)) for i in range(1, 5))
causal = m.group(5) == "c"
det = len(sys.argv) > 2 and sys.argv[2] == "deterministic"
q, k, v = (torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
out = kf.attention(q, k, v, causal=causal, deterministic=det)
dout = torch.randn_like(out)
torch.cuda.synchronize()
torch.cuda.profiler.start()
out.backward(dout)
torch.cuda.synchronize()
torch.cuda.profiler.stop()
