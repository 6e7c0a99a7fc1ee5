"""kernelforge.decode_step: the one-token decode step of Llama / Mistral / Qwen2 causal LMs written with
kernelforge ops, for ``kernelforge.generate`` (``fused_step``). It computes what the transformers forward of
one token computes on a static cache, with 10 kernels per layer (9 with the fused RoPE append) where that forward issues 19 (kf.patch'ed:
separate q / k / v and gate / up projections, two residual adds, the cache's arange + index_copy pairs and
length counter) to ~40 (unpatched: RMSNorm and RoPE as elementwise ops too).

Per layer, x the residual stream [B, 1, H] in the model's dtype, d the previous layer's MLP output:

    h, x  = add_rms_norm(x, d, w_in)                   layer 0: h = rms_norm(embedding(tokens), w_in)
    qkv   = linear(h, W_qkv, b_qkv)                    [B, 1, (Hq + 2 Hkv) D], one GEMM
    q, k  = apply_rope(q, k, cos, sin, positions)      in place on the views of qkv (positions = seq_lens - 1)
    kv_append(K, V, k, v, seq_lens)                    the new row at seq_lens - 1 of the static cache
                                                       (FUSED_ROPE_APPEND: one rope_kv_append launch)
    a     = decode_attention(q, K, V, seq_lens)        [B, 1, Hq, D]
    o     = linear(a, W_o, b_o)
    h, x  = add_rms_norm(x, o, w_post)
    d     = linear(silu_and_mul(linear(h, W_gate_up)), W_down)
    final: h = add_rms_norm(x, d, w_norm)[0]; logits = linear(h, W_lm_head)   [B, V]

Kernels per layer: 2 norms, 4 GEMMs, RoPE, kv_append, decode_attention, silu_and_mul: 10; 9 with
FUSED_ROPE_APPEND. Per step besides: the embedding, the final norm, the LM head. The bytes are the weights once and the cache's rows once:
Llama-3.2-1B in bf16 at 576 keys reads 2.47 GB of weights and 16 layers x 2 x 8 heads x 64 x 2 B x 576
= 19 MB of keys and values per token (0.64 ms at 3.9 TB/s); at ~175 kernels per step, each microsecond
of launch gap or tail per kernel costs 0.175 ms.

- W_qkv = cat(W_q, W_k, W_v) and W_gate_up = cat(W_gate, W_up) are built once (one layer at a time: the
  extra memory is one layer's projections while it is built) and the modules' parameters are re-pointed to
  views of them (``param.data = W_qkv[a:b]``): the model keeps working, its memory stays the same, and an
  in-place change of a weight (``load_state_dict``, an optimizer step) is seen by both. Parts that cannot
  share a buffer (another dtype or device, a tensor subclass, bias on some parts only) stay separate GEMMs
  (``swiglu(gate, up)`` for the MLP). Parameters already adjacent in one buffer are used as they are.
- RoPE: cos / sin [L, D] for positions 0 .. L - 1 are computed once per cache length by the model's own
  rotary embedding module (its rope_type, scaling and attention factor: llama3, linear, yarn are exact),
  in the model's dtype as transformers passes them; the step reads row ``positions[b]`` (a device tensor).
- The cache: the StaticCache layers the prefill filled, seen as [B, L, Hkv, D] (``static_cache_view``);
  ``seq_lens`` (int32 [B], the keys held after the step's append) is a device tensor, so a CUDA graph of
  the step replays for every length. The step does not move the StaticLayer's own length counter.
- Linear layers: ``proj_linear`` for the projections (default ``decode_linear``: kernelforge.linear's
  GEMV kernel for one token row, ``torch.nn.functional.linear`` (cuBLAS) for more) and ``head_linear`` for
  the LM head (default ``kernelforge.linear``). H200, bf16, L2 flushed: one row of the Llama-1B step's
  projections (2048 -> 3072 / 2048 / 16384, 8192 -> 2048) on the GEMV kernel 1.12-1.29x cuBLAS, the LM
  head 1.00x; at 16 rows kernelforge.linear's tiled kernels 0.82-0.93x, hence the split. The batch-1 graph step:
  1020 against 1156 us with the projections on cuBLAS (interleaved rounds in one process).
- decode_attention's split workspace is made once per call shape (``decode_workspace``, zeroed once) and
  shared by the layers: no memset of its merge counters before each layer's attention, so in the graph the
  attention kernel keeps its programmatic edge from the append. A step runs one call at a time.
- L2 prefetch (``l2_prefetch`` bytes per layer, default ``L2_PREFETCH_BYTES``, 0 = off): after the q/k/v
  GEMM a branch on a second stream asks L2 (``prefetch_l2``) for the layer's o weight, then the head of its
  gate/up weight, while RoPE, the append and decode attention run: those are latency-bound (at batch 1 about
  12 µs a layer with the DRAM nearly idle, room for ~45 MB at 3.7 TB/s), so the next two GEMMs find part of
  their weight in L2. ``l2_prefetch_kv`` (default ``L2_PREFETCH_KV``, False) puts the layer's K and V cache
  first, for decode attention. The branch joins the main stream after the LM head. Llama-3.2-1B: W_o 8.4 MB,
  W_gate_up 67 MB a layer; the L2 holds 50 MB. Off by default: no gain measured on the H200 (notes/decode.md).
- ``prefill(tokens, caches, cos, sin)``: the same layers over a prompt's S rows (causal ``attention`` over its
  own keys, ``kv_append`` of the S rows at 0 .. S - 1, the final norm and the LM head on the last row), about
  half the ops of the transformers forward; ``kernelforge.generate`` takes it for unpadded prompts when its
  ``FUSED_PREFILL`` is set.

Numerics against the transformers forward: the same ops in the same order, with kernelforge's roundings:
RoPE and silu_and_mul compute in float32 and round once (transformers rounds the products in the model's
dtype), add_rms_norm rounds the sum as ``residual + x`` does. float32 CPU models agree to float32
rounding; bf16 tokens agree until two logits are within bf16 noise of each other.

Supported (``unsupported_reason``): exactly LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM with
SiLU MLPs, RoPE over the whole head (no dynamic / longrope frequencies, which change with the length),
head dim 64, 128 or 256, one dtype for every parameter (CUDA: float16 / bfloat16), plain nn.Linear
projections of the config's shapes, no module hooks, no sliding window shorter than the cache.
"""

