"""kernelforge.patch / unpatch for the rope family: transformers attention modules whose forward calls
Llama's module-level ``apply_rotary_pos_emb`` (-> apply_rope) and diffusers' LTXAttention, whose
processor calls LTX-Video's ``apply_rotary_emb`` (-> apply_rope_bsc).

Tiny random models (float32 on CPU against the float64 reference kernels, bfloat16 on GPU) patched vs
unpatched: outputs and all parameter gradients agree (test_patch_models.check_model), the kernel is
really called, the report lists every attention module; the module-level functions are never replaced
(only the patched instances call kernelforge) and unpatch restores the class forwards; functions whose
code differs from the verified one are skipped and reported; inputs the kernel cannot take run the
library function with a warning (KF_STRICT=1: an error).
"""

from __future__ import annotations

import copy
import importlib
import re
import sys
import textwrap
import warnings

import pytest
import torch

import norm_ref as R
from test_patch_activations import _assert_unpatched, _hf_forward, _hf_inputs, _hf_model
from test_patch_models import (MODEL_CASES, _check_pair, _randomize_norms, check_model, ltx_forward, ltx_inputs,
                               ltx_model)

ROPE_ONLY = {"norms": False, "activations": False, "loss": False, "moe": False}
ARCHS = ["llama", "qwen2", "mistral", "qwen3"]
ATTN_CLS = {"llama": "LlamaAttention", "qwen2": "Qwen2Attention", "mistral": "MistralAttention",
            "qwen3": "Qwen3Attention"}


def _transformers():
    return pytest.importorskip("transformers")


def _diffusers():
    return pytest.importorskip("diffusers")


def _modeling(arch: str):
    _transformers()
    return importlib.import_module(f"transformers.models.{arch}.modeling_{arch}")


def _ltx_module():
    _diffusers()
    return importlib.import_module("diffusers.models.transformers.transformer_ltx")


def _patch_module():
    return importlib.import_module("kernelforge.patch")  # `kernelforge.patch` the attribute is the function


@pytest.fixture
def kernel_calls(monkeypatch):
    """Counts calls of kernelforge.rope.apply_rope (which apply_rope_bsc calls too)."""
    rope = importlib.import_module("kernelforge.rope")
    calls = []
    real = rope.apply_rope

    def counting(*args, **kwargs):
        calls.append(args[0].shape)
        return real(*args, **kwargs)

    monkeypatch.setattr(rope, "apply_rope", counting)
    return calls


@pytest.fixture
def fresh_warnings(monkeypatch):
    monkeypatch.setattr(importlib.import_module("kernelforge.patch._runtime"), "warned", set())
    monkeypatch.delenv("KF_STRICT", raising=False)


# ---- tiny transformers models --------------------------------------------------------------------------


def _attn_paths(n: int = 2) -> list[str]:
    return [f"model.layers.{i}.self_attn" for i in range(n)]


@pytest.mark.parametrize("device,dtype", MODEL_CASES)
@pytest.mark.parametrize("arch", ARCHS)
def test_transformers_model(kf, arch, device, dtype, kernel_calls):
    """Logits and every parameter gradient agree patched vs unpatched (rope only); the kernel runs once per
    layer and forward; the modeling module's functions are the same objects before, during and after."""
    M = _modeling(arch)
    fn, rotate_half = M.apply_rotary_pos_emb, M.rotate_half
    model = _hf_model(arch, device, dtype)
    report = check_model(kf, model, _hf_inputs(device), _hf_forward, _attn_paths(), dtype, patch_kwargs=ROPE_ONLY)
    assert {(p.cls, p.op) for p in report.patched} == {(ATTN_CLS[arch], "kernelforge.apply_rope")}
    assert f"transformers.{ATTN_CLS[arch]} -> kernelforge.apply_rope" in str(report)
    # check_model ran the model 3 times: unpatched, patched (2 layers), unpatched again
    assert len(kernel_calls) == 2
    assert M.apply_rotary_pos_emb is fn and M.rotate_half is rotate_half
    _assert_unpatched(model)


