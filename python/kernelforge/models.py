"""Random-weight models for `kforge levels` and `kforge profile`: each builder returns the module, its
inputs, the forward that maps them to one output tensor (the tensor the levels compare) and the
scalar loss of a training step.

  lm      a small Llama (4 layers, hidden 512, 8 / 4 heads x 64, vocab 32000), 4 x 512 tokens
  llama   Llama-3.2-1B-shaped (16 layers, hidden 2048, 32 / 8 heads x 64, vocab 128256), 4 x 2048 tokens;
          the output is the last position's logits (what a prefill hands to generation), the training
          loss the causal-LM loss (lm too)
  vit     ViT-B/16-shaped encoder (12 layers, hidden 768, 12 heads), 32 images of 224 x 224
  gnn     3-layer GraphSAGE on a synthetic power-law graph (100k nodes, 2M edges, 128 float32 features): PyG's
          ``SAGEConv`` (mean aggregation) where torch_geometric is installed, which ``kf.patch`` routes
          to ``gather_scatter``; else the same layer written with ``index_add_`` (no kernelforge level)
  ltx     the LTX-Video transformer: 28 blocks, 2688 video tokens (7 x 16 x 24 latents), 128 text
          tokens, batch 2 (classifier-free guidance)
  moe     a Mixtral-8x7B-shaped sparse MoE block (8 experts, hidden 4096 -> 14336, top-2), 4 x 2048 tokens,
          experts as written (transformers' "eager" loop); moe_grouped: the same with transformers'
          "grouped_mm" experts implementation (torch._grouped_mm)

``size="small"`` builds a 2-layer model of the same kind with small inputs, for smoke tests.

Also the harness the three commands share: their common arguments (--size, --device, --warmup,
--iters), the device choice, the timing of one step and the progress bar.
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass
from typing import Callable

import torch
from torch import nn


@dataclass
class Model:
    module: nn.Module
    inputs: tuple  # tensors, passed positionally to `forward`
    forward: Callable  # (module, *inputs) -> output tensor
    what: str
    kind: str  # "llama", "vit", "gnn", "ltx": which levels apply
    loss: Callable | None = None  # (module, *inputs) -> scalar training loss; None: mean square of the output
    new_tokens: int = 0  # generation models: tokens generated per step (forward generates them)

    def train_loss(self, module: nn.Module, *inputs) -> torch.Tensor:
        if self.loss is not None:
            return self.loss(module, *inputs)
        return self.forward(module, *inputs).float().square().mean()


def _llama(size: str, device, dtype, small_lm: bool) -> Model:
    from transformers import LlamaConfig, LlamaForCausalLM  # noqa: PLC0415

    if size == "small":
        cfg = dict(hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=2,
                   num_key_value_heads=1, head_dim=64, vocab_size=512)
        batch, seq = 2, 64
    elif small_lm:
        cfg = dict(hidden_size=512, intermediate_size=1408, num_hidden_layers=4, num_attention_heads=8,
                   num_key_value_heads=4, head_dim=64, vocab_size=32000)
        batch, seq = 4, 512
    else:
        cfg = dict(hidden_size=2048, intermediate_size=8192, num_hidden_layers=16, num_attention_heads=32,
                   num_key_value_heads=8, head_dim=64, vocab_size=128256, rope_theta=500000.0,
                   tie_word_embeddings=True)
        batch, seq = 4, 2048
    torch.manual_seed(0)
    with torch.device(device):  # initialized where it runs: a 1B-parameter init on the host takes tens of seconds
        model = LlamaForCausalLM(LlamaConfig(max_position_embeddings=max(seq, 256), **cfg)).to(dtype)
    ids = torch.randint(0, cfg["vocab_size"], (batch, seq), device=device)

    def forward(m, ids):  # the last position's logits (the prefill output a generation step needs)
        return m(input_ids=ids, logits_to_keep=1).logits

    def loss(m, ids):  # the causal-LM loss of a training step
        return m(input_ids=ids, labels=ids).loss

    return Model(model, (ids,), forward, f"Llama ({cfg['num_hidden_layers']} layers, hidden {cfg['hidden_size']}), "
                 f"{batch} x {seq} tokens", "llama", loss)


def _llama_generate(size: str, device, dtype, batch: int = 1) -> Model:
    """The Llama-1B-shaped model generating: a 512-token prompt, 128 new tokens, greedy, ``batch`` prompts
    of the same length (small: the 2-layer model, 16 + 4 tokens). forward runs the whole generate call.
    The prompts hold no pad token (id 0), so HF generate builds no padding mask."""
    base = _llama(size, device, dtype, False)
    prompt, new = (16, 4) if size == "small" else (512, 128)
    ids = base.inputs[0][:batch, :prompt]
    if ids.shape[0] < batch:
        more = torch.randint(1, base.module.config.vocab_size, (batch - ids.shape[0], prompt), device=ids.device)
        ids = torch.cat([ids, more])
    ids = ids.clamp_min(1).contiguous()
    base.module.generation_config.pad_token_id = 0

    def forward(m, ids):
        return m.generate(ids, max_new_tokens=new, min_new_tokens=new, do_sample=False)

    return Model(base.module, (ids,), forward, f"{base.what.split(',')[0]}, generate: prompt {prompt}, "
                 f"{new} new tokens, batch {batch}", "llama", None, new)


def _llama_generate_batch(size: str, device, dtype, batch: int = 16) -> Model:
    """transformers' continuous batching (``generate_batch``) of ``batch`` prompts of the Llama-1B-shaped
    model, 512 tokens each, 128 new tokens each, greedy, on its paged cache (block size 256; on a CPU a
    1 GiB budget instead of the free GPU memory it sizes itself from); small: the 2-layer model, 16 + 4
    tokens. The attention implementation is the model's: "sdpa" runs "paged|sdpa", a kf.patch-ed model
    "paged|kernelforge" (decode-only batches through decode_attention on the pages)."""
    from transformers import GenerationConfig  # noqa: PLC0415
    from transformers.generation.configuration_utils import ContinuousBatchingConfig  # noqa: PLC0415

    base = _llama_generate(size, device, dtype, batch)
    new = base.new_tokens
    gc = GenerationConfig(max_new_tokens=new, min_new_tokens=new, do_sample=False, eos_token_id=-1, pad_token_id=0)
    small = size == "small"
    cfg = ContinuousBatchingConfig(block_size=16 if small else 256, num_blocks=64 if small else None,
                                   max_batch_tokens=64 if small else None)
    cpu = torch.device(device).type == "cpu"

    def forward(m, ids):
        if not cpu:
            return m.generate_batch(inputs=ids.tolist(), generation_config=gc, continuous_batching_config=cfg,
                                    progress_bar=False)
        from transformers.generation.continuous_batching import cache as cb_cache  # noqa: PLC0415

        handler = cb_cache.PagedAttentionMemoryHandler
        free = handler.get_available_memory
        handler.get_available_memory = lambda self: 1 << 30  # a CPU budget for the cache, this call only
        try:
            return m.generate_batch(inputs=ids.tolist(), generation_config=gc, continuous_batching_config=cfg,
                                    progress_bar=False)
        finally:
            handler.get_available_memory = free

    return Model(base.module, base.inputs, forward, base.what.replace("generate:", "generate_batch:"), "llama",
                 None, new)


def _vit(size: str, device, dtype) -> Model:
    from transformers import ViTConfig, ViTModel  # noqa: PLC0415

    if size == "small":
        cfg = ViTConfig(hidden_size=128, num_hidden_layers=2, num_attention_heads=2, intermediate_size=256,
                        image_size=32, patch_size=8)
        batch = 2
    else:
        cfg = ViTConfig(hidden_size=768, num_hidden_layers=12, num_attention_heads=12, intermediate_size=3072,
                        image_size=224, patch_size=16)
        batch = 32
    torch.manual_seed(0)
    with torch.device(device):
        model = ViTModel(cfg, add_pooling_layer=False).to(dtype)
    x = torch.randn(batch, 3, cfg.image_size, cfg.image_size, device=device, dtype=dtype)

    def forward(m, x):
        return m(pixel_values=x).last_hidden_state

    return Model(model, (x,), forward, f"ViT ({cfg.num_hidden_layers} layers, hidden {cfg.hidden_size}), {batch} "
                 f"images of {cfg.image_size}", "vit")


class _Sage(nn.Module):
    """GraphSAGE layer, mean aggregation: relu(W_self x + W_neigh mean_{j -> i} x_j)."""

    def __init__(self, d_in: int, d_out: int):
        super().__init__()
        self.lin_self = nn.Linear(d_in, d_out)
        self.lin_neigh = nn.Linear(d_in, d_out, bias=False)

    def forward(self, x, src, dst, inv_deg):
        agg = torch.zeros_like(x).index_add_(0, dst, x.index_select(0, src)) * inv_deg
        return torch.relu(self.lin_self(x) + self.lin_neigh(agg))


class _Gnn(nn.Module):
    def __init__(self, d: int, layers: int):
        super().__init__()
        self.layers = nn.ModuleList(_Sage(d, d) for _ in range(layers))

    def forward(self, x, src, dst, inv_deg):
        for layer in self.layers:
            x = layer(x, src, dst, inv_deg)
        return x


class _PygGnn(nn.Module):
    """The same network from PyG's SAGEConv (lin_l on the neighbour mean, lin_r on the node itself)."""

    def __init__(self, d: int, layers: int):
        super().__init__()
        from torch_geometric.nn import SAGEConv  # noqa: PLC0415

        self.layers = nn.ModuleList(SAGEConv(d, d, aggr="mean") for _ in range(layers))

    def forward(self, x, edge_index):
        for layer in self.layers:
            x = torch.relu(layer(x, edge_index))
        return x