from __future__ import annotations

import importlib
import weakref
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from . import activation as _act
from . import decode as _dec
from . import norm as _norm
from . import rope as _rope

_lin = importlib.import_module(".linear", __package__)  # the module (the package binds the name to the function)
_attn = importlib.import_module(".attention", __package__)  # likewise

ARCHITECTURES = ("LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM")
# rope_kv_append (one launch) in place of apply_rope + kv_append (two); both give the same bits. Its GPU
# tests pass; the step's graph time with it (dev/prof_generate.py, H200, interleaved rounds in one
# process): 0.97x at batch 1 with the GEMV projections (992 against 1020 us), 1.00x at batch 16 with cuBLAS
# ones. Off until the end-to-end generation figures are measured with it.
FUSED_ROPE_APPEND = False
# Bytes per layer of the o and gate/up weights asked into L2 (prefetch_l2) on a parallel stream while the
# layer's RoPE, cache append and decode attention run (``l2_prefetch``, below). 0: off. On the H200 at the
# Llama-3.2-1B shape 40 MB took the batch-1 graph step from 1163 to 1125 µs, inside the spread of the
# rounds, and batch 16 from 1288 to 1292 (K/V + 40 MB: 1.03x / 1.08x slower; notes/decode.md).
L2_PREFETCH_BYTES = 0
# Whether that branch first asks L2 for the layer's whole K and V cache (every row up to the capacity: at
# batch 1 and 640 rows of Llama-3.2-1B, 2.6 MB a layer), which decode attention then reads from L2.
L2_PREFETCH_KV = False
HEAD_DIMS = (64, 128, 256)  # decode_attention's head dims

# model -> DecodeStep: built once per model, rebuilt when its parameters move (a weak dictionary: dies with it)
_STEPS: "weakref.WeakKeyDictionary[torch.nn.Module, DecodeStep]" = weakref.WeakKeyDictionary()


