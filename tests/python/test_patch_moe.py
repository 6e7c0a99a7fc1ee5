"""patch() on tiny random mixture-of-experts transformers (Mixtral, Qwen2-MoE, Qwen3-MoE, DeepSeek-V2,
gpt-oss): their experts modules run on kernelforge.grouped_mm; patched and unpatched outputs and
parameter gradients agree (bfloat16: both against a float32 run of the same weights), the report lists
every experts module, unpatch restores them."""

from __future__ import annotations

import pytest
import torch

import norm_ref as R
from test_patch_models import MODEL_CASES, check_model

MOE_ONLY = {"norms": False, "activations": False, "rope": False, "loss": False, "graph": False}


def _moe_model(arch: str, device, dtype):
    transformers = pytest.importorskip("transformers")
    common = dict(vocab_size=128, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                  max_position_embeddings=64, attn_implementation="eager")
    if arch == "mixtral":
        cfg = transformers.MixtralConfig(intermediate_size=96, num_local_experts=4, num_experts_per_tok=2, **common)
        model = transformers.MixtralForCausalLM(cfg)
    elif arch == "qwen2_moe":
        cfg = transformers.Qwen2MoeConfig(intermediate_size=96, moe_intermediate_size=48,
                                          shared_expert_intermediate_size=64, num_experts=4, num_experts_per_tok=2,
                                          decoder_sparse_step=1, **common)
        model = transformers.Qwen2MoeForCausalLM(cfg)
    elif arch == "qwen3_moe":
        cfg = transformers.Qwen3MoeConfig(head_dim=16, intermediate_size=96, moe_intermediate_size=40, num_experts=6,
                                          num_experts_per_tok=2, decoder_sparse_step=1, **common)
        model = transformers.Qwen3MoeForCausalLM(cfg)
    elif arch == "deepseek_v2":
        common["num_key_value_heads"] = 4  # MLA: one key / value head per query head
        cfg = transformers.DeepseekV2Config(intermediate_size=96, moe_intermediate_size=32, n_routed_experts=4,
                                            num_experts_per_tok=2, n_shared_experts=1, first_k_dense_replace=1,
                                            kv_lora_rank=16, q_lora_rank=None, qk_rope_head_dim=8, qk_nope_head_dim=8,
                                            v_head_dim=16, n_group=1, topk_group=1, **common)
        model = transformers.DeepseekV2ForCausalLM(cfg)
    elif arch == "gpt_oss":
        cfg = transformers.GptOssConfig(head_dim=16, intermediate_size=48, num_local_experts=4, num_experts_per_tok=2,
                                        sliding_window=8, **common)
        model = transformers.GptOssForCausalLM(cfg)
    else:
        raise ValueError(arch)
    model = model.to(device=device, dtype=dtype)
    with torch.no_grad():  # HF initializes expert biases to zero, which would hide a wrong bias gather
        for name, p in model.named_parameters():
            if "bias" in name and "experts" in name:
                p.copy_(R.rand(p.shape, p.dtype, p.device, scale=0.1))
    return model


@pytest.mark.parametrize("device,dtype", MODEL_CASES)
@pytest.mark.parametrize("arch", ["mixtral", "qwen2_moe", "qwen3_moe", "deepseek_v2", "gpt_oss"])
def test_moe_model(kf, arch, device, dtype):
    model = _moe_model(arch, device, dtype)
    ids = torch.randint(0, 128, (2, 9), device=device)
    inputs = {"ids": ids, "_dy": R.rand((2, 9, 128), torch.float32, device)}

    def forward(m, inp):
        return m(input_ids=inp["ids"], use_cache=False).logits

    experts = [n for n, m in model.named_modules() if n.endswith("mlp.experts")]
    assert experts
    report = check_model(kf, model, inputs, forward, experts, dtype, patch_kwargs=MOE_ONLY)
    assert {p.op for p in report.patched} == {"kernelforge.grouped_mm"}


def test_no_experts_no_patch(kf):
    transformers = pytest.importorskip("transformers")
    model = transformers.LlamaForCausalLM(transformers.LlamaConfig(
        vocab_size=32, hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2))
    report = kf.patch(model, **MOE_ONLY, attention=False)
    assert not report.patched


def test_mixed_dtype_runs_the_original_announced(kf, monkeypatch):
    """An input dtype that is not the expert weights' (transformers would compute in the promoted dtype):
    the module's original forward runs, with a one-time warning; KF_STRICT=1 makes it an error."""
    import importlib

    monkeypatch.setattr(importlib.import_module("kernelforge.patch._runtime"), "warned", set())
    monkeypatch.delenv("KF_STRICT", raising=False)
    model = _moe_model("mixtral", "cpu", torch.float32)
    experts = model.model.layers[0].mlp.experts
    kf.patch(model, **MOE_ONLY, attention=False)
    x = R.rand((5, 64), torch.float64, "cpu")
    idx = torch.tensor([[0, 1], [2, 3], [1, 2], [0, 3], [3, 2]])
    w = torch.full((5, 2), 0.5, dtype=torch.float64)
    with pytest.warns(UserWarning, match="input dtype torch.float64 and expert weight dtype torch.float32"):
        got = experts(x, idx, w)
    assert torch.equal(got, type(experts).forward(experts, x, idx, w))
    monkeypatch.setenv("KF_STRICT", "1")
    with pytest.raises(RuntimeError, match="KF_STRICT"):
        experts(x, idx, w)
    monkeypatch.delenv("KF_STRICT")
    assert kf.unpatch(model) == 2


def test_sentinel_experts_contribute_nothing(kf):
    """Expert-parallel sentinel ids (>= num_experts) sort past the last group: their rows are 0, so a
    token routed only to sentinels gets 0, and the other tokens what the eager experts give."""
    model = _moe_model("mixtral", "cpu", torch.float32)
    experts = model.model.layers[0].mlp.experts
    x = R.rand((4, 64), torch.float32, "cpu")
    idx = torch.tensor([[0, 4], [4, 4], [1, 2], [3, 0]])  # 4 = num_experts: a sentinel
    w = torch.tensor([[0.6, 0.4], [0.5, 0.5], [0.3, 0.7], [0.2, 0.8]])
    kf.patch(model, **MOE_ONLY, attention=False)
    got = experts(x, idx, w)
    assert torch.count_nonzero(got[1]) == 0
    want = torch.zeros_like(x)  # the Mixtral expert MLP, token by token, sentinels skipped
    for t in range(4):
        for j in range(2):
            e = int(idx[t, j])
            if e < experts.num_experts:
                gate, up = (experts.gate_up_proj[e] @ x[t]).chunk(2)
                want[t] += w[t, j] * (experts.down_proj[e] @ (torch.nn.functional.silu(gate) * up))
    torch.testing.assert_close(got, want.detach(), rtol=1e-5, atol=1e-5)
    kf.unpatch(model)