def _gnn(size: str, device, dtype) -> Model:
    # float32 features whatever the other models use: PyG's bfloat16 mean adds each hub node's ~170k
    # messages with bfloat16 atomics, 1.4 s per forward on the H100 (and off by 13 % against float32),
    # and torch.compile of it did not finish a step in minutes
    dtype = torch.float32
    nodes, edges, d = (1000, 20000, 32) if size == "small" else (100_000, 2_000_000, 128)
    g = torch.Generator().manual_seed(0)
    # power law: destination i drawn with probability ~ 1 / (i + 1) (a few hubs receive most edges)
    weights = 1.0 / torch.arange(1, nodes + 1, dtype=torch.float64)
    dst = torch.multinomial(weights, edges, replacement=True, generator=g)
    src = torch.randint(0, nodes, (edges,), generator=g)
    order = torch.argsort(dst)  # sorted destinations, as a CSR graph holds them
    src, dst = src[order].to(device), dst[order].to(device)
    torch.manual_seed(0)
    x = torch.randn(nodes, d, device=device, dtype=dtype)
    graph = f"{nodes} nodes, {edges} power-law edges"
    try:
        model = _PygGnn(d, 3).to(device, dtype)
    except ImportError:
        deg = torch.bincount(dst, minlength=nodes).clamp_min(1).to(dtype)
        model = _Gnn(d, 3).to(device, dtype)
        return Model(model, (x, src, dst, (1.0 / deg).unsqueeze(1)), lambda m, *a: m(*a),
                     f"GraphSAGE (3 layers, {d} features, index_add_; torch_geometric is not installed), {graph}",
                     "gnn")
    return Model(model, (x, torch.stack([src, dst])), lambda m, *a: m(*a),
                 f"PyG GraphSAGE (3 SAGEConv layers, mean, {d} features), {graph}", "gnn")


