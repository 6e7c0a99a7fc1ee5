"""Developer tool: apply_rope forward on q and k as HF hands them over ([B, H, S, D] views of
[B, S, H, D] memory, cos/sin [B, S, D] in q's dtype, 32/8 heads of 128, bf16), CUDA-graph replay
time per call (100 calls per graph, median of 20 replays, no L2 flush: the decode metric of
`kforge bench`), optionally Liger's, over a range of token counts (the flat/token kernel crossover):

    PYTHONPATH=python python3 dev/prof_rope.py [--tokens 1,8,64,256] [--liger]
"""
import argparse

import torch

import kernelforge as kf
from kernelforge.bench import Budget, Timer


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", default="1,8,64,128,256,512,1024")
    ap.add_argument("--liger", action="store_true")
    a = ap.parse_args()
    timer = Timer(torch.device("cuda"), Budget())  # kforge bench's fwd_graph timing
    hq, hk, d = 32, 8, 128
    for t in (int(v) for v in a.tokens.split(",")):
        b, s = (t, 1) if t <= 64 else (1, t)
        dt = torch.bfloat16
        q = torch.randn(b, s, hq, d, device="cuda", dtype=dt).transpose(1, 2)
        k = torch.randn(b, s, hk, d, device="cuda", dtype=dt).transpose(1, 2)
        ang = torch.rand(b, s, d // 2, device="cuda") * 6.28
        cos = torch.cat([ang.cos(), ang.cos()], -1).to(dt)
        sin = torch.cat([ang.sin(), ang.sin()], -1).to(dt)
        fns = {"kf": lambda: kf.apply_rope(q, k, cos, sin, layout="bhsd")}
        if a.liger:
            from liger_kernel.transformers.rope import liger_rotary_pos_emb

            qc, kc = q.clone(), k.clone()
            fns["liger"] = lambda: liger_rotary_pos_emb(qc, kc, cos, sin)
        with torch.no_grad():
            for name, fn in fns.items():
                print(f"tokens {t:6d} {name:6s} {timer.graph_ms(fn) * 1e3:7.2f} us/call (graph)", flush=True)


if __name__ == "__main__":
    main()
