"""patch() on tiny random vision transformers (transformers ViT, Dinov2, CLIP's and SigLIP's vision towers): every
family at once (LayerNorm, the fc1 / GELU / fc2 MLP, attention); patched and unpatched outputs and
gradients agree (bfloat16 on CUDA: both against a float32 run of the same weights), the report lists
the expected modules, and unpatch restores the original forwards."""

from __future__ import annotations

import pytest
import torch

from test_patch_models import MODEL_CASES, check_model

LAYERS = 2


def _vit(arch: str, device, dtype):
    transformers = pytest.importorskip("transformers")
    common = dict(hidden_size=128, num_hidden_layers=LAYERS, num_attention_heads=2, intermediate_size=256,
                  image_size=32, patch_size=8)
    if arch == "vit":
        model = transformers.ViTModel(transformers.ViTConfig(**common), add_pooling_layer=False)
    elif arch == "dinov2":
        model = transformers.Dinov2Model(transformers.Dinov2Config(**common))
    elif arch == "clip":  # CLIP's own quick_gelu has no kernel (see test_quick_gelu_mlp_skipped)
        model = transformers.CLIPVisionModel(transformers.CLIPVisionConfig(hidden_act="gelu", **common))
    elif arch == "siglip":  # gelu_pytorch_tanh: the tanh GELU; an attention-pooling head with its own MLP
        model = transformers.SiglipVisionModel(transformers.SiglipVisionConfig(**common))
    else:
        raise ValueError(arch)
    with torch.no_grad():  # LayerNorm weights and biases away from their 1 / 0 initialization
        for name, p in model.named_parameters():
            if "norm" in name:
                p.add_(0.3 * torch.randn_like(p))
            if name.endswith(("k_proj.bias", "key.bias")):
                # q . b_k shifts every logit of a row equally: softmax ignores it, the true gradient is 0
                # and both runs give rounding noise that no relative tolerance can compare
                p.requires_grad_(False)
    return model.to(device=device, dtype=dtype)


def _expected(arch: str) -> list[str]:
    """Patched module paths (transformers 5.x names): the norms, the MLPs, and "" for attention (the
    model itself: set_attn_implementation)."""
    layer, names = {"vit": ("layers", ("layernorm_before", "layernorm_after", "mlp")),
                    "dinov2": ("encoder.layer", ("norm1", "norm2", "mlp")),
                    "clip": ("encoder.layers", ("layer_norm1", "layer_norm2", "mlp")),
                    "siglip": ("encoder.layers", ("layer_norm1", "layer_norm2", "mlp"))}[arch]
    top = {"vit": ["layernorm"], "dinov2": ["layernorm"], "clip": ["pre_layrnorm", "post_layernorm"],
           "siglip": ["post_layernorm", "head.layernorm", "head.mlp"]}[arch]
    return ["", *top] + [f"{layer}.{i}.{n}" for i in range(LAYERS) for n in names]


def _inputs(device, arch):
    g = torch.Generator().manual_seed(5)
    tokens = 16 if arch == "siglip" else 17  # 16 patches (+ the class token)
    return {"pixel_values": torch.randn(2, 3, 32, 32, generator=g).to(device),
            "_dy": torch.randn(2, tokens, 128, generator=g).to(device)}


def _forward(model, inp):
    return model(pixel_values=inp["pixel_values"]).last_hidden_state  # (SigLIP's pooled head: not in the loss)


@pytest.mark.parametrize("device,dtype", MODEL_CASES)
@pytest.mark.parametrize("arch", ["vit", "dinov2", "clip", "siglip"])
def test_vision_transformer(kf, arch, device, dtype):
    model = _vit(arch, device, dtype)
    report = check_model(kf, model, _inputs(device, arch), _forward, _expected(arch), dtype, patch_kwargs={},
                         attention=True)
    ops = {p.path: p.op for p in report.patched}
    assert all(ops[p] == "kernelforge.gelu" for p in _expected(arch) if p.endswith("mlp"))
    assert ops[""] == "kernelforge.attention"


def test_quick_gelu_mlp_skipped(kf):
    """CLIP's default quick_gelu (x * sigmoid(1.702 x)) has no kernel: the MLP is skipped with the reason."""
    transformers = pytest.importorskip("transformers")
    model = transformers.CLIPVisionModel(transformers.CLIPVisionConfig(
        hidden_size=64, num_hidden_layers=1, num_attention_heads=2, intermediate_size=128, image_size=16,
        patch_size=8))
    report = kf.patch(model, attention=False)
    skipped = [s for s in report.skipped if s.path.endswith("mlp")]
    assert len(skipped) == 1 and "QuickGELUActivation" in skipped[0].reason, str(report)
    assert not [p for p in report.patched if p.path.endswith("mlp")]
    kf.unpatch(model)
