"""How the family modules recognise what a module computes.

Source keys: a function is compared with a reference source by its syntax tree, normalized so that
cosmetic changes do not matter: names of the function, its parameters and its local variables,
annotations (of parameters, the return and annotated assignments), decorators, the docstring,
comments and layout are ignored; what stays is the computation (operations, attribute names,
global names called, constants, keyword names). Compared on the AST of the source, not on
bytecode: the same source compiles differently in another module (CPython 3.11 emits LOAD_ATTR
instead of LOAD_METHOD for ``mod.f()`` when the enclosing module imports ``mod``).

Probes: where the source alone cannot settle it, a family runs the module's own forward code on a
small CPU input next to the kernelforge computation (``probe_close``); a module whose forward does
not give the same values is skipped with the reason, never patched.
"""

from __future__ import annotations

import ast
import dis
import functools
import inspect
import sys
import textwrap
import types

import torch
from torch import nn


def qualname(cls: type) -> str:
    """torch.nn.RMSNorm, diffusers.RMSNorm, transformers.Qwen2RMSNorm: tells same-named classes apart."""
    mod = cls.__module__ or ""
    if mod.startswith("torch.nn."):
        return f"torch.nn.{cls.__name__}"
    return f"{mod.split('.')[0]}.{cls.__name__}" if mod else cls.__name__


def diffusers_class(module_name: str, cls_name: str):
    """A diffusers class if its module is loaded (never imports diffusers: if it is not loaded, no model uses it)."""
    mod = sys.modules.get(module_name)
    return getattr(mod, cls_name, None) if mod is not None else None


def hooked(m: nn.Module) -> bool:
    return bool(m._forward_hooks or m._forward_pre_hooks or m._backward_hooks or m._backward_pre_hooks)


# ---- source keys ---------------------------------------------------------------------------------------


class _Normalize(ast.NodeTransformer):
    """Parameters -> _p0, _p1, ...; local variables -> _v0, _v1, ... (in order of first assignment);
    annotated assignments -> plain ones; docstrings of nested functions dropped."""

    def __init__(self, names: dict[str, str]):
        self.names = names

    def visit_Name(self, node: ast.Name) -> ast.Name:
        if isinstance(node.ctx, ast.Store) and node.id not in self.names:
            self.names[node.id] = f"_v{len(self.names)}"
        node.id = self.names.get(node.id, node.id)
        return node

    def visit_AnnAssign(self, node: ast.AnnAssign):
        if node.value is None:
            return None
        return self.visit(ast.Assign(targets=[node.target], value=node.value, lineno=node.lineno))

    def visit_arg(self, node: ast.arg) -> ast.arg:
        node.annotation = None
        return node

    def visit_FunctionDef(self, node: ast.FunctionDef) -> ast.FunctionDef:
        node.returns, node.decorator_list, node.body = None, [], _without_docstring(node.body)
        return self.generic_visit(node)


def _without_docstring(body: list) -> list:
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) \
            and isinstance(body[0].value.value, str):
        return body[1:] or [ast.Pass()]
    return body


@functools.lru_cache(maxsize=None)
def src_key(src: str) -> str | None:
    """The normalized syntax tree of the first function in ``src``, as text."""
    try:
        node = ast.parse(textwrap.dedent(src).strip("\n")).body[0]
    except (SyntaxError, IndexError):
        return None
    if not isinstance(node, ast.FunctionDef):
        return None
    a = node.args
    params = [*a.posonlyargs, *a.args, *([a.vararg] if a.vararg else []), *a.kwonlyargs,
              *([a.kwarg] if a.kwarg else [])]
    names = {}
    for i, p in enumerate(params):
        names[p.arg], p.arg, p.annotation = f"_p{i}", f"_p{i}", None
    body = _Normalize(names).visit(ast.Module(body=_without_docstring(node.body), type_ignores=[]))
    return ast.dump(a) + ast.dump(body)


@functools.lru_cache(maxsize=None)
def fn_key(fn) -> str | None:
    try:
        return src_key(inspect.getsource(inspect.unwrap(fn)))
    except (OSError, TypeError, ValueError):
        return None


def same_as(fn, *refs: str) -> bool:
    """fn's source has the normalized syntax tree of one of the reference sources."""
    key = fn_key(fn) if callable(fn) else None
    return key is not None and any(key == src_key(r) for r in refs)


# ---- globals a function reads --------------------------------------------------------------------------


@functools.lru_cache(maxsize=None)
def global_names(code: types.CodeType) -> frozenset[str]:
    """Names the code (and code nested in it: comprehensions, lambdas) loads as globals."""
    names = {ins.argval for ins in dis.get_instructions(code) if ins.opname == "LOAD_GLOBAL"}
    for c in code.co_consts:
        if isinstance(c, types.CodeType):
            names |= global_names(c)
    return frozenset(names)


def loads_global(fn, name: str) -> bool:
    return inspect.isfunction(fn) and name in global_names(fn.__code__)


# ---- probes --------------------------------------------------------------------------------------------


class StandIn:
    """``self`` for running a module's forward code on a probe: the attributes in ``overrides``
    (small CPU submodules and parameters), everything else read from the module."""

    def __init__(self, module: nn.Module, **overrides):
        object.__setattr__(self, "_module", module)
        object.__setattr__(self, "_overrides", overrides)

    def __getattr__(self, name):
        overrides = object.__getattribute__(self, "_overrides")
        if name in overrides:
            return overrides[name]
        return getattr(object.__getattribute__(self, "_module"), name)

    def __setattr__(self, name, value):  # state the forward keeps goes to the module, as it would
        overrides = object.__getattribute__(self, "_overrides")
        if name in overrides:
            overrides[name] = value
        else:
            setattr(object.__getattribute__(self, "_module"), name, value)


def probe_close(run_original, run_kernelforge, what: str, rtol: float = 1e-5, atol: float = 1e-6) -> "bool | str":
    """True when the module's own code (``run_original()``) and the kernelforge computation
    (``run_kernelforge()``) give the same values on the probe; otherwise the reason to skip."""
    try:
        with torch.no_grad():
            want, got = run_original(), run_kernelforge()
    except Exception as e:  # the forward's code does not run on the stand-in: cannot verify
        return f"{what}: could not run the forward on a CPU probe to verify it ({type(e).__name__}: {e})"
    if not (isinstance(want, torch.Tensor) and want.shape == got.shape):
        return f"{what}: the forward returns {type(want).__name__} of another shape than kernelforge's"
    if not torch.allclose(want.double(), got.double(), rtol=rtol, atol=atol):
        err = (want.double() - got.double()).abs().max().item()
        return f"{what}: the forward computes something else on a CPU probe (max abs difference {err:.2e})"
    return True


def probe_generator() -> torch.Generator:
    return torch.Generator().manual_seed(0)