@pytest.mark.parametrize("device,dtype", MODEL_CASES)
def test_partial_rotary_model(kf, device, dtype, kernel_calls):
    """Phi calls the same function on q[..., :R] (partial_rotary_factor 0.5): strided views, R < head_dim."""
    tf = _transformers()
    from test_patch_activations import COMMON

    model = tf.PhiForCausalLM(tf.PhiConfig(**COMMON))
    assert 2 * model.model.rotary_emb.inv_freq.numel() == 8  # partial rotary: half of head_dim 16
    model = _randomize_norms(model.to(device=device, dtype=dtype))
    report = check_model(kf, model, _hf_inputs(device), _hf_forward, _attn_paths(), dtype, patch_kwargs=ROPE_ONLY)
    assert {p.op for p in report.patched} == {"kernelforge.apply_rope"}
    assert len(kernel_calls) == 2 and kernel_calls[0][-1] == 8  # head_dim 16, rotary width 8


@pytest.mark.parametrize("device,dtype", MODEL_CASES)
def test_transformers_decode_step(kf, device, dtype, kernel_calls):
    """Greedy decoding with a KV cache (one-token rotations at growing positions) matches the unpatched model."""
    model = _hf_model("mistral", device, dtype).eval()
    ids = torch.randint(0, 128, (1, 6), device=device)
    with torch.no_grad():
        want = model.generate(ids, max_new_tokens=4, do_sample=False, min_new_tokens=4)
        want_logits = model(input_ids=want).logits
        kf.patch(model, **ROPE_ONLY, attention=False)
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            got = model.generate(ids, max_new_tokens=4, do_sample=False, min_new_tokens=4)
            got_logits = model(input_ids=want).logits
        kf.unpatch(model)
    assert len(kernel_calls) == 2 * (1 + 3 + 1)  # prefill, 3 decode steps, the logits pass
    _check_pair("logits", got_logits, want_logits, None, dtype)
    if dtype == torch.float32:
        assert torch.equal(got, want)


def test_other_models_are_not_affected(kf, kernel_calls):
    """Patching one model changes no module-level function: a second, unpatched model of the same class
    computes exactly what it did, without the kernel."""
    M = _modeling("llama")
    fn = M.apply_rotary_pos_emb
    patched, other = _hf_model("llama", "cpu", torch.float32), _hf_model("llama", "cpu", torch.float32)
    inputs = _hf_inputs("cpu")
    with torch.no_grad():
        want = _hf_forward(other, inputs)
        kf.patch(patched, **ROPE_ONLY, attention=False)
        assert M.apply_rotary_pos_emb is fn
        assert torch.equal(_hf_forward(other, inputs), want)
        assert kernel_calls == []
        _hf_forward(patched, inputs)
        assert len(kernel_calls) == 2
    kf.unpatch(patched)
    assert M.apply_rotary_pos_emb is fn


def test_unpatch_restores_and_repatch(kf):
    M = _modeling("qwen3")
    model = _hf_model("qwen3", "cpu", torch.float32)
    inputs = _hf_inputs("cpu")
    attn = model.model.layers[0].self_attn
    with torch.no_grad():
        want = _hf_forward(model, inputs)
        first = kf.patch(model, **ROPE_ONLY, attention=False)
        installed = attn.forward
        assert installed.__self__ is attn and "forward" in attn.__dict__
        second = kf.patch(model, **ROPE_ONLY, attention=False)  # patching twice is patching once
        assert not second.patched and sorted(second.skipped_paths) == _attn_paths()
        assert attn.forward is installed
        assert kf.unpatch(model) == len(first.patched) == 2
        _assert_unpatched(model)
        assert attn.forward.__func__ is M.Qwen3Attention.forward
        assert torch.equal(_hf_forward(model, inputs), want)
        again = kf.patch(model, **ROPE_ONLY, attention=False)
        assert again.patched_paths == first.patched_paths
        # one rebound function per class forward, shared by the layers (one code object for torch.compile)
        P = _patch_module()
        extras = {id(model.get_submodule(p).__dict__[P.STATE_ATTR].extra) for p in _attn_paths()}
        assert len(extras) == 1
        R.assert_close(_hf_forward(model, inputs), want, torch.float32)
    kf.unpatch(model)


def test_rope_flag(kf):
    model = _hf_model("llama", "cpu", torch.float32)
    report = kf.patch(model, rope=False, attention=False)
    assert report.patched and not any(p.path.endswith("self_attn") for p in report.patched)
    assert not any(s.path.endswith("self_attn") for s in report.skipped)  # out of scope: not even reported
    kf.unpatch(model)


