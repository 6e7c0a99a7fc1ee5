"""`kforge build-hub`: the tree loads with the HuggingFace `kernels` package (get_local_kernel), its layers
pass kernels' checks and `kernelize` swaps a tiny Llama's RMSNorm and MLP activation forwards (outputs and
gradients as the unpatched model's), `from_pretrained(..., use_kernels=True)` with a local mapping loads it.
On the CPU the ops run the float64 reference; the CUDA cases run the kernels."""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import kernelforge as kf
from kernelforge import hub

kernels = pytest.importorskip("kernels", reason="the HuggingFace kernels package is not installed")
transformers = pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def tree(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("hub")
    hub.build_hub(str(out))
    return out


def test_tree_layout(tree):
    vdir = tree / "build" / hub.variant_name()
    assert (vdir / "__init__.py").is_file() and (vdir / "kernelforge" / "libkernelforge_torch.so").is_file()
    meta = json.loads((vdir / "metadata.json").read_text())
    assert meta["name"] == "kernelforge" and meta["id"].startswith("_kernelforge_")
    assert meta["backend"]["type"] == ("cuda" if torch.version.cuda else "cpu")
    # kernels accepts the variant name for this system
    from kernels.variants import get_variants_local, resolve_variant

    variant, _ = resolve_variant(get_variants_local(tree / "build"))
    assert variant is not None and variant.variant_str == hub.variant_name()


def test_get_local_kernel_in_a_fresh_process(tree):
    """A process without kernelforge on its path imports the tree's own copy."""
    code = ("import pathlib, sys, torch, kernels\n"
            f"m = kernels.get_local_kernel(pathlib.Path({str(tree)!r}))\n"
            "import kernelforge\n"
            f"assert kernelforge.__file__.startswith({str(tree)!r}), kernelforge.__file__\n"
            "x = torch.randn(3, 8, dtype=torch.float64); w = torch.randn(8, dtype=torch.float64)\n"
            "ref = w * x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)\n"
            "assert (m.rms_norm(x, w, 1e-6) - ref).abs().max() < 1e-12\n"
            "assert m.layers.SiluAndMul.has_backward and m.layers.RMSNorm.can_torch_compile\n"
            "print('ok', m.__version__)\n")
    # PYTHONPATH without the entries that hold a kernelforge package (kernels itself may come from one)
    keep = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep)
            if p and not os.path.isdir(os.path.join(p, "kernelforge"))]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(keep))
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=str(tree))
    assert r.returncode == 0 and "ok" in r.stdout, r.stdout + r.stderr


def test_get_local_kernel_serves_the_loaded_package(tree):
    m = kernels.get_local_kernel(tree)
    assert m.rms_norm is kf.rms_norm and m.layers is kf.layers
    assert set(kf.__all__) <= set(m.__all__)


def _tiny_llama(seed=0):
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(vocab_size=97, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, max_position_embeddings=64)
    torch.manual_seed(seed)
    return LlamaForCausalLM(cfg)


def _step(model, ids):
    out = model(input_ids=ids, labels=ids)
    out.loss.backward()
    return out.logits.detach(), {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}


def _kernelize_and_compare(tree, device, dtype, tol):
    from kernels import LocalLayerRepository, Mode, kernelize, use_kernel_mapping

    ref = _tiny_llama().to(device=device, dtype=dtype)
    model = copy.deepcopy(ref)
    dev = "cuda" if device == "cuda" else "cpu"
    mapping = {"RMSNorm": {dev: {Mode.TRAINING: LocalLayerRepository(tree, layer_name="RMSNorm")}},
               "rotary_pos_emb": {dev: {Mode.TRAINING: LocalLayerRepository(tree, layer_name="apply_rotary_transformers")}}}
    calls = []
    real = kf.layers._llama_rms_norm

    def spy(*a):
        calls.append(1)
        return real(*a)

    kf.layers._llama_rms_norm = spy
    try:
        with use_kernel_mapping(mapping):
            kernelize(model, mode=Mode.TRAINING, device=dev)
        ids = torch.randint(0, 97, (2, 11), device=device)
        got, got_g = _step(model, ids)
    finally:
        kf.layers._llama_rms_norm = real
    assert calls, "kernelize did not route RMSNorm to kernelforge.layers.RMSNorm"
    want, want_g = _step(ref, ids)
    torch.testing.assert_close(got, want, **tol)
    assert got_g.keys() == want_g.keys()
    for n in want_g:
        torch.testing.assert_close(got_g[n], want_g[n], **tol, msg=lambda m, n=n: f"{n}: {m}")


def test_kernelize_llama_cpu(tree):
    # LlamaRMSNorm normalizes in float32 even for float64 activations; the reference in float64
    _kernelize_and_compare(tree, "cpu", torch.float64, dict(rtol=1e-5, atol=1e-6))


@pytest.mark.cuda
def test_kernelize_llama_cuda(tree):
    _kernelize_and_compare(tree, "cuda", torch.float32, dict(rtol=2e-4, atol=2e-5))


def test_layers_pass_kernels_checks():
    """kernels' own validation: no constructor, no members but forward / can_torch_compile / has_backward,
    the forward signature of the layer replaced."""
    from kernels.layer.layer import _validate_layer
    from transformers.models.llama.modeling_llama import LlamaRMSNorm

    _validate_layer(check_cls=LlamaRMSNorm, cls=kf.layers.RMSNorm, repo="kernelforge")
    for name in ("SiluAndMul", "GeluAndMul", "GeluTanhAndMul", "LayerNorm", "apply_rotary_transformers"):
        cls = getattr(kf.layers, name)
        assert cls.__init__ is torch.nn.Module.__init__ and cls.has_backward and cls.can_torch_compile


