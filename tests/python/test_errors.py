"""Bad inputs raise clear errors that name the argument; NaN/Inf propagate like the reference;
importing needs no GPU."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest
import torch

import norm_ref as R
from norm_ref import DEVICES, OPS, make_inputs, run_kf, run_ref

PKG_DIR = os.path.join(os.path.dirname(__file__), "..", "..", "python")

# the op name each test case's C++ error message starts with
OP_NAME = {"rms_norm": "rms_norm", "add_rms_norm": "add_rms_norm", "layer_norm": "layer_norm",
           "ada_norm_layer": "ada_norm", "ada_norm_rms": "ada_norm"}


def _raises(kf, op, inp, pattern):
    with pytest.raises(RuntimeError, match=f"{OP_NAME[op]}: {pattern}") as e:
        run_kf(kf, op, inp)
    return str(e.value)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("op", OPS)
def test_integer_input(kf, op, device):
    inp = make_inputs(op, (4, 64), torch.float32, device)
    inp = {k: (None if v is None else v.to(torch.int32)) for k, v in inp.items()}
    msg = _raises(kf, op, inp, "x must be")
    assert "int32" in msg


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("op", OPS)
def test_weight_shape_mismatch(kf, op, device):
    inp = make_inputs(op, (4, 64), torch.float32, device)
    inp["weight"] = R.rand(63, torch.float32, device)
    _raises(kf, op, inp, r"weight must have shape \[64\] to match the last dimension of x, got \[63\]")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("op", ["layer_norm", "ada_norm_layer"])
def test_bias_shape_mismatch(kf, op, device):
    inp = make_inputs(op, (4, 64), torch.float32, device)
    inp["bias"] = R.rand((2, 32), torch.float32, device)
    _raises(kf, op, inp, r"bias must have shape \[64\]")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("op", OPS)
def test_mixed_dtypes(kf, op, device):
    for name in ("weight", "residual", "bias", "scale", "shift"):
        inp = make_inputs(op, (4, 64), torch.bfloat16, device)
        if inp.get(name) is None:
            continue
        inp[name] = inp[name].float()
        _raises(kf, op, inp, f"{name} must have the same dtype as x")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("op", OPS)
def test_non_contiguous_last_dim(kf, op, device):
    inp = make_inputs(op, (64, 4), torch.float32, device)  # transposed below to [4, 64], strides (1, 4)
    inp = {k: (v.t() if v is not None and v.dim() == 2 else v) for k, v in inp.items()}
    inp["weight"] = R.rand(64, torch.float32, device) if inp["weight"] is not None else None
    if inp.get("bias") is not None:
        inp["bias"] = R.rand(64, torch.float32, device)
    for k in ("scale", "shift"):
        if k in inp:
            inp[k] = R.rand(64, torch.float32, device)
    _raises(kf, op, inp, "x must be contiguous in its last dimension")


@pytest.mark.parametrize("device", DEVICES)
def test_non_contiguous_weight(kf, device):
    w = R.rand((64, 2), torch.float32, device)[:, 0]
    with pytest.raises(RuntimeError, match="rms_norm: weight must be contiguous"):
        kf.rms_norm(R.rand((4, 64), torch.float32, device), w)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("op", ["ada_norm_layer", "ada_norm_rms"])
def test_bad_modulation_shape(kf, op, device):
    inp = make_inputs(op, (2, 3, 64), torch.float32, device)
    inp["scale"] = R.rand((3, 2, 64), torch.float32, device)  # leading dims do not match x's
    inp["shift"] = R.rand((3, 2, 64), torch.float32, device)
    _raises(kf, op, inp, "scale must broadcast against x")


@pytest.mark.parametrize("device", DEVICES)
def test_add_rms_norm_residual_shape(kf, device):
    x = R.rand((4, 64), torch.float32, device)
    with pytest.raises(RuntimeError, match="add_rms_norm: residual must have the same shape as x"):
        kf.add_rms_norm(x, R.rand((2, 64), torch.float32, device))


def test_ada_norm_kind(kf):
    x = torch.randn(2, 8)
    with pytest.raises(ValueError, match="kind must be 'layer' or 'rms'"):
        kf.ada_norm(x, x, x, kind="group")


@pytest.mark.cuda
@pytest.mark.parametrize("op", OPS)
def test_mixed_devices(kf, op):
    for name in ("weight", "residual", "bias", "scale", "shift"):
        inp = make_inputs(op, (4, 64), torch.float32, "cuda")
        if inp.get(name) is None:
            continue
        inp[name] = inp[name].cpu()
        with pytest.raises(RuntimeError, match=f"{name}"):
            run_kf(kf, op, inp)


@pytest.mark.cuda
def test_float64_on_cuda_falls_back_with_warning(kf):
    """float64 on CUDA runs the reference (CPU round trip) with a warning, or fails under KF_STRICT."""
    x = torch.randn(4, 64, dtype=torch.float64, device="cuda")
    w = torch.randn(64, dtype=torch.float64, device="cuda")
    y = kf.rms_norm(x, w)
    assert y.device == x.device and y.dtype == torch.float64
    R.assert_close(y, R.rms_norm(x, w, 1e-6, torch.float64), torch.float64)


# ---- NaN / Inf ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", R.DTYPES, ids=str)
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")], ids=["nan", "inf", "-inf"])
@pytest.mark.parametrize("op", OPS)
def test_nonfinite_propagates(kf, op, bad, device, dtype):
    inp = make_inputs(op, (5, 300), dtype, device)
    inp["x"][1, 7] = bad
    out = run_kf(kf, op, inp)
    expected = run_ref(op, inp, dtype)
    for a, e in zip(out, expected):
        assert torch.equal(a.isnan(), e.isnan()), f"{op}: NaN pattern differs from the reference"
        assert torch.equal(a.isinf(), e.isinf()), f"{op}: Inf pattern differs from the reference"
        assert a.isnan().any() or a.isinf().any()
        fin = e.isfinite()
        R.assert_close(a[fin], e[fin], dtype, msg=f"{op}: finite part")
    # the other rows are untouched by the bad row
    assert out[0][[0, 2, 3, 4]].isfinite().all()


# ---- string enums of the op schemas: a bad value names the argument and the allowed values -------------


def test_enum_arguments_of_the_ops(kf):
    ops = torch.ops.kernelforge
    x = torch.randn(2, 3, 8)
    q, cs = torch.randn(1, 3, 2, 8), torch.randn(3, 8)
    logits, target = torch.randn(4, 5), torch.tensor([0, 1, 2, 3])
    cases = [
        (lambda: ops.ada_norm(x, x, x, None, None, 1e-6, "group"), "ada_norm: kind must be 'layer' or 'rms', got 'group'"),
        (lambda: ops.ada_norm_backward(x, x, x, x, None, None, 1e-6, ""),
         "ada_norm_backward: kind must be 'layer' or 'rms', got ''"),
        (lambda: ops.apply_rope(q, None, cs, cs, None, False, "sbhd", 0),
         "apply_rope: layout must be 'bshd' or 'bhsd', got 'sbhd'"),
        (lambda: ops.apply_rope_backward(q, None, cs, cs, None, False, "BSHD", 0),
         "apply_rope_backward: layout must be 'bshd' or 'bhsd', got 'BSHD'"),
        (lambda: ops.apply_rope_inplace(q, None, cs, cs, None, False, "x", 0),
         "apply_rope_inplace: layout must be 'bshd' or 'bhsd', got 'x'"),
        (lambda: ops.gelu(x, "erf"), "gelu: approximate must be 'none' or 'tanh', got 'erf'"),
        (lambda: ops.cross_entropy(logits, target, -100, 0.0, 0.0, 0.0, "avg"),
         "cross_entropy: reduction must be 'none', 'mean' or 'sum', got 'avg'"),
        (lambda: ops.fused_linear_cross_entropy(logits, torch.randn(6, 5), target, None, -100, 0.0, 0.0, 0.0, "mean ", 0),
         "fused_linear_cross_entropy: reduction must be 'none', 'mean' or 'sum', got 'mean '"),
    ]
    for fn, msg in cases:
        with pytest.raises(ValueError) as e:
            fn()
        assert msg in str(e.value)


# ---- last_plan --------------------------------------------------------------------------------------------


def test_last_plan_is_a_string(kf):
    assert isinstance(kf.last_plan(), str)
    assert torch.ops.kernelforge.last_plan() == kf.last_plan()


@pytest.mark.cuda
def test_last_plan_names_the_launch(kf):
    """A CUDA launch records its plan (the norm family's launcher calls record_plan)."""
    kf.rms_norm(torch.randn(4, 64, device="cuda"), None)
    assert kf.last_plan() != ""


# ---- import ---------------------------------------------------------------------------------------------


def _python(code: str, env_extra: dict, pythonpath: str) -> subprocess.CompletedProcess:
    env = {**os.environ, **env_extra, "PYTHONPATH": pythonpath}
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)