# ---- what is supported ----------------------------------------------------------------------------------------


def _architecture(model) -> str | None:
    """The transformers class name of ``model`` when it is exactly one of ARCHITECTURES (a subclass may
    change the forward), else None."""
    import transformers  # noqa: PLC0415

    for name in ARCHITECTURES:
        if type(model) is getattr(transformers, name, None):
            return name
    return None


def _head_dim(cfg) -> int:
    return getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads


def _window(cfg) -> int | None:
    """The sliding window of the model's sliding layers, None without one."""
    window = getattr(cfg, "sliding_window", None)
    types = getattr(cfg, "layer_types", None)
    return int(window) if window is not None and (types is None or "sliding_attention" in types) else None


def _plain_linear(m, n_out: int, n_in: int) -> bool:
    return (type(m) is torch.nn.Linear and tuple(m.weight.shape) == (n_out, n_in)
            and all(p is None or (type(p) is torch.nn.Parameter and type(p.data) is torch.Tensor)
                    for p in (m.weight, m.bias)))


def unsupported_reason(model, cache_len: int | None = None) -> str | None:
    """None when ``DecodeStep(model)`` computes the model's decode step (on a static cache of ``cache_len``
    rows, which a sliding window must cover; None: not checked); else why not, as a phrase ("a
    GemmaForCausalLM (...)") for the announcement of the fallback."""
    arch = _architecture(model)
    if arch is None:
        return (f"a {type(model).__name__} (the fused decode step takes exactly {', '.join(ARCHITECTURES)})")
    cfg = model.config
    if cfg.hidden_act not in ("silu", "swish"):
        return f"hidden_act={cfg.hidden_act!r} (the fused decode step's MLP is SiLU-gated)"
    D, Hq, Hkv, H = _head_dim(cfg), cfg.num_attention_heads, cfg.num_key_value_heads, cfg.hidden_size
    if D not in HEAD_DIMS:
        return f"head dim {D} (decode_attention takes {', '.join(map(str, HEAD_DIMS))})"
    rotary = getattr(model.model, "rotary_emb", None)
    rope_type = getattr(rotary, "rope_type", None)
    if not isinstance(rope_type, str) or "dynamic" in rope_type or rope_type == "longrope":
        return (f"rope_type {rope_type!r} (its frequencies change with the sequence length; the fused step "
                f"reads a table computed once)")
    if getattr(cfg, "partial_rotary_factor", 1.0) != 1.0:
        return f"partial_rotary_factor={cfg.partial_rotary_factor} (the fused step rotates whole heads)"
    window = _window(cfg)
    if window is not None and cache_len is not None and window < cache_len:
        return f"a sliding window of {window} tokens shorter than the cache ({cache_len} rows)"
    if model.training and getattr(cfg, "attention_dropout", 0.0):
        return "attention dropout in training mode"
    params = list(model.parameters())
    dtypes = {p.dtype for p in params}
    devices = {p.device for p in params}
    if len(dtypes) != 1 or len(devices) != 1:
        return (f"parameters of several dtypes or devices ({', '.join(sorted(map(str, dtypes | devices)))}); "
                f"the fused step runs in one dtype on one device")
    dtype, device = dtypes.pop(), devices.pop()
    if device.type == "cuda" and dtype not in (torch.float16, torch.bfloat16):
        return f"{dtype} CUDA parameters (decode_attention takes float16 / bfloat16 on CUDA)"
    if not dtype.is_floating_point or device.type not in ("cuda", "cpu"):
        return f"{dtype} parameters on {device.type}"
    hooked = [name for name, m in model.named_modules() if m._forward_hooks or m._forward_pre_hooks]
    if hooked or torch.nn.modules.module._global_forward_hooks or torch.nn.modules.module._global_forward_pre_hooks:
        return f"forward hooks ({', '.join(hooked[:3]) or 'global'}), which the fused step would not run"
    for i, layer in enumerate(model.model.layers):
        a, m = layer.self_attn, layer.mlp
        shapes = ((a.q_proj, Hq * D, H), (a.k_proj, Hkv * D, H), (a.v_proj, Hkv * D, H), (a.o_proj, H, Hq * D),
                  (m.gate_proj, cfg.intermediate_size, H), (m.up_proj, cfg.intermediate_size, H),
                  (m.down_proj, H, cfg.intermediate_size))
        if not all(_plain_linear(*s) for s in shapes):
            return (f"layer {i}'s projections are not plain nn.Linear modules of the config's shapes (quantized, "
                    f"sharded or replaced)")
    head = model.lm_head
    if not _plain_linear(head, head.weight.shape[0], H):
        return "an lm_head that is not a plain nn.Linear"
    return None