def test_deepcopy(kf):
    model = _hf_model("llama", "cpu", torch.float32)
    inputs = _hf_inputs("cpu")
    kf.patch(model, **ROPE_ONLY, attention=False)
    clone = copy.deepcopy(model)
    P = _patch_module()
    a, b = model.model.layers[1].self_attn, clone.model.layers[1].self_attn
    assert b.forward.__self__ is b
    assert b.__dict__[P.STATE_ATTR].extra is a.__dict__[P.STATE_ATTR].extra  # shared, holds no per-model state
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("error")
        assert torch.equal(_hf_forward(clone, inputs), _hf_forward(model, inputs))
    assert kf.unpatch(clone) == kf.unpatch(model) == 2


def test_compile_patched_attention(kf):
    """torch.compile(fullgraph) of a patched attention module: the graph calls the kernelforge op."""
    tf = _transformers()
    from test_patch_activations import COMMON

    M = _modeling("llama")
    config = tf.LlamaConfig(**COMMON)
    attn, rotary = M.LlamaAttention(config, 0), M.LlamaRotaryEmbedding(config)
    x = R.rand((2, 7, 64), torch.float32, "cpu")
    cos_sin = rotary(x, torch.arange(7).expand(2, 7))
    want = attn(x, cos_sin, None)[0]
    kf.patch(attn, attention=False)
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    torch._dynamo.reset()
    got = torch.compile(attn, fullgraph=True, backend=backend)(x, cos_sin, None)[0]
    R.assert_close(got, want, torch.float32)
    targets = {str(n.target) for g in graphs for n in g.graph.nodes if n.op == "call_function"}
    assert any("kernelforge.apply_rope" in t for t in targets), targets
    kf.unpatch(attn)


# ---- what is skipped: functions whose code differs ---------------------------------------------------------

_FAKE_MODELING = '''
import functools

import torch
from torch import nn


def rotate_half(x):
    x1 = x[..., : x.shape[-1] // 2]
    x2 = x[..., x.shape[-1] // 2 :]
    return torch.cat((-x2, x1), dim=-1)


def rotate_pairs(x):  # GPT-J style: (2i, 2i + 1)
    x1 = x[..., ::2]
    x2 = x[..., 1::2]
    return torch.stack((-x2, x1), dim=-1).flatten(-2)


def apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=1):
    """Llama's function, copied: patched, whatever the module is called."""
    cos = cos.unsqueeze(unsqueeze_dim)
    sin = sin.unsqueeze(unsqueeze_dim)
    q_embed = (q * cos) + (rotate_half(q) * sin)
    k_embed = (k * cos) + (rotate_half(k) * sin)
    return q_embed, k_embed


class Attention(nn.Module):
    def forward(self, q, k, cos, sin):
        return apply_rotary_pos_emb(q, k, cos, sin)


class Attention2(nn.Module):  # passes unsqueeze_dim: q, k [B, S, H, D]
    def forward(self, q, k, cos, sin):
        return apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=2)


def logged(f):
    @functools.wraps(f)
    def wrapper(*args, **kwargs):
        return f(*args, **kwargs)

    return wrapper


def opaque(f):
    box = [f]

    @functools.wraps(f)
    def wrapper(*args, **kwargs):
        return box[0](*args, **kwargs)

    return wrapper


class Wrapped(nn.Module):  # the decorator is rebuilt around the rebound code
    @logged
    def forward(self, q, k, cos, sin):
        return apply_rotary_pos_emb(q, k, cos, sin)


class Opaque(nn.Module):  # the wrapper does not hold forward in a closure cell: not rebuilt, reported
    @opaque
    def forward(self, q, k, cos, sin):
        return apply_rotary_pos_emb(q, k, cos, sin)
'''


def _fake_modeling(tmp_path, name, replace=None):
    """A module file (inspect.getsource must find the source), optionally with one edit."""
    src = textwrap.dedent(_FAKE_MODELING)
    if replace is not None:
        assert replace[0] in src
        src = src.replace(*replace)
    path = tmp_path / f"{name}.py"
    path.write_text(src)
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