def test_layer_forwards_match_torch():
    g = torch.Generator().manual_seed(2)
    x = torch.randn(3, 5, 16, dtype=torch.float64, generator=g)
    ln = torch.nn.LayerNorm(16, dtype=torch.float64)
    torch.testing.assert_close(kf.layers.LayerNorm.forward(ln, x), ln(x))
    a, b = x[..., :8], x[..., 8:]
    act = torch.nn.Module()
    torch.testing.assert_close(kf.layers.SiluAndMul.forward(act, x), torch.nn.functional.silu(a) * b)
    torch.testing.assert_close(kf.layers.GeluAndMul.forward(act, x), torch.nn.functional.gelu(a) * b)
    torch.testing.assert_close(kf.layers.GeluTanhAndMul.forward(act, x),
                               torch.nn.functional.gelu(a, approximate="tanh") * b)
    q, k = torch.randn(2, 4, 6, 8, dtype=torch.float64, generator=g), torch.randn(2, 2, 6, 8, dtype=torch.float64,
                                                                                  generator=g)
    cos, sin = torch.randn(2, 6, 8, dtype=torch.float64, generator=g), torch.randn(2, 6, 8, dtype=torch.float64,
                                                                                  generator=g)
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

    want = apply_rotary_pos_emb.__wrapped__(q, k, cos, sin) if hasattr(apply_rotary_pos_emb, "__wrapped__") else \
        apply_rotary_pos_emb(q, k, cos, sin)
    for got, w in zip(kf.layers.apply_rotary_transformers.forward(None, q, k, cos, sin), want):
        torch.testing.assert_close(got, w)
    # RMSNorm with a float32 weight under float64 activations: the weight multiply in torch, promoted
    norm = torch.nn.Module()
    norm.weight, norm.variance_epsilon = torch.nn.Parameter(torch.randn(16)), 1e-6
    xf = x.float()
    want = norm.weight * (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-6))
    torch.testing.assert_close(kf.layers.RMSNorm.forward(norm, xf), want)


def test_build_hub_cli(tmp_path):
    from kernelforge.cli import main

    assert main(["build-hub", str(tmp_path), "--variant", "torch211-cxx11-cu130-x86_64-linux"]) == 0
    assert (tmp_path / "build" / "torch211-cxx11-cu130-x86_64-linux" / "metadata.json").is_file()


def _assert_routed_logits(model, ref, route: str) -> None:
    """model's logits run kernelforge.layers' RMSNorm kernel (a spy counts its calls) and match ref's."""
    calls = []
    real = kf.layers._llama_rms_norm

    def spy(*a):
        calls.append(1)
        return real(*a)

    ids = torch.randint(0, 97, (2, 11), device="cuda")
    kf.layers._llama_rms_norm = spy
    try:
        with torch.no_grad():
            got = model(input_ids=ids).logits
    finally:
        kf.layers._llama_rms_norm = real
    assert calls, f"{route} did not route RMSNorm to kernelforge.layers.RMSNorm"
    with torch.no_grad():
        want = ref(input_ids=ids).logits
    torch.testing.assert_close(got, want, rtol=2e-4, atol=2e-5)


def _saved_tiny_llama_and_local_config(tree, path):
    """A tiny Llama saved under ``path`` (returned on CUDA, the reference) and a KernelConfig mapping its
    RMSNorm to the local hub tree."""
    from transformers.utils.kernel_config import KernelConfig

    ref = _tiny_llama()
    ref.save_pretrained(path)
    return ref.to("cuda"), KernelConfig(kernel_mapping={"RMSNorm": f"{tree}:RMSNorm"}, use_local_kernel=True)


# transformers 5.17's from_pretrained(use_kernels=True) rewrites every mapping entry into a hub
# (repo, metadata) tuple (register_kernel_replacements_and_fusions) before create_compatible_mapping,
# whose local branch (add_to_mapping_local) then calls .split(":") on the tuple. Model.set_use_kernels
# on a loaded model skips that rewrite: it is the route that works for local trees there.
_LOCAL_MAPPING_BUG = "'tuple' object has no attribute 'split'"


@pytest.mark.cuda
def test_from_pretrained_use_kernels_local_mapping(tree, tmp_path):
    """transformers' own path: from_pretrained(..., use_kernels=True) with a KernelConfig mapping RMSNorm to
    the local tree (transformers takes local mappings for accelerator devices only, hence CUDA)."""
    from transformers import LlamaForCausalLM

    ref, kc = _saved_tiny_llama_and_local_config(tree, tmp_path)
    try:
        model = LlamaForCausalLM.from_pretrained(tmp_path, use_kernels=True, kernel_config=kc, device_map="cuda")
    except AttributeError as e:
        if _LOCAL_MAPPING_BUG not in str(e):
            raise
        pytest.xfail("this transformers' from_pretrained(use_kernels=True) breaks every local kernel mapping "
                     "(add_to_mapping_local gets a (repo, metadata) tuple); set_use_kernels works")
    _assert_routed_logits(model, ref, "from_pretrained(use_kernels=True)")


@pytest.mark.cuda
def test_set_use_kernels_local_mapping(tree, tmp_path):
    """A loaded model, then model.set_use_kernels(True, KernelConfig(local mapping)): RMSNorm runs
    kernelforge.layers.RMSNorm from the local tree; the logits match the unpatched model."""
    from transformers import LlamaForCausalLM

    ref, kc = _saved_tiny_llama_and_local_config(tree, tmp_path)
    model = LlamaForCausalLM.from_pretrained(tmp_path, device_map="cuda")
    model.set_use_kernels(True, kc)
    _assert_routed_logits(model, ref, "set_use_kernels(True, local mapping)")
