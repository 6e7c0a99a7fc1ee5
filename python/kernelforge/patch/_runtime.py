"""What patched forwards share at run time: the announced fallback to the original computation and
the input checks every family makes.

A patched forward sends an input to the kernel only when the result is the one the original forward
would give; otherwise it runs the original and warns once (``warned`` holds the messages already
given), or raises when the environment has ``KF_STRICT=1``. It never falls back silently.
"""

from __future__ import annotations

import os
import warnings

import torch

from ._registry import STATE_ATTR

warned: set[str] = set()

DTYPE_HINT = "Cast the model and its inputs to one dtype to use the kernel."


def announce_fallback(subject: str, why: str, original: str, hint: str, stacklevel: int) -> None:
    """"<subject> called with <why>; ... the original <original> runs instead": warn once, or raise
    with KF_STRICT=1. ``subject`` is a module class, or a function a patched forward calls."""
    msg = (
        f"kernelforge: {subject} called with {why}; the kernel cannot reproduce the "
        f"original result, so the original {original} runs instead"
    )
    if os.environ.get("KF_STRICT") == "1":
        raise RuntimeError(msg + " (KF_STRICT=1 makes this an error)")
    if msg not in warned:
        warned.add(msg)
        warnings.warn(f"{msg}. {hint}", stacklevel=stacklevel)


def warn_fallback(module: torch.nn.Module, why: str, hint: str = DTYPE_HINT, stacklevel: int = 4) -> None:
    """Announce that the module's original forward runs instead of the kernel."""
    announce_fallback(type(module).__name__, why, "forward", hint, stacklevel + 1)


def fallback(module: torch.nn.Module, why: str, *args, **kwargs):
    """Run the original forward for an input the kernel cannot take, announced."""
    warn_fallback(module, why)
    return original(module)(*args, **kwargs)


def original(module: torch.nn.Module):
    """The module's original (class) forward, bound to it."""
    return module.__dict__[STATE_ATTR].original


def rows(x: torch.Tensor) -> torch.Tensor:
    """x itself when the op can read it as rows (contiguous last dim, leading dims collapse into one
    stride); otherwise a contiguous copy. Same values either way, so this is not a fallback."""
    if x.is_contiguous():
        return x
    shape, strides = x.shape, x.stride()
    if x.dim() == 0 or (shape[-1] > 1 and strides[-1] != 1):
        return x.contiguous()
    expect = -1
    for size, stride in zip(reversed(shape[:-1]), reversed(strides[:-1])):
        if size == 1:
            continue
        if expect >= 0 and stride != expect:
            return x.contiguous()
        expect = stride * size
    return x


def unit_last(t: torch.Tensor) -> torch.Tensor:
    """t itself when its last dimension has stride 1 (what the ops read); otherwise a contiguous copy."""
    return t if t.shape[-1] <= 1 or t.stride(-1) == 1 else t.contiguous()


def dtype_mismatch(x: torch.Tensor, p: torch.Tensor | None, name: str) -> str | None:
    if p is not None and p.dtype != x.dtype:
        return f"input dtype {x.dtype} and {name} dtype {p.dtype}"
    return None