def _qk_cos_sin(layout="bhsd", B=2, H=4, S=5, D=16, dtype=torch.float32):
    shape = (B, H, S, D) if layout == "bhsd" else (B, S, H, D)
    q, k = R.rand(shape, dtype, "cpu"), R.rand(shape, dtype, "cpu")
    ang = torch.arange(S, dtype=torch.float64)[:, None] / 10000 ** (torch.arange(0, D, 2, dtype=torch.float64) / D)
    emb = torch.cat((ang, ang), dim=-1).expand(B, S, D)
    return q, k, emb.cos().to(dtype), emb.sin().to(dtype)


def test_copied_and_changed_functions(kf, tmp_path, kernel_calls):
    same = _fake_modeling(tmp_path, "kf_fake_same")
    pairs = _fake_modeling(tmp_path, "kf_fake_pairs", ("(rotate_half(q) * sin)", "(rotate_pairs(q) * sin)"))
    other_rh = _fake_modeling(tmp_path, "kf_fake_rh", ("return torch.cat((-x2, x1), dim=-1)",
                                                        "return torch.cat((x2, -x1), dim=-1)"))
    model = torch.nn.ModuleDict({"same": same.Attention(), "same_bshd": same.Attention2(), "pairs": pairs.Attention(),
                                 "rotate_half": other_rh.Attention(), "wrapped": same.Wrapped(),
                                 "opaque": same.Opaque(), "linear": torch.nn.Linear(4, 4)})
    report = kf.patch(model, attention=False)
    print(report)
    assert sorted(report.patched_paths) == ["same", "same_bshd", "wrapped"]
    skipped = {s.path: s.reason for s in report.skipped}
    assert skipped.keys() == {"pairs", "rotate_half", "opaque"}
    assert "forward is wrapped by a decorator kernelforge cannot rebuild" in skipped["opaque"]
    assert "kf_fake_pairs.apply_rotary_pos_emb differs from Llama's" in skipped["pairs"]
    assert "the rotate_half kf_fake_rh.apply_rotary_pos_emb calls differs" in skipped["rotate_half"]
    for name, layout in (("same", "bhsd"), ("same_bshd", "bshd"), ("same", "last_dim_strided"), ("wrapped", "bhsd")):
        m = model[name]
        q, k, cos, sin = _qk_cos_sin("bhsd" if layout == "last_dim_strided" else layout)
        if layout == "last_dim_strided":  # stride(-1) != 1: copied for the kernel (same values)
            q = q.transpose(-1, -2).contiguous().transpose(-1, -2)
            assert q.stride(-1) != 1
        want = type(m).forward(m, q, k, cos, sin)
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            got = m(q, k, cos, sin)
        for g, w in zip(got, want):
            R.assert_close(g, w, torch.float32, msg=name)
    assert len(kernel_calls) == 4
    kf.unpatch(model)


def test_real_modeling_modules_that_differ(kf):
    """transformers' Phi3 (partial rotary inside the function) and Cohere (interleaved rotate_half) are skipped."""
    tf = _transformers()
    from test_patch_activations import COMMON

    from transformers.models.cohere.modeling_cohere import CohereAttention
    from transformers.models.phi3.modeling_phi3 import Phi3Attention

    cfg = dict(COMMON, pad_token_id=None)
    model = torch.nn.ModuleDict({"phi3": Phi3Attention(tf.Phi3Config(**cfg), 0),
                                 "cohere": CohereAttention(tf.CohereConfig(**cfg), 0)})
    report = kf.patch(model, attention=False)
    assert not report.patched
    reasons = {s.path: s.reason for s in report.skipped}
    assert "modeling_phi3.apply_rotary_pos_emb differs from Llama's" in reasons["phi3"]
    assert "modeling_cohere.apply_rotary_pos_emb differs from Llama's" in reasons["cohere"]


# ---- runtime: inputs the kernel cannot take, globals rebound after patching ---------------------------------


def _replacement(m, name="apply_rotary_pos_emb"):
    """The function the patched forward calls instead of the library's."""
    return m.__dict__[_patch_module().STATE_ATTR].extra.fn.__globals__[name]


