"""Loads the compiled ops (libkernelforge_torch.so next to this file) into ``torch.ops.kernelforge``.

The ops (CUDA kernels, the float64 CPU reference, autograd) and their schemas live in C++, one file
per family (`torch/kf_<family>.cpp`); each family's Python module (norm.py, activation.py, rope.py,
softmax.py, cross_entropy.py) registers its fake implementations and defines the functional API.
"""

from __future__ import annotations

import os

import torch

_LIB_NAME = "libkernelforge_torch.so"
_LIB_PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), _LIB_NAME)


def _load_library() -> None:
    if not os.path.exists(_LIB_PATH):
        raise ImportError(
            f"kernelforge: the compiled extension {_LIB_NAME} was not found next to the package "
            f"({_LIB_PATH}). Build it with `scripts/dev_build.sh` (developer checkout, then use "
            "PYTHONPATH=python) or install the package with `pip install .`."
        )
    try:
        torch.ops.load_library(_LIB_PATH)
    except OSError as e:  # e.g. built against another torch, or a missing CUDA runtime library
        raise ImportError(
            f"kernelforge: could not load {_LIB_PATH}: {e}. Rebuild it against the installed torch "
            f"({torch.__version__}) with `scripts/dev_build.sh` or reinstall with `pip install .`."
        ) from e


_load_library()

_ops = torch.ops.kernelforge
