"""`kforge`: the kernelforge command line.

    kforge bench [ops...] [--ops LIST] [--shapes 16384x4096,1x4096] [--dtype bf16] [--providers ...]
                 [--modes fwd,fwdbwd,fwd_graph,fwd_call] [--rows 4096,...] [--sweep] [--plan]
                 [--save [--out-dir benchmarks]] [--out bench_out] [--quick] [--max-seconds S]
    kforge check [ops...] [--dtype bf16,fp16,fp32] [--seed N]

Both read the op specs of kernelforge.specs.
Both need a CUDA GPU and the built extension; without one they say so and exit with status 2.
Also runnable as `python -m kernelforge.cli`.
"""
from __future__ import annotations

import argparse
import sys


def build_parser() -> argparse.ArgumentParser:
    from kernelforge import bench, check  # noqa: PLC0415

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
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        print("kforge: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