def test_hf_function_fallback(kf, tmp_path, fresh_warnings, monkeypatch, kernel_calls):
    """Arguments transformers' function accepts but the kernel cannot reproduce: the library function runs
    (same result, same dtype), with one warning per kind; KF_STRICT=1 makes it an error."""
    mod = _fake_modeling(tmp_path, "kf_fake_fallback")
    m = mod.Attention()
    kf.patch(m, attention=False)
    fn = _replacement(m)
    q, k, cos, sin = _qk_cos_sin()
    D = q.shape[-1]
    cases = {
        "dtypes q torch.float32, k torch.float32, cos torch.float64, sin torch.float64":
            (q, k, cos.double(), sin.double(), 1),  # transformers returns float64
        "(the kernel takes 4-D q and k with cos/sin [B, S, D])": (q[0], k[0], cos[0], sin[0], 0),  # 3-D q, 2-D cos
        "odd head_dim 15": (q[..., :15], k[..., :15], cos[..., :15], sin[..., :15], 1),
        "cos/sin that require grad": (q, k, cos.clone().requires_grad_(), sin, 1),
        f"cos/sin [2, 5, 8] that do not match q [2, 4, 5, {D}]": (q, k, cos[..., :8], sin[..., :8], 1),
    }
    for why, args in cases.items():
        try:
            want = mod.apply_rotary_pos_emb(*args)
        except RuntimeError:
            want = None  # the library raises (half-width cos does not broadcast): so must the fallback
        if want is None:
            with pytest.warns(UserWarning, match=re.escape(why)), pytest.raises(RuntimeError):
                fn(*args)
            continue
        with pytest.warns(UserWarning, match=re.escape(why) + ".*original apply_rotary_pos_emb runs instead"):
            got = fn(*args)
        for g, w in zip(got, want):
            assert g.dtype == w.dtype and torch.equal(g, w), why
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            fn(*args)  # warned once already
    assert kernel_calls == []
    monkeypatch.setenv("KF_STRICT", "1")
    with pytest.raises(RuntimeError, match="KF_STRICT"):
        fn(q, k, cos.double(), sin.double())
    kf.unpatch(m)


def test_global_rebound_after_patch(kf, fresh_warnings, monkeypatch, kernel_calls):
    """Another library replaces modeling_llama.apply_rotary_pos_emb after kernelforge patched: the patched
    forward runs the class forward, which calls the new function, with a warning."""
    M = _modeling("llama")
    model = _hf_model("llama", "cpu", torch.float32)
    inputs = _hf_inputs("cpu")
    kf.patch(model, **ROPE_ONLY, attention=False)
    theirs = []
    original = M.apply_rotary_pos_emb

    def their_rope(*args, **kwargs):
        theirs.append(1)
        return original(*args, **kwargs)

    monkeypatch.setattr(M, "apply_rotary_pos_emb", their_rope)
    with torch.no_grad():
        with pytest.warns(UserWarning, match="modeling_llama.apply_rotary_pos_emb rebound after patching"):
            _hf_forward(model, inputs)
        assert len(theirs) == 2 and kernel_calls == []
        monkeypatch.setenv("KF_STRICT", "1")
        with pytest.raises(RuntimeError, match="KF_STRICT"):
            _hf_forward(model, inputs)
        monkeypatch.delenv("KF_STRICT")
        monkeypatch.setattr(M, "apply_rotary_pos_emb", original)  # put back: the kernel again, no warning
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            _hf_forward(model, inputs)
        assert len(kernel_calls) == 2
    kf.unpatch(model)


# ---- diffusers LTX-Video ------------------------------------------------------------------------------------


def _ltx_forward(m, inp):
    return ltx_forward(m, inp, rope_interpolation_scale=(0.32, 32, 32))


LTX_ATTNS = [f"transformer_blocks.{i}.attn{a}" for i in range(2) for a in (1, 2)]


@pytest.mark.parametrize("device,dtype", MODEL_CASES)
def test_ltx_video(kf, device, dtype, kernel_calls):
    """Output and every parameter gradient agree patched vs unpatched. attn1 (self-attention) rotates query
    and key: 2 kernel calls per layer; attn2 (cross-attention) gets no rotary embedding: patched, never called."""
    T = _ltx_module()
    fn, call = T.apply_rotary_emb, T.LTXVideoAttnProcessor.__call__
    model = ltx_model(device, dtype)
    inputs = ltx_inputs(device, dtype)
    report = check_model(kf, model, inputs, _ltx_forward, LTX_ATTNS, dtype, patch_kwargs=ROPE_ONLY)
    assert {(p.qualname, p.op) for p in report.patched} == {("diffusers.LTXAttention", "kernelforge.apply_rope_bsc")}
    assert len(kernel_calls) == 4 and all(tuple(s) == (2, 32, 1, 32) for s in kernel_calls)  # [B, S, 1, C]
    assert T.apply_rotary_emb is fn and T.LTXVideoAttnProcessor.__call__ is call
    _assert_unpatched(model)


