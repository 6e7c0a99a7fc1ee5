"""`kforge build-hub OUTDIR`: the installed kernelforge as a tree the HuggingFace ``kernels`` package loads
(``kernels.get_local_kernel(OUTDIR)``, ``LocalLayerRepository(OUTDIR, layer_name="RMSNorm")`` for
``kernelize``, or the same tree uploaded to the Hub):

  OUTDIR/build/<variant>/metadata.json     name, id, python-depends, backend (what kernels reads)
  OUTDIR/build/<variant>/__init__.py       the entry point: kernelforge's API and ``layers``
  OUTDIR/build/<variant>/kernelforge/      a copy of the installed package (Python and the compiled ops)

<variant> names the torch / C++ ABI / CUDA / CPU the compiled ops were built for, as ``kernels``
matches it against the running system, e.g. ``torch211-cxx11-cu130-x86_64-linux``.

One process holds one ``torch.ops.kernelforge`` namespace: the entry point imports the ``kernelforge``
package of its tree, or, when a ``kernelforge`` is already imported (an installed one), serves that one
(with a warning if its version differs from the tree's). A build per torch version is needed: the ops
use torch's C++ API, not its stable ABI.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import shutil
import sys

import torch

import kernelforge

ENTRY = '''"""kernelforge for the HuggingFace kernels hub (written by `kforge build-hub`): the package in
./kernelforge, its API and its stateless ``layers`` (RMSNorm, LayerNorm, SiluAndMul, GeluAndMul,
GeluTanhAndMul, apply_rotary_transformers) for ``kernels.kernelize``."""

import os as _os
import sys as _sys
import warnings as _warnings

_HERE = _os.path.dirname(_os.path.abspath(__file__))
_VERSION = {version!r}

if "kernelforge" in _sys.modules:  # one torch.ops.kernelforge namespace per process: serve the loaded package
    _kf = _sys.modules["kernelforge"]
    if getattr(_kf, "__version__", None) != _VERSION:
        _warnings.warn(
            f"kernelforge {{getattr(_kf, '__version__', '?')}} is already imported from {{_kf.__file__}}; "
            f"the hub build at {{_HERE}} (kernelforge {{_VERSION}}) is served by it",
            stacklevel=2,
        )
else:
    _sys.path.insert(0, _HERE)
    try:
        import kernelforge as _kf
    finally:
        _sys.path.remove(_HERE)

from kernelforge import *  # noqa: E402,F401,F403
from kernelforge import layers  # noqa: E402,F401

__version__ = _kf.__version__
__all__ = list(_kf.__all__) + ["layers"]
'''


def variant_name() -> str:
    """The build variant ``kernels`` matches against the running system:
    torch<major><minor>-cxx11|cxx98-cu<version>|cpu-<machine>-linux."""
    major, minor = torch.__version__.split("+")[0].split(".")[:2]
    abi = "cxx11" if torch._C._GLIBCXX_USE_CXX11_ABI else "cxx98"
    backend = "cu" + torch.version.cuda.replace(".", "") if torch.version.cuda else "cpu"
    return f"torch{major}{minor}-{abi}-{backend}-{platform.machine()}-linux"


def build_hub(outdir: str, variant: str | None = None, license: str = "NOASSERTION") -> str:
    """Writes the tree under ``outdir`` (its build/<variant> is replaced); returns the variant directory.
    ``license`` fills metadata.json's required field (an SPDX expression; NOASSERTION: none declared)."""
    variant = variant or variant_name()
    src = os.path.dirname(os.path.abspath(kernelforge.__file__))
    lib = os.path.join(src, "libkernelforge_torch.so")
    if not os.path.exists(lib):
        raise FileNotFoundError(f"build-hub: the compiled ops {lib} are missing: build or install kernelforge first")
    vdir = os.path.join(os.path.abspath(outdir), "build", variant)
    if os.path.exists(vdir):
        shutil.rmtree(vdir)
    os.makedirs(vdir)
    shutil.copytree(src, os.path.join(vdir, "kernelforge"), symlinks=False,
                    ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    with open(os.path.join(vdir, "__init__.py"), "w") as f:
        f.write(ENTRY.format(version=kernelforge.__version__))
    with open(lib, "rb") as f:
        digest = hashlib.sha256(f.read()).hexdigest()[:8]
    meta = {
        "name": "kernelforge",
        "id": f"_kernelforge_{digest}",  # the module name kernels imports the entry point as
        "version": 1,
        "license": license,
        "python-depends": [],
        "backend": {"type": "cuda" if torch.version.cuda else "cpu"},
    }
    with open(os.path.join(vdir, "metadata.json"), "w") as f:
        json.dump(meta, f, indent=2)
        f.write("\n")
    return vdir


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("outdir", help="the kernel repository to write (its build/<variant> is replaced)")
    p.add_argument("--variant", default=None, help=f"build variant name (default: this system's, {variant_name()})")
    p.add_argument("--license", default="NOASSERTION",
                   help="metadata.json's license field, an SPDX expression (default NOASSERTION: none declared)")


def main(args: argparse.Namespace) -> int:
    vdir = build_hub(args.outdir, args.variant, args.license)
    print(f"kforge build-hub: wrote {vdir}")
    print(f"  load it: kernels.get_local_kernel(pathlib.Path({os.path.abspath(args.outdir)!r}))")
    return 0


if __name__ == "__main__":
    sys.exit(main(argparse.ArgumentParser().parse_args()))