def test_import_needs_no_gpu():
    code = ("import torch, kernelforge as kf; assert not torch.cuda.is_initialized(); "
            "y = kf.rms_norm(torch.randn(2, 8), None); assert y.shape == (2, 8); print(kf.__version__)")
    # The folder that holds the kernelforge under test (the checkout's python/ or site-packages).
    import kernelforge
    r = _python(code, {"CUDA_VISIBLE_DEVICES": ""}, os.path.dirname(os.path.dirname(kernelforge.__file__)))
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "0.1.0"


def test_import_error_without_extension(tmp_path):
    src = os.path.join(PKG_DIR, "kernelforge")
    dst = tmp_path / "kernelforge"
    shutil.copytree(src, dst, ignore=shutil.ignore_patterns("*.so", "__pycache__"))
    r = _python("import kernelforge", {}, str(tmp_path))
    assert r.returncode != 0
    assert "ImportError" in r.stderr and "libkernelforge_torch.so" in r.stderr and "dev_build.sh" in r.stderr


# ---- the binding's messages -----------------------------------------------------------------------------------


def _check_macro_args(src: str):
    """(line, argument) of each TORCH_CHECK* message argument after the condition, in C++ source text."""
    out = []
    for start in (i for i in range(len(src)) if src.startswith("TORCH_CHECK", i)):
        open_ = src.find("(", start)
        if open_ < 0 or not src[start:open_].replace("_", "").isalnum():
            continue
        args, cur, depth, i = [], "", 1, open_ + 1
        while i < len(src) and depth:
            c = src[i]
            if c == '"':  # a string literal, escapes included
                j = i + 1
                while src[j] != '"':
                    j += 2 if src[j] == "\\" else 1
                cur += src[i:j + 1]
                i = j + 1
                continue
            depth += c in "([{"
            depth -= c in ")]}"
            if depth == 1 and c == ",":
                args.append(cur.strip())
                cur = ""
            elif depth:
                cur += c
            i += 1
        args.append(cur.strip())
        out += [(src.count("\n", 0, start) + 1, a) for a in args[1:]]
    return out


def test_binding_messages_are_strings():
    """Every TORCH_CHECK message part in torch/*.cpp is text: a literal, a std::string or a const char*
    (op / arg / name / c10::toString), never a number or a shape streamed in. On the GPU machine's build
    (GCC 13, torch 2.11) a streamed int64_t or IntArrayRef crashed the process with SIGSEGV instead of
    raising; numbers go through std::to_string, shapes through shape_str."""
    root = os.path.join(os.path.dirname(__file__), "..", "..", "torch")
    text_like = ('"', "std::string", "std::to_string", "to_string(", ".str()", "_str(", "c10::toString",
                 ".message()", "enum_names(")
    bad = []
    for name in sorted(os.listdir(root)):
        if not name.endswith((".cpp", ".h")):
            continue
        with open(os.path.join(root, name)) as f:
            for line, arg in _check_macro_args(f.read()):
                if not (arg.startswith(text_like) or any(t in arg for t in text_like) or arg in ("op", "arg", "name")):
                    bad.append(f"torch/{name}:{line}: {arg}")
    assert not bad, "TORCH_CHECK message parts that are not text:\n" + "\n".join(bad)
