"""`kforge`: the kernelforge command line.

    kforge bench [ops...] [--ops LIST] [--shapes 16384x4096,1x4096] [--dtype bf16] [--providers ...]
                 [--modes fwd,fwdbwd,fwd_graph,fwd_call] [--rows 4096,...] [--sweep] [--plan]
                 [--save [--out-dir benchmarks]] [--out bench_out] [--quick] [--max-seconds S]
    kforge check [ops...] [--dtype bf16,fp16,fp32] [--seed N]
    kforge profile [--model llama|llama_train|vit|vit_train|ltx] [--size full|small] [--device cuda|cpu]
                   [--steps N] [--top K] [--trace DIR]
    kforge levels [--models lm,llama,vit,gnn] [--levels eager,torchscript,compile,triton,kernelforge,...]
                  [--modes fwd,train] [--size full|small] [--device cuda|cpu] [--iters N] [--out DIR]
    kforge e2e    [--cases llama_train,llama_prefill,vit_train,ltx] [--providers ...] [--size full|small]
                  [--iters N] [--out DIR]         (also `kforge bench e2e ...`)
    kforge bench generate [e2e options]           e2e over llama_generate(_b16, _b64) with HF's and kf's generate
    kforge dist   [--gpus 2] [--cases fsdp_train,tp_train,vp_ce] [--providers ...] [--size full|small]
                  [--device cuda|cpu] [--iters N] [--out DIR]
    kforge build-hub OUTDIR [--variant NAME]

bench and check read the op specs of kernelforge.specs; they need a CUDA GPU and the built
extension, and without one they say so and exit with status 2. profile runs a model step before and
after kf.patch, levels one model at each optimization level, e2e whole model steps with each provider
in its own process (all three on the CPU too), dist the multi-GPU steps (FSDP2, tensor parallelism, the
vocabulary-parallel loss), each provider in its own torchrun job. build-hub writes the installed package as
a tree the HuggingFace `kernels` package loads (get_local_kernel, kernelize).
Also runnable as `python -m kernelforge.cli`.
"""
from __future__ import annotations

import argparse
import sys


def build_parser() -> argparse.ArgumentParser:
    from kernelforge import bench, check  # noqa: PLC0415
    from kernelforge import e2e  # noqa: PLC0415
    from kernelforge import e2e_dist  # noqa: PLC0415
    from kernelforge import hub  # noqa: PLC0415
    from kernelforge import levels as lev  # noqa: PLC0415
    from kernelforge import profile as prof  # noqa: PLC0415

    p = argparse.ArgumentParser(prog="kforge", description="kernelforge: benchmark and check the kernels")
    sub = p.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    b = sub.add_parser("bench", help="time the ops against eager / torch_native / compile / liger",
                       description=(bench.__doc__ or "").split("\n\n")[0])
    bench.add_arguments(b)
    b.set_defaults(func=bench.main)
    c = sub.add_parser("check", help="run every op (fwd + bwd) against the float64 reference",
                       description=(check.__doc__ or "").split("\n\n")[0])
    check.add_arguments(c)
    c.set_defaults(func=check.main)
    r = sub.add_parser("profile", help="where a model step's time goes, by op family, before and after kf.patch",
                       description=(prof.__doc__ or "").split("\n\n")[0])
    prof.add_arguments(r)
    r.set_defaults(func=prof.main)
    v = sub.add_parser("levels", help="one model at each optimization level (eager ... kernelforge + compile)",
                       description=(lev.__doc__ or "").split("\n\n")[0])
    lev.add_arguments(v)
    v.set_defaults(func=lev.main)
    e = sub.add_parser("e2e", help="end-to-end model steps, each provider in its own process",
                       description=(e2e.__doc__ or "").split("\n\n")[0])
    e2e.add_arguments(e)
    e.set_defaults(func=e2e.main)
    d = sub.add_parser("dist", help="multi-GPU training steps and the vocab-parallel loss, each provider its own job",
                       description=(e2e_dist.__doc__ or "").split("\n\n")[0])
    e2e_dist.add_arguments(d)
    d.set_defaults(func=e2e_dist.main)
    h = sub.add_parser("build-hub", help="write the package as a HuggingFace kernels hub tree (build/<variant>/)",
                       description=(hub.__doc__ or "").split("\n\n")[0])
    hub.add_arguments(h)
    h.set_defaults(func=hub.main)
    return p


# `kforge bench generate ...`: generation at batch 1 / 16 / 64 against HF generate (eager, static cache +
# torch.compile) and kernelforge.generate, in tokens/s against the bandwidth floor; arguments after it
# override these (argparse keeps the last --cases / --providers).
GENERATE_BENCH = ["--cases", "llama_generate,llama_generate_b16,llama_generate_b64",
                  "--providers", "eager,compile,generate,kernelforge_generate_fused"]


def expand_aliases(argv: list[str]) -> list[str]:
    """`kforge bench e2e ...` is `kforge e2e ...`; `kforge bench generate ...` is `kforge e2e` with GENERATE_BENCH."""
    if argv[:2] == ["bench", "e2e"]:
        return argv[1:]
    if argv[:2] == ["bench", "generate"]:
        return ["e2e", *GENERATE_BENCH, *argv[2:]]
    return argv


def main(argv: list[str] | None = None) -> int:
    argv = expand_aliases(list(sys.argv[1:] if argv is None else argv))
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        print("kforge: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