# ---- weights ----------------------------------------------------------------------------------------------------


def _adjacent(ts: list[torch.Tensor]) -> bool:
    """Whether the contiguous tensors ts follow each other in one storage (a concatenation already)."""
    if not all(t.is_contiguous() for t in ts):
        return False
    storage = ts[0].untyped_storage().data_ptr()
    return all(b.untyped_storage().data_ptr() == storage and b.data_ptr() == a.data_ptr() + a.nbytes
               for a, b in zip(ts, ts[1:]))


def _concat_params(params: list[torch.nn.Parameter]) -> torch.Tensor:
    """The parameters as rows of one buffer [sum of N_i, ...]: a view of them when they already are
    (``_adjacent``), else a new buffer holding them, each parameter re-pointed to its rows (the old
    tensors are freed when nothing else holds them)."""
    parts = [p.detach() for p in params]
    rows = sum(t.shape[0] for t in parts)
    if _adjacent(parts):
        return parts[0].as_strided((rows, *parts[0].shape[1:]), parts[0].stride())
    fused = torch.cat(parts)
    start = 0
    for p, t in zip(params, parts):
        p.data = fused[start:start + t.shape[0]]
        start += t.shape[0]
    return fused


def fuse_linears(modules: list[torch.nn.Linear]) -> tuple[torch.Tensor, torch.Tensor | None] | None:
    """(W, b): the weights (and biases) of ``modules`` concatenated along the output rows, y = x W^T + b
    computing every module's output side by side; the modules' parameters become views of W and b (same
    values: the model is unchanged, its memory too). None (nothing changed) when the parts cannot share
    one buffer: weights of different dtypes, devices or input widths, tensor subclasses, a bias on some
    parts only."""
    ws = [m.weight for m in modules]
    bs = [m.bias for m in modules]
    if any(b is None for b in bs) and not all(b is None for b in bs):
        return None
    ts = [t for t in ws + bs if t is not None]
    if any(type(t) is not torch.nn.Parameter or type(t.data) is not torch.Tensor or t.layout != torch.strided
           or t.dtype != ws[0].dtype or t.device != ws[0].device for t in ts):
        return None
    if any(w.dim() != 2 or w.shape[1] != ws[0].shape[1] for w in ws):
        return None
    with torch.no_grad():
        W = _concat_params(ws)
        b = None if bs[0] is None else _concat_params(bs)
    return W, b


def weights_fingerprint(model) -> tuple:
    """The addresses, dtypes and shapes of every parameter and buffer of the model: what a step built from
    it (or a graph captured from it) reads; a replaced tensor may reuse a freed address, hence dtype and
    shape too."""
    return tuple((t.data_ptr(), t.dtype, tuple(t.shape)) for t in (*model.parameters(), *model.buffers()))


# ---- the step ---------------------------------------------------------------------------------------------------


@dataclass
class _Layer:
    w_in: torch.Tensor
    eps_in: float
    qkv: tuple  # (W_qkv, b_qkv) fused, or ((W_q, b_q), (W_k, b_k), (W_v, b_v))
    fused_qkv: bool
    w_o: torch.Tensor
    b_o: torch.Tensor | None
    w_post: torch.Tensor
    eps_post: float
    gate_up: tuple  # (W_gate_up, b_gate_up) fused, or ((W_gate, b_gate), (W_up, b_up))
    fused_gate_up: bool
    w_down: torch.Tensor
    b_down: torch.Tensor | None