def test_ltx_processor_replaced_after_patch(kf, fresh_warnings, kernel_calls):
    T = _ltx_module()
    model = ltx_model("cpu", torch.float32, layers=1)
    inputs = ltx_inputs("cpu", torch.float32, b=1)
    with torch.no_grad():
        want = _ltx_forward(model, inputs)
        kf.patch(model, **ROPE_ONLY, attention=False)
        attn = model.transformer_blocks[0].attn1

        class MyProcessor(T.LTXVideoAttnProcessor):  # same __call__: still the kernel
            pass

        attn.set_processor(MyProcessor())
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            R.assert_close(_ltx_forward(model, inputs), want, torch.float32)
        assert len(kernel_calls) == 2

        class Scaled(T.LTXVideoAttnProcessor):
            def __call__(self, attn, hidden_states, *args, **kwargs):
                return super().__call__(attn, hidden_states, *args, **kwargs) * 0.5

        attn.set_processor(Scaled())
        with pytest.warns(UserWarning, match="processor replaced after patching"):
            got = _ltx_forward(model, inputs)
        assert not torch.equal(got, want)
        attn.set_processor(T.LTXVideoAttnProcessor())
        R.assert_close(_ltx_forward(model, inputs), want, torch.float32)
        assert len(kernel_calls) == 4
    kf.unpatch(model)


def test_ltx_skips(kf):
    T = _ltx_module()

    class NoRope:
        def __call__(self, attn, hidden_states, encoder_hidden_states=None, attention_mask=None,
                     image_rotary_emb=None):
            return hidden_states

    class MyLTXAttention(T.LTXAttention):
        def forward(self, hidden_states, **kwargs):
            return hidden_states

    plain = T.LTXAttention(32, heads=2, kv_heads=2, dim_head=16)
    plain.processor = NoRope()
    model = torch.nn.ModuleDict({"no_rope": plain, "subclass": MyLTXAttention(32, heads=2, kv_heads=2, dim_head=16),
                                 "ok": T.LTXAttention(32, heads=2, kv_heads=2, dim_head=16)})
    report = kf.patch(model, **ROPE_ONLY, attention=False)
    assert report.patched_paths == ["ok"]
    reasons = {s.path: s.reason for s in report.skipped}
    assert "processor NoRope does not call a module-level apply_rotary_emb" in reasons["no_rope"]
    assert "forward differs from the diffusers 0.42 LTXAttention.forward" in reasons["subclass"]
    kf.unpatch(model)


def test_ltx_function_fallback(kf, fresh_warnings, monkeypatch, kernel_calls):
    T = _ltx_module()
    attn = T.LTXAttention(32, heads=2, kv_heads=2, dim_head=16)
    kf.patch(attn, attention=False)
    fn = _replacement(attn, "apply_rotary_emb")
    cos, sin = kf.ltx_video_rope(1, 2, 3, 32, batch_size=2)
    x = R.rand((2, 6, 32), torch.float32, "cpu")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        R.assert_close(fn(x, (cos, sin)), T.apply_rotary_emb(x, (cos, sin)), torch.float32)
    assert len(kernel_calls) == 1
    cases = {
        "a float64 input": (x.double(), (cos, sin)),
        "x dtype torch.float32 with cos torch.float64": (x, (cos.double(), sin.double())),
        "x dtype torch.bfloat16 with cos torch.float16": (x.bfloat16(), (cos.half(), sin.half())),
    }
    for why, args in cases.items():
        want = T.apply_rotary_emb(*args)
        with pytest.warns(UserWarning, match=why):
            got = fn(*args)
        assert got.dtype == want.dtype and torch.equal(got, want), why
    with pytest.warns(UserWarning, match="that do not match x"), pytest.raises(RuntimeError):
        fn(x, (cos[:, :4], sin[:, :4]))  # diffusers cannot broadcast 4 positions over 6 tokens either
    assert len(kernel_calls) == 1
    monkeypatch.setenv("KF_STRICT", "1")
    with pytest.raises(RuntimeError, match="KF_STRICT"):
        fn(x.double(), (cos, sin))
    kf.unpatch(attn)