def _ltx(size: str, device, dtype) -> Model:
    from diffusers import LTXVideoTransformer3DModel  # noqa: PLC0415

    torch.manual_seed(0)
    with torch.device(device):
        if size == "full":
            module = LTXVideoTransformer3DModel(num_layers=28)
            b, f, h, w, text = 2, 7, 16, 24, 128
        else:
            module = LTXVideoTransformer3DModel(in_channels=8, out_channels=8, num_attention_heads=2,
                                                attention_head_dim=64, cross_attention_dim=128, num_layers=2,
                                                caption_channels=16)
            b, f, h, w, text = 2, 2, 4, 4, 6
    module = module.to(device, dtype)
    cfg = module.config
    video = torch.randn(b, f * h * w, cfg.in_channels, device=device, dtype=dtype)
    prompt = torch.randn(b, text, cfg.caption_channels, device=device, dtype=dtype)
    timestep = torch.full((b,), 500, device=device, dtype=torch.long)

    def forward(m, video, prompt, timestep):
        # no text padding mask (a padded prompt's mask sends cross-attention to diffusers' attention)
        return m(hidden_states=video, encoder_hidden_states=prompt, timestep=timestep, encoder_attention_mask=None,
                 num_frames=f, height=h, width=w, return_dict=False)[0]

    return Model(module, (video, prompt, timestep), forward, f"LTX-Video transformer ({cfg.num_layers} blocks), "
                 f"{f * h * w} video + {text} text tokens, batch {b}", "ltx")