def _eps(norm, cfg) -> float:
    return float(getattr(norm, "variance_epsilon", getattr(norm, "eps", cfg.rms_norm_eps)))


def decode_linear(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None = None) -> torch.Tensor:
    """The step's projections: kernelforge.linear (its GEMV kernel) for one token row on CUDA,
    torch.nn.functional.linear (cuBLAS) otherwise (see the module docstring for the measured split)."""
    if x.is_cuda and x.numel() == x.shape[-1]:
        return _lin.linear(x, w, b)
    return F.linear(x, w, b)


class DecodeStep:
    """The decode step of a Llama / Mistral / Qwen2 causal LM (see the module docstring): built from the
    model (which it changes only by re-pointing the q / k / v and gate / up parameters to views of the
    fused weights), then called once per token with the step's device buffers.

        step = DecodeStep(model)                       # ValueError when unsupported_reason(model) is not None
        cos, sin = step.rope_table(cache_len)
        logits = step(tokens, positions, seq_lens, caches, cos, sin)

    ``proj_linear(x, w, b)``: the q/k/v, o, gate/up and down projections (default decode_linear);
    ``head_linear(x, w, b)``: the LM head (default kernelforge.linear). ``fuse=False`` keeps separate
    q / k / v and gate / up GEMMs (the model is then not changed at all)."""

    def __init__(self, model: torch.nn.Module, *, proj_linear=decode_linear, head_linear=_lin.linear, fuse: bool = True,
                 l2_prefetch: int | None = None, l2_prefetch_kv: bool | None = None):
        why = unsupported_reason(model)
        if why is not None:
            raise ValueError(f"DecodeStep: the model is not supported: {why}")
        cfg = model.config
        self.model = weakref.ref(model)
        self.proj_linear, self.head_linear = proj_linear, head_linear
        self.options = self.options_of(proj_linear, head_linear, fuse, l2_prefetch, l2_prefetch_kv)
        self.l2_prefetch, self.l2_prefetch_kv = self.options[3], self.options[4]
        self.head_dim = _head_dim(cfg)
        self.window = _window(cfg)
        self.n_q, self.n_kv = cfg.num_attention_heads, cfg.num_key_value_heads
        inner = model.model
        self.embed = inner.embed_tokens.weight
        self._ws: dict = {}  # decode_attention's workspace per call shape (_attn_workspace)
        # the prefetch branch's stream, made here: a CUDA graph capture of the step only forks it
        self._side = None
        if (self.l2_prefetch or self.l2_prefetch_kv) and self.embed.is_cuda:
            self._side = torch.cuda.Stream(device=self.embed.device)
        self.rotary = inner.rotary_emb
        self.scale = float(getattr(inner.layers[0].self_attn, "scaling", self.head_dim ** -0.5))
        self.layers = [self._layer(layer, cfg, fuse) for layer in inner.layers]
        self.w_norm, self.eps_norm = inner.norm.weight, _eps(inner.norm, cfg)
        self.w_head, self.b_head = model.lm_head.weight, model.lm_head.bias  # tied: the embedding itself
        self.fingerprint = weights_fingerprint(model)

    @staticmethod
    def options_of(proj_linear=decode_linear, head_linear=_lin.linear, fuse: bool = True,
                   l2_prefetch: int | None = None, l2_prefetch_kv: bool | None = None) -> tuple:
        n = L2_PREFETCH_BYTES if l2_prefetch is None else l2_prefetch
        if isinstance(n, bool) or not isinstance(n, int) or n < 0:
            raise ValueError(f"DecodeStep: l2_prefetch must be a number of bytes >= 0 or None, got {n!r}")
        kv = L2_PREFETCH_KV if l2_prefetch_kv is None else l2_prefetch_kv
        if not isinstance(kv, bool):
            raise ValueError(f"DecodeStep: l2_prefetch_kv must be True, False or None, got {kv!r}")
        return (proj_linear, head_linear, bool(fuse), n, kv)

    @staticmethod
    def _layer(layer, cfg, fuse: bool) -> _Layer:
        a, m = layer.self_attn, layer.mlp
        qkv = fuse_linears([a.q_proj, a.k_proj, a.v_proj]) if fuse else None
        gate_up = fuse_linears([m.gate_proj, m.up_proj]) if fuse else None
        return _Layer(
            w_in=layer.input_layernorm.weight, eps_in=_eps(layer.input_layernorm, cfg),
            qkv=qkv or tuple((p.weight, p.bias) for p in (a.q_proj, a.k_proj, a.v_proj)), fused_qkv=qkv is not None,
            w_o=a.o_proj.weight, b_o=a.o_proj.bias,
            w_post=layer.post_attention_layernorm.weight, eps_post=_eps(layer.post_attention_layernorm, cfg),
            gate_up=gate_up or tuple((p.weight, p.bias) for p in (m.gate_proj, m.up_proj)),
            fused_gate_up=gate_up is not None, w_down=m.down_proj.weight, b_down=m.down_proj.bias)

    @property
    def fused(self) -> bool:
        """Whether every layer runs one q/k/v GEMM and one gate/up GEMM."""
        return all(lay.fused_qkv and lay.fused_gate_up for lay in self.layers)

    def rope_table(self, length: int) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, sin [length, D] in the model's dtype: row p is what the model's rotary embedding returns for
        position p (the same module, so its rope scaling and attention factor included)."""
        x = torch.empty(1, dtype=self.embed.dtype, device=self.embed.device)  # gives the rotary its dtype and device
        positions = torch.arange(length, device=self.embed.device).unsqueeze(0)
        with torch.no_grad():
            cos, sin = self.rotary(x, positions)
        if cos.shape[-1] != self.head_dim:
            raise ValueError(f"DecodeStep: the rotary embedding returns {cos.shape[-1]} columns per position, the "
                             f"heads have {self.head_dim}")
        return cos[0].contiguous(), sin[0].contiguous()

    def caches(self, cache) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """The (K, V) [B, L, Hkv, D] views of a transformers StaticCache whose layers the prefill
        initialized: kv_append and decode_attention write and read the cache's own tensors."""
        from transformers.cache_utils import StaticLayer  # noqa: PLC0415

        out = []
        for i, layer in enumerate(cache.layers):
            if type(layer) is not StaticLayer or not getattr(layer, "is_initialized", False):
                raise ValueError(f"DecodeStep: cache layer {i} is a {type(layer).__name__}"
                                 f"{'' if getattr(layer, 'is_initialized', False) else ' not yet filled'}; the "
                                 f"step needs StaticLayers filled by a prefill")
            out.append((_dec.static_cache_view(layer.keys), _dec.static_cache_view(layer.values)))
        if len(out) != len(self.layers):
            raise ValueError(f"DecodeStep: the cache has {len(out)} layers, the model {len(self.layers)}")
        if self.window is not None and self.window < out[0][0].shape[1]:
            raise ValueError(f"DecodeStep: the sliding window of {self.window} tokens is shorter than the cache "
                             f"({out[0][0].shape[1]} rows); the step attends to every key it holds")
        return out

    def __call__(self, tokens: torch.Tensor, positions: torch.Tensor, seq_lens: torch.Tensor,
                 caches: list[tuple[torch.Tensor, torch.Tensor]], cos: torch.Tensor, sin: torch.Tensor,
                 key_starts: torch.Tensor | None = None) -> torch.Tensor:
        """The logits [B, V] (model dtype) of tokens (int64 [B, 1]) at positions (int64 [B, 1], equal to
        seq_lens - 1: rope_kv_append reads its positions from seq_lens), their keys and values appended to
        ``caches`` (``caches(cache)``) at those rows (seq_lens int32 [B]: the keys held after the append).
        ``key_starts`` (int32 [B]): a left-padded batch's pad rows at the head of each cache row, skipped by
        decode_attention (positions then count from each row's first token: seq_lens - 1 - key_starts).
        No host synchronization, fixed shapes: graph-capturable."""
        B = tokens.shape[0]
        x = F.embedding(tokens, self.embed)  # [B, 1, H]
        side = self._side if x.is_cuda else None  # made in __init__ when a prefetch option is on
        ws = None  # decode_attention's workspace, the same for every layer
        d = None
        for lay, (K, V) in zip(self.layers, caches):
            h, x = self._norm_in(lay, x, d)
            q, k, v = self._qkv(lay, h, B, 1)
            if side is not None:
                self._prefetch(side, lay, K, V)
            if FUSED_ROPE_APPEND and key_starts is None:  # its positions are seq_lens - 1
                q = _dec.rope_kv_append(q, k, v, cos, sin, K, V, seq_lens)
            else:
                _rope.apply_rope(q, k, cos, sin, position_ids=positions, inplace=True)
                _dec.kv_append(K, V, k, v, seq_lens)
            if ws is None:
                ws = self._attn_workspace(q, K, V, seq_lens, key_starts)
            a = _dec.decode_attention(q, K, V, seq_lens, scale=self.scale, max_seq_len=K.shape[1], key_starts=key_starts,
                                      workspace=ws)
            d, x = self._out_and_mlp(lay, x, a.view(B, 1, -1))
        h, _ = _norm.add_rms_norm(x, d, self.w_norm, self.eps_norm)
        logits = self.head_linear(h[:, -1], self.w_head, self.b_head)
        if side is not None:
            torch.cuda.current_stream().wait_stream(side)  # the branch rejoins (a graph capture needs it)
        return logits

    def prefill(self, tokens: torch.Tensor, caches: list[tuple[torch.Tensor, torch.Tensor]], cos: torch.Tensor,
                sin: torch.Tensor) -> torch.Tensor:
        """The logits [B, V] (model dtype) of the last of ``tokens`` (int64 [B, S], one prompt per row, no
        padding) at positions 0 .. S - 1, their keys and values written to rows 0 .. S - 1 of ``caches``
        (``caches(cache)``; S <= the cache length). The layers of ``__call__`` with S rows: the same fused
        GEMMs and norms, RoPE from rows 0 .. S - 1 of cos / sin, ``kv_append`` of the S rows, and causal
        ``attention`` over the prompt's own keys (the cache holds nothing before them); the final norm and
        the LM head on the last row only. A transformers forward of the prompt issues about twice the ops
        through the module tree, so its host time, not the GPU, bounds a short prompt's prefill."""
        B, S = tokens.shape
        if S > caches[0][0].shape[1]:
            raise ValueError(f"DecodeStep.prefill: {S} prompt tokens do not fit the cache's "
                             f"{caches[0][0].shape[1]} rows")
        lens = torch.full((B,), S, dtype=torch.int32, device=tokens.device)  # the rows held after the append
        cos_s, sin_s = cos[:S], sin[:S]
        x = F.embedding(tokens, self.embed)  # [B, S, H]
        d = None
        for lay, (K, V) in zip(self.layers, caches):
            h, x = self._norm_in(lay, x, d)
            q, k, v = self._qkv(lay, h, B, S)
            _rope.apply_rope(q, k, cos_s, sin_s, inplace=True)
            _dec.kv_append(K, V, k, v, lens)
            dt = _attn.reference_dtype(q)  # q's dtype; a CPU float32 model: float64, as attention.py calls it
            a = _attn.attention(q.to(dt), k.to(dt), v.to(dt), causal=True, scale=self.scale)  # [B, S, Hq, D]
            a = a.to(q.dtype)
            d, x = self._out_and_mlp(lay, x, a.reshape(B, S, -1))
        h, _ = _norm.add_rms_norm(x[:, -1:], d[:, -1:], self.w_norm, self.eps_norm)
        return self.head_linear(h[:, -1], self.w_head, self.b_head)

    def _norm_in(self, lay: _Layer, x: torch.Tensor, d: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        """The layer's input norm: (h, x), x the residual stream with the previous layer's MLP output d added
        (layer 0: d is None, x is the embedding)."""
        if d is None:
            return _norm.rms_norm(x, lay.w_in, lay.eps_in), x
        return _norm.add_rms_norm(x, d, lay.w_in, lay.eps_in)

    def _qkv(self, lay: _Layer, h: torch.Tensor, B: int, S: int):
        """q [B, S, Hq, D], k and v [B, S, Hkv, D]: column ranges of one GEMM's output (or three GEMMs)."""
        lin, D = self.proj_linear, self.head_dim
        nq, nkv = self.n_q * D, self.n_kv * D
        if lay.fused_qkv:
            qkv = lin(h, *lay.qkv)  # [B, S, nq + 2 nkv]
            q, k, v = qkv[..., :nq], qkv[..., nq:nq + nkv], qkv[..., nq + nkv:]
        else:
            q, k, v = (lin(h, w, b) for w, b in lay.qkv)
        return q.view(B, S, self.n_q, D), k.view(B, S, self.n_kv, D), v.view(B, S, self.n_kv, D)

    def _out_and_mlp(self, lay: _Layer, x: torch.Tensor, a: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """After attention (a [B, S, Hq * D]): the o projection, the residual add and norm, the MLP; returns
        (d, x), d the MLP's output that the next norm adds to the residual stream x."""
        lin = self.proj_linear
        o = lin(a, lay.w_o, lay.b_o)
        h, x = _norm.add_rms_norm(x, o, lay.w_post, lay.eps_post)
        if lay.fused_gate_up:
            m = _act.silu_and_mul(lin(h, *lay.gate_up))
        else:
            m = _act.swiglu(*(lin(h, w, b) for w, b in lay.gate_up))
        return lin(m, lay.w_down, lay.b_down), x

    def _attn_workspace(self, q, K, V, seq_lens, key_starts) -> torch.Tensor | None:
        """decode_attention's split workspace for this call's shapes, zeroed once and shared by every layer and
        every later call (decode_attention leaves its counters zero), so the step has no memset per layer.
        Made outside a CUDA graph capture (generate's warm-up step); a capture that finds none passes None
        (the per-call workspace and memset)."""
        key = (tuple(q.shape), tuple(K.shape), K.stride(), V.stride(), key_starts is not None, q.device, q.dtype)
        ws = self._ws.get(key)
        if ws is None and not (q.is_cuda and torch.cuda.is_current_stream_capturing()):
            ws = self._ws[key] = _dec.decode_workspace(q, K, V, seq_lens, scale=self.scale, max_seq_len=K.shape[1],
                                                       key_starts=key_starts)
        return ws

    def _prefetch(self, side: torch.cuda.Stream, lay: _Layer, K: torch.Tensor, V: torch.Tensor) -> None:
        """Fork ``side`` from the current stream (after the layer's q/k/v GEMM) and ask L2 for the layer's K and
        V cache (``l2_prefetch_kv``: the whole span of each, every row up to the capacity), then for up to
        ``l2_prefetch`` bytes of its o weight and then of its gate/up weight, in the order the kernels read
        them. On the branch the prefetch runs beside RoPE and the append (and decode attention), which are
        latency-bound and leave the DRAM idle; attention and the o and gate/up GEMMs then find those bytes in
        L2. A key row the append writes after its line was prefetched is the append's value: L2 is where
        writes and reads meet."""
        side.wait_stream(torch.cuda.current_stream())
        left = self.l2_prefetch
        weights = [lay.w_o] + ([lay.gate_up[0]] if lay.fused_gate_up else [w for w, _ in lay.gate_up])
        with torch.cuda.stream(side):
            if self.l2_prefetch_kv:
                _dec.prefetch_l2(K)
                _dec.prefetch_l2(V)
            for w in weights:
                n = min(left, w.numel() * w.element_size())
                if n <= 0:
                    break
                _dec.prefetch_l2(w, n)
                left -= n


def decode_step(model: torch.nn.Module, **options) -> DecodeStep:
    """The model's DecodeStep, built once per model (and options) and rebuilt when a parameter or buffer
    was replaced since (another address, dtype or shape: the step would read stale tensors). Raises
    ValueError for an unsupported model (``unsupported_reason``)."""
    step = _STEPS.get(model)
    if step is not None and step.fingerprint == weights_fingerprint(model):
        wanted = DecodeStep.options_of(**options)
        if step.options == wanted:
            return step
    step = DecodeStep(model, **options)
    _STEPS[model] = step
    return step


__all__ = ["DecodeStep", "decode_step", "fuse_linears", "unsupported_reason", "ARCHITECTURES"]