def _moe(size: str, device, dtype, experts: str) -> Model:
    """A Mixtral-8x7B-shaped sparse MoE block (hidden 4096, 8 experts of 14336, top-2; small: hidden 128,
    4 experts of 256) on 4 x 2048 tokens (small: 2 x 64), with transformers' experts implementation
    ``experts`` ("eager": the per-expert loop as the model is written; "grouped_mm": torch._grouped_mm).
    The input requires grad: a training step computes dx too, as inside a model."""
    from transformers import MixtralConfig  # noqa: PLC0415
    from transformers.models.mixtral.modeling_mixtral import MixtralSparseMoeBlock  # noqa: PLC0415

    if size == "small":
        cfg, (batch, seq) = dict(hidden_size=128, intermediate_size=256, num_local_experts=4), (2, 64)
    else:
        cfg, (batch, seq) = dict(hidden_size=4096, intermediate_size=14336, num_local_experts=8), (4, 2048)
    config = MixtralConfig(num_experts_per_tok=2, **cfg)
    config._experts_implementation = experts
    torch.manual_seed(0)
    with torch.device(device):
        module = MixtralSparseMoeBlock(config)
        for p in module.parameters():
            torch.nn.init.normal_(p, std=0.02)
    module = module.to(device, dtype)
    x = torch.randn(batch, seq, cfg["hidden_size"], device=device, dtype=dtype, requires_grad=True)
    return Model(module, (x,), lambda m, x: m(x), f"Mixtral MoE block ({cfg['num_local_experts']} experts, hidden "
                 f"{cfg['hidden_size']}, top-2, experts={experts}), {batch} x {seq} tokens", "moe")


MODELS = {
    "lm": lambda s, d, t: _llama(s, d, t, True),
    "llama": lambda s, d, t: _llama(s, d, t, False),
    "llama_generate": _llama_generate,
    "llama_generate_b16": lambda s, d, t: _llama_generate(s, d, t, 16),
    "llama_generate_b64": lambda s, d, t: _llama_generate(s, d, t, 64),
    "llama_generate_batch": _llama_generate_batch,
    "vit": _vit,
    "gnn": _gnn,
    "ltx": _ltx,
    "moe": lambda s, d, t: _moe(s, d, t, "eager"),
    "moe_grouped": lambda s, d, t: _moe(s, d, t, "grouped_mm"),
}


# ---- the commands' shared harness ------------------------------------------------------------------------


def csv_list(valid: tuple):
    """argparse type: a comma-separated list of names from ``valid``."""

    def parse(text: str) -> list[str]:
        items = [t.strip() for t in text.split(",") if t.strip()]
        bad = [t for t in items if t not in valid]
        if bad or not items:
            raise argparse.ArgumentTypeError(f"{','.join(bad) or text!r}: choose from {', '.join(valid)}")
        return items

    return parse


def add_model_arguments(p: argparse.ArgumentParser, timed: bool = True) -> None:
    """--size and --device; with ``timed``, --warmup and --iters."""
    p.add_argument("--size", choices=("full", "small"), default="full",
                   help="full: the shapes of kernelforge/models.py; small: a 2-layer model of the same kind")
    p.add_argument("--device", choices=("cuda", "cpu"), default=None,
                   help="default: cuda when available (bfloat16), else cpu (float32)")
    if timed:
        p.add_argument("--warmup", type=int, default=3, help="untimed steps (the first also compiles)")
        p.add_argument("--iters", type=int, default=10, help="timed steps (median)")


def resolve_device(command: str, args: argparse.Namespace) -> str | None:
    """The device the command runs on, or None after printing why it cannot run (bad arguments)."""
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    if device == "cuda" and not torch.cuda.is_available():
        print(f"kforge {command}: --device cuda but no CUDA GPU is available", file=sys.stderr)
        return None
    if getattr(args, "iters", 1) < 1 or getattr(args, "warmup", 1) < 1:
        print(f"kforge {command}: --iters and --warmup must be at least 1", file=sys.stderr)
        return None
    return device


def time_step_ms(step: Callable, device: str) -> float:
    """Milliseconds of one call of ``step``: CUDA events on the GPU, the host clock on the CPU."""
    if device == "cuda":
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        step()
        b.record()
        b.synchronize()
        return a.elapsed_time(b)
    t0 = time.perf_counter()
    step()
    return (time.perf_counter() - t0) * 1e3


class Progress:
    """A tqdm bar on stderr, or one line per finished run where tqdm is not installed."""

    def __init__(self, total: int, desc: str):
        self.total, self.desc, self.done = total, desc, 0
        try:
            from tqdm import tqdm  # noqa: PLC0415

            self.bar = tqdm(total=total, desc=desc, file=sys.stderr)
        except ImportError:
            self.bar = None

    def start(self, what: str) -> None:
        if self.bar is not None:
            self.bar.set_postfix_str(what)

    def finish(self, what: str) -> None:
        self.done += 1
        if self.bar is not None:
            self.bar.update(1)
        else:
            print(f"[{self.done}/{self.total}] {self.desc}: {what}", file=sys.stderr)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
