"""kernelforge.generate: token generation for transformers causal LMs (Llama, Qwen2, Mistral shapes)
with the one-token decode step captured into a CUDA graph and replayed per token.

    ids = kf.generate(model, input_ids, max_new_tokens=128)             # greedy, like HF generate
    ids = kf.generate(model, input_ids, 128, do_sample=True, temperature=0.7, top_k=50, generator=g)

The loop:

- Prefill: one forward of the model over the prompt (eager) into a transformers ``StaticCache`` of
  prompt + max_new_tokens rows. The first new token comes from its last position's logits.
- Decode: one step = the model's forward of the last token with ``position_ids`` read from a device
  buffer, the static cache (which counts its own length on the device), the choice of the next token
  (argmax, or sampling), and in-place updates of the step's input buffers. Llama / Mistral / Qwen2
  models run the fused step of ``decode_step.py`` in place of the forward (``fused_step``, below).
  On CUDA the step is captured once into a CUDA graph per (batch size, cache length) and replayed; the
  graph, its buffers and its cache are kept with the model (a weak dictionary), so a second call of
  the same shapes replays the same graph after a prefill. A model whose weights, attention
  implementation or patch state changed since, or another sampling configuration or generator, or
  another decode step (fused or not), is captured again.
- Host synchronizations: none inside the decode loop but the end-of-sequence check, every
  ``EOS_CHECK_EVERY`` tokens (a sequence that ended emits the pad token until all have ended, as
  transformers does; the output is cut where transformers' would end), and the read of the tokens at
  the end.

The fused decode step (``fused_step=None``, the default, takes it for the models it supports while
``FUSED_STEP_BY_DEFAULT`` is set; ``True`` asks for it, ``False`` runs the model's forward):
``decode_step.DecodeStep`` computes the forward of one token with kernelforge ops, 10 kernels per layer
where the transformers forward issues 19 (patched) to ~40 (unpatched): rms_norm / add_rms_norm with the
residual add fused, one GEMM over the concatenated q/k/v weights (+ bias, Qwen2), RoPE in place from a
cos/sin table of the cache's positions computed once by the model's rotary module (llama3 / linear /
yarn scaling exact), kv_append and decode_attention on the prefill's StaticCache tensors with an int32
``seq_lens`` device buffer, the o projection, one GEMM over the concatenated gate/up weights,
silu_and_mul, the down projection; then the final norm and the LM head (``kernelforge.linear``). The
concatenated weights are built once and the modules' q/k/v and gate/up parameters re-pointed to views
of them (same values, same memory: the model is unchanged). The prefill is the model's forward, or with
``FUSED_PREFILL`` set (the default) ``DecodeStep.prefill``: the step's layers over the prompt's rows with
causal attention, for prompts without padding.
On sm_90 the step's kernels launch with programmatic dependent launch, each while the previous one
drains (``KF_PDL=0`` turns it off; notes/decode.md).
Models it does not take (other architectures, head dims other than 64/128/256, dynamic rope, CUDA
float32, module hooks, mixed dtypes, a sliding window shorter than the cache) run their forward: with
``fused_step=True`` a ValueError, with the default announced once (KF_STRICT=1: an error;
``fused_step=False``: no notice). Greedy tokens equal HF's on CPU
float32; in bf16 the step rounds like the patched model (RoPE and silu_and_mul in float32), so tokens
may differ from the model-forward step's where two logits are within bf16 noise.

The patched model (``kf.patch``) runs its kernels inside the graph; its attention takes the static
cache's key counts on the device (``patch/attention.py``), so each decode step runs
``kernelforge.decode_attention``. The unpatched model works the same way (transformers' own
attention with its static-cache mask), for comparison.

Greedy output equals ``model.generate(input_ids, max_new_tokens=n, do_sample=False)`` (HF, default
generation settings: no repetition penalty, no min length) on the same weights. Sampling draws from
the same distribution as HF (temperature, then top-k, then softmax) by the exponential race
(argmax of p_i / E_i with E_i ~ Exp(1), equivalent to Gumbel-max) with ``generator``: reproducible
for a seeded generator, but not HF's random stream. With a graph, the graph draws from the generator
registered at capture (``CUDAGraph.register_generator_state``).

Left-padded batches (``attention_mask``) run on the fused step only: HF's prefill with the mask, then
``decode_attention`` skipping each row's pads (``key_starts``). Not supported: right padding, padded
batches on the model's forward, beam search, repetition penalties, stop strings. CPU models (and ``cuda_graph=False``)
run the same step in a Python loop without a graph; on CPU this is announced once (KF_STRICT=1: an
error). Sliding-window layers whose window is shorter than prompt + max_new_tokens roll their cache
with host-side state that a graph cannot replay: they run without a graph, announced (as do caches with
other layers than transformers' StaticLayer, e.g. chunked attention).
"""

from __future__ import annotations

import contextlib
import functools
import weakref
from dataclasses import dataclass

import torch

from .decode_step import DecodeStep, decode_step, unsupported_reason, weights_fingerprint
from .patch._registry import STATE_ATTR
from .patch._runtime import announce_fallback

EOS_CHECK_EVERY = 16  # decode steps between two host reads of "every sequence has ended"
# fused_step=None takes the fused decode step for the models it supports: the Llama-1B-shaped model
# generates 933 tokens/s at batch 1 with it (and the fused prefill), 570 through the patched forward (H200,
# prompt 512 + 128).
FUSED_STEP_BY_DEFAULT = True
# With the fused step, the prompt's forward through DecodeStep.prefill (the step's fused layers over the S
# prompt rows, causal attention) instead of the model's forward, for prompts without padding. A call that
# generates one token after a 512-token prompt (dev/prof_generate.py, H200, Llama-1B shape): 12.9 ms wall
# against the patched forward's 24.6 at batch 1, 29.3 against 32.4 at batch 16.
FUSED_PREFILL = True

# model -> {(batch size, cache length): _Loop}; an entry dies with its model
_GRAPHS: "weakref.WeakKeyDictionary[torch.nn.Module, dict]" = weakref.WeakKeyDictionary()


@dataclass(frozen=True)
class _Sampler:
    do_sample: bool
    temperature: float
    top_k: int
    eos: tuple  # token ids that end a sequence; () ignores them
    pad: int  # the token a sequence emits after it ended


@dataclass
class _Loop:
    """The decode step's state: every tensor the step reads or writes lives here at a fixed address
    (a captured graph replays on these addresses)."""
    cache: object  # transformers StaticCache
    tokens: torch.Tensor  # int64 [B, 1]: the token the next step reads
    positions: torch.Tensor  # int64 [B, 1]: its position
    step: torch.Tensor  # int64 [1]: the column of ``out`` the next step writes
    out: torch.Tensor  # int64 [B, cache length]: the new tokens, column 0 the prefill's
    finished: torch.Tensor  # bool [B]: the sequence emitted an end-of-sequence token
    eos: torch.Tensor  # int64 [E]
    sampler: _Sampler
    generator: torch.Generator | None
    fingerprint: tuple
    graph: torch.cuda.CUDAGraph | None = None
    fused: DecodeStep | None = None  # the fused decode step, None: the model's forward
    seq_lens: torch.Tensor | None = None  # int32 [B]: keys held after the next step's append (fused step)
    kv: list | None = None  # the fused step's [B, L, Hkv, D] views of the cache layers (set after the prefill)
    rope: tuple | None = None  # the fused step's cos, sin [L, D]
    key_starts: torch.Tensor | None = None  # int32 [B]: left padding, the pad rows at the head of each cache row


def generate(model: torch.nn.Module, input_ids: torch.Tensor, max_new_tokens: int, *, do_sample: bool = False,
             temperature: float = 1.0, top_k: int | None = None, generator: torch.Generator | None = None,
             eos_token_id: int | list[int] | None = None, ignore_eos: bool = False,
             cuda_graph: bool = True, fused_step: bool | DecodeStep | None = None,
             attention_mask: torch.Tensor | None = None) -> torch.Tensor:
    """Generate up to ``max_new_tokens`` tokens after ``input_ids`` (int [B, S]) with the transformers
    causal LM ``model``; returns int64 [B, S + n], the prompt then the n new tokens (n < max_new_tokens
    when every sequence ended, as HF generate).

    ``attention_mask`` (int or bool [B, S], HF's): prompts of different lengths, left-padded (each row's
    zeros before its ones, at least one 1). The pads sit at the head of each row's cache; the fused step's
    ``decode_attention`` skips them (``key_starts``) and the positions count from each row's first token,
    as HF's. Padded batches need the fused decode step (ValueError otherwise); an all-ones mask is no
    padding.

    Greedy by default; ``do_sample=True`` samples from softmax(logits / ``temperature``) restricted
    to the ``top_k`` most likely tokens (None or 0: all), with ``generator`` (on the model's device;
    None: torch's default generator). ``eos_token_id``: the tokens that end a sequence (None: the
    model's generation_config); ``ignore_eos=True`` always generates max_new_tokens. ``cuda_graph``:
    capture the decode step into a CUDA graph (CUDA models); False runs the same loop eagerly.
    ``fused_step``: the decode step written with kernelforge ops (``decode_step.DecodeStep``: one q/k/v
    GEMM, one gate/up GEMM, fused residual norms, 10 kernels per layer) instead of the model's forward;
    None uses it when the model is supported (Llama / Mistral / Qwen2, see ``decode_step``; a padded
    ``attention_mask`` requires it) and otherwise announces the model's forward (KF_STRICT=1: an error;
    ``FUSED_STEP_BY_DEFAULT`` unset: the forward, silently); True requires it (ValueError when unsupported);
    False runs the model's forward; a ``DecodeStep`` of this model runs that one (its linear options).
    """
    B, S, device = _check_args(model, input_ids, max_new_tokens, do_sample, temperature, top_k, generator)
    pads = _left_pads(attention_mask, B, S)  # int64 [B] on the CPU, or None: no padding
    if max_new_tokens == 0:
        return input_ids.to(torch.int64).clone()
    sampler = _sampler(model, do_sample, temperature, top_k, eos_token_id, ignore_eos)
    cache_len = S + max_new_tokens
    if pads is not None and fused_step is not False and (why := unsupported_reason(model, cache_len)) is not None:
        raise ValueError(f"generate: a padded attention_mask needs the fused decode step (Llama / Mistral / Qwen2), "
                         f"which cannot run this model: {why}")
    if pads is not None and fused_step is False:
        raise ValueError("generate: a padded attention_mask needs the fused decode step; fused_step=False runs "
                         "the model's forward, which takes no padding here")
    step = _fused_step(model, True if pads is not None and fused_step is None else fused_step, cache_len)
    use_graph = cuda_graph and _graph_possible(model, device, cache_len)
    # the model's device current: the side stream, the capture stream and the replays must be on its device
    # (a model on cuda:1 with cuda:0 current would run its kernels outside the capture)
    on_device = torch.cuda.device(device) if device.type == "cuda" else contextlib.nullcontext()
    with torch.no_grad(), on_device:
        loop = _loop(model, B, cache_len, device, sampler, generator, use_graph, step, pads is not None)
        if pads is None and step is not None and FUSED_PREFILL:
            if loop.kv is None:
                loop.kv = step.caches(_allocated(loop.cache, step, B, device))
            logits = step.prefill(input_ids.to(device, torch.int64), loop.kv, *loop.rope)
        elif pads is None:
            logits = _forward(model, input_ids.to(device, torch.int64), _arange_positions(B, S, device), loop.cache)
        else:  # HF's prefill of a left-padded batch: its mask, positions counted from each row's first token
            mask = attention_mask.to(device, torch.int64)
            logits = _forward(model, input_ids.to(device, torch.int64), (mask.cumsum(1) - 1).clamp_min(0), loop.cache,
                              mask)
            loop.key_starts.copy_(pads.to(device, torch.int32))
        if step is not None and loop.kv is None:
            loop.kv = step.caches(loop.cache)  # the prefill allocated the layers' tensors
        _start(loop, logits, S)
        steps = 1
        if use_graph and loop.graph is None and steps < max_new_tokens:
            _warm_up_and_capture(model, loop)  # runs one real step, then records the step (not run)
            steps += 1
        while steps < max_new_tokens:
            for _ in range(min(EOS_CHECK_EVERY, max_new_tokens - steps)):
                if loop.graph is not None:
                    loop.graph.replay()
                else:
                    _step(model, loop)
                steps += 1
            if sampler.eos and bool(loop.finished.all()):  # the loop's one host synchronization
                break
        new = loop.out[:, :steps].clone()
    return torch.cat([input_ids.to(device, torch.int64), new[:, :_length(new, sampler)]], dim=1)


# ---- arguments ----------------------------------------------------------------------------------------------


def _check_args(model, input_ids, max_new_tokens, do_sample, temperature, top_k, generator):
    if not isinstance(model, torch.nn.Module) or not hasattr(model, "config"):
        raise TypeError(f"generate: model must be a transformers causal LM (a torch.nn.Module with a config), "
                        f"got {type(model).__name__}")
    if not isinstance(input_ids, torch.Tensor) or input_ids.dim() != 2 or input_ids.is_floating_point() \
            or input_ids.is_complex() or input_ids.dtype == torch.bool:
        what = (f"a {input_ids.dim()}-D {input_ids.dtype} tensor" if isinstance(input_ids, torch.Tensor)
                else type(input_ids).__name__)
        raise ValueError(f"generate: input_ids must be a 2-D integer tensor [batch, prompt length], got {what}")
    if input_ids.shape[0] < 1 or input_ids.shape[1] < 1:
        raise ValueError(f"generate: input_ids must hold at least one token per row and one row, got shape "
                         f"{list(input_ids.shape)}")
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 0:
        raise ValueError(f"generate: max_new_tokens must be an int >= 0, got {max_new_tokens!r}")
    if do_sample and (isinstance(temperature, bool) or not isinstance(temperature, (int, float))
                      or not temperature > 0):
        raise ValueError(f"generate: temperature must be a number > 0 with do_sample=True, got {temperature!r}")
    if top_k is not None and (isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 0):
        raise ValueError(f"generate: top_k must be None or an int >= 0 (0: no restriction), got {top_k!r}")
    try:
        device = next(model.parameters()).device
    except StopIteration:
        raise ValueError("generate: model has no parameters to take the device from") from None
    if generator is not None:
        if not isinstance(generator, torch.Generator):
            raise TypeError(f"generate: generator must be a torch.Generator, got {type(generator).__name__}")
        if generator.device.type != device.type:
            raise ValueError(f"generate: generator must be on the model's device ({device.type}), got a "
                             f"{generator.device.type} generator")
    vocab = getattr(model.config.get_text_config(decoder=True), "vocab_size", None)
    if top_k is not None and vocab is not None and top_k > vocab:
        raise ValueError(f"generate: top_k must be at most the vocabulary size {vocab}, got {top_k}")
    return input_ids.shape[0], input_ids.shape[1], device


def _left_pads(attention_mask, B: int, S: int) -> torch.Tensor | None:
    """The pad count of each row of a left-padded HF attention mask (int64 [B], CPU), None without padding.
    Reads the mask on the host (an argument, before the loop)."""
    if attention_mask is None:
        return None
    if not isinstance(attention_mask, torch.Tensor) or tuple(attention_mask.shape) != (B, S) \
            or attention_mask.is_floating_point() or attention_mask.is_complex():
        what = (f"a {attention_mask.dtype} tensor of shape {list(attention_mask.shape)}"
                if isinstance(attention_mask, torch.Tensor) else type(attention_mask).__name__)
        raise ValueError(f"generate: attention_mask must be an int or bool tensor of input_ids' shape [{B}, {S}], "
                         f"got {what}")
    m = attention_mask.detach().to("cpu", torch.int64)
    if ((m != 0) & (m != 1)).any():
        raise ValueError("generate: attention_mask must hold 0 (pad) and 1 (token) only")
    if (m[:, 1:] < m[:, :-1]).any():
        b = int((m[:, 1:] < m[:, :-1]).any(dim=1).nonzero()[0, 0])
        raise ValueError(f"generate: attention_mask row {b} has a pad after a token; only left padding (each row's "
                         f"zeros before its ones) is supported")
    pads = (m == 0).sum(dim=1)
    if (pads == S).any():
        raise ValueError(f"generate: attention_mask row {int((pads == S).nonzero()[0, 0])} holds no token")
    return pads if bool(pads.any()) else None


def _sampler(model, do_sample, temperature, top_k, eos_token_id, ignore_eos) -> _Sampler:
    gen_cfg = getattr(model, "generation_config", None)
    eos = eos_token_id if eos_token_id is not None else getattr(gen_cfg, "eos_token_id", None)
    eos = () if ignore_eos or eos is None else tuple(int(e) for e in (eos if isinstance(eos, (list, tuple)) else [eos]))
    pad = getattr(gen_cfg, "pad_token_id", None)
    pad = int(pad) if pad is not None else (eos[0] if eos else 0)  # HF: the pad token defaults to the first eos
    return _Sampler(bool(do_sample), float(temperature) if do_sample else 1.0, int(top_k or 0) if do_sample else 0,
                    eos, pad)


# ---- the loop's parts -----------------------------------------------------------------------------------------


def _graph_possible(model, device: torch.device, cache_len: int) -> bool:
    """Whether the decode step can be captured; False after announcing why (CPU models, rolling caches)."""
    if device.type != "cuda":
        announce_fallback("kernelforge.generate", f"a model on {device.type}",
                          "decode loop without CUDA graph capture",
                          "CUDA graphs need a CUDA model; pass cuda_graph=False to ask for the eager loop.", 4)
        return False
    window = _short_window(model, cache_len)
    if window is not None:
        announce_fallback("kernelforge.generate", f"a sliding window of {window} tokens shorter than prompt + "
                          f"max_new_tokens = {cache_len} (the static cache rolls with host-side state)",
                          "decode loop without CUDA graph capture",
                          "Generate at most the window's length to capture the step.", 4)
        return False
    other = _host_state_layers(model, cache_len)
    if other:
        announce_fallback("kernelforge.generate", f"static cache layers {', '.join(other)} (their update keeps "
                          f"host-side state that a graph replay would not update)",
                          "decode loop without CUDA graph capture",
                          "Models whose static cache has only full attention layers capture the step.", 4)
        return False
    return True


def _fused_step(model, fused_step, cache_len: int) -> DecodeStep | None:
    """The fused decode step to run, or None for the model's forward (announced when fused_step is None
    and the model is not supported)."""
    if fused_step is False:
        return None
    if isinstance(fused_step, DecodeStep):
        if fused_step.model() is not model:
            raise ValueError("generate: fused_step must be a DecodeStep built from this model")
        why = unsupported_reason(model, cache_len)
        if why is None and fused_step.fingerprint != weights_fingerprint(model):
            why = "parameters or buffers replaced since the DecodeStep was built"
        if why is not None:
            raise ValueError(f"generate: the DecodeStep passed as fused_step cannot run: {why}")
        return fused_step
    if fused_step is not None and fused_step is not True:
        raise TypeError(f"generate: fused_step must be None, a bool or a DecodeStep, got {type(fused_step).__name__}")
    if fused_step is None and not FUSED_STEP_BY_DEFAULT:
        return None
    why = unsupported_reason(model, cache_len)
    if why is None:
        return decode_step(model)
    if fused_step:
        raise ValueError(f"generate: fused_step=True needs a model the fused decode step supports, got {why}")
    announce_fallback("kernelforge.generate", why, "decode step (the model's forward of one token)",
                      "The fused decode step takes Llama / Mistral / Qwen2 causal LMs (decode_step.py); "
                      "fused_step=False chooses the model's forward without this notice.", 4)
    return None


def _text_config(model):
    return model.config.get_text_config(decoder=True)


def _short_window(model, cache_len: int) -> int | None:
    """The sliding window of the model's sliding layers when it is shorter than the cache, else None."""
    cfg = _text_config(model)
    window = getattr(cfg, "sliding_window", None)
    types = getattr(cfg, "layer_types", None)
    sliding = window is not None and (types is None or "sliding_attention" in types)
    return int(window) if sliding and window < cache_len else None


def _host_state_layers(model, cache_len: int) -> list[str]:
    """The static cache's layer classes other than StaticLayer (whose length is a device tensor), e.g.
    chunked-attention layers (StaticSlidingWindowLayer with a chunk shorter than the cache): their
    update counts on the host, which a replay does not repeat."""
    from transformers.cache_utils import StaticLayer  # noqa: PLC0415

    layers = _new_cache(model, cache_len).layers
    return sorted({type(layer).__name__ for layer in layers if type(layer) is not StaticLayer})


def _new_cache(model, cache_len: int):
    """transformers' StaticCache of cache_len rows. Sliding layers whose window covers the whole cache
    never drop a key: they become full StaticLayers, whose length is a device tensor (a sliding
    layer counts on the host, which a graph replay would not update)."""
    from transformers import StaticCache  # noqa: PLC0415
    from transformers.cache_utils import StaticLayer, StaticSlidingWindowLayer  # noqa: PLC0415

    cache = StaticCache(config=model.config, max_cache_len=cache_len)
    for i, layer in enumerate(cache.layers):
        if type(layer) is StaticSlidingWindowLayer and layer.max_cache_len >= cache_len:
            cache.layers[i] = StaticLayer(max_cache_len=cache_len)
    return cache


def _fingerprint(model, sampler: _Sampler, step: DecodeStep | None) -> tuple:
    """What a captured graph depends on besides the shapes and the generator: the weights and buffers
    (``weights_fingerprint``: addresses, dtypes, shapes; the fused step's concatenated weights are the
    parameters' own storage, so they are covered), the attention implementation, which modules kf.patch
    replaced, the sampling, and the decode step (the model's forward, or a fused step with its linear
    options; ``_loop`` also requires the same step object)."""
    patched = tuple(name for name, m in model.named_modules() if STATE_ATTR in m.__dict__)
    impl = getattr(model.config, "_attn_implementation", None)
    return (weights_fingerprint(model), patched, impl, sampler, None if step is None else step.options)


def _loop(model, B: int, cache_len: int, device, sampler: _Sampler, generator, use_graph: bool,
          step: DecodeStep | None, padded: bool = False) -> _Loop:
    """The cached loop of (B, cache_len, padded) when its graph still applies (its cache emptied, ready for
    a prefill), else a new one (kept for the next call when it will hold a graph)."""
    fingerprint = _fingerprint(model, sampler, step) if use_graph else None
    key = (B, cache_len, padded)
    if use_graph:
        loop = _GRAPHS.get(model, {}).get(key)
        if (loop is not None and loop.fingerprint == fingerprint and loop.generator is generator
                and loop.fused is step):
            loop.cache.reset()
            loop.finished.zero_()
            return loop
    i64 = dict(dtype=torch.int64, device=device)
    loop = _Loop(cache=_new_cache(model, cache_len), tokens=torch.zeros(B, 1, **i64),
                 positions=torch.zeros(B, 1, **i64), step=torch.zeros(1, **i64), out=torch.zeros(B, cache_len, **i64),
                 finished=torch.zeros(B, dtype=torch.bool, device=device),
                 eos=torch.tensor(sampler.eos or (-1,), **i64), sampler=sampler, generator=generator,
                 fingerprint=fingerprint)
    if step is not None:
        loop.fused, loop.rope = step, step.rope_table(cache_len)
        loop.seq_lens = torch.zeros(B, dtype=torch.int32, device=device)
        if padded:
            loop.key_starts = torch.zeros(B, dtype=torch.int32, device=device)
    if use_graph:
        _GRAPHS.setdefault(model, {})[key] = loop  # replaces a loop whose graph no longer applies
    return loop


def _allocated(cache, step: DecodeStep, B: int, device):
    """The static cache with its layers' tensors allocated (zeros, the model's dtype), as a transformers
    prefill leaves them: what ``DecodeStep.prefill`` writes into."""
    if not all(getattr(layer, "is_initialized", False) for layer in cache.layers):
        cache.early_initialization(B, step.n_kv, step.head_dim, step.embed.dtype, device)
    return cache


def _arange_positions(B: int, S: int, device) -> torch.Tensor:
    return torch.arange(S, device=device).expand(B, S)


def _forward(model, ids, positions, cache, attention_mask=None) -> torch.Tensor:
    """The last position's logits [B, V] of one forward through the static cache. No attention mask but
    a padded prefill's: every sequence holds the same keys, which the cache counts (the mask functions
    read its length)."""
    kw = {} if attention_mask is None else {"attention_mask": attention_mask}
    out = model(input_ids=ids, position_ids=positions, past_key_values=cache, use_cache=True, logits_to_keep=1, **kw)
    return out.logits[:, -1]


def _pick(logits: torch.Tensor, sampler: _Sampler, generator) -> torch.Tensor:
    """The next token [B] int64 from logits [B, V]: argmax, or a sample (temperature, top-k, then the
    exponential race argmax(p_i / E_i), E_i ~ Exp(1), which draws token i with probability p_i: no
    normalization, no host synchronization, graph-safe)."""
    if not sampler.do_sample:
        return _argmax(logits)
    scores = logits.float() / sampler.temperature
    if sampler.top_k:
        kth = torch.topk(scores, sampler.top_k, dim=-1).values[:, -1:]
        scores = scores.masked_fill(scores < kth, float("-inf"))
    race = torch.empty_like(scores).exponential_(generator=generator)
    race.clamp_min_(torch.finfo(race.dtype).tiny)  # a draw of exactly 0 would win whatever its logit
    return _argmax(scores - race.log())


@functools.lru_cache(maxsize=None)
def _argmax_chunk(V: int) -> int:
    """The chunk width W of _argmax for a vocabulary of V: the smallest W in [256, 4096] dividing V into 64 to
    1024 chunks (128256: 501 chunks of 256), or 0 when none does."""
    return next((w for w in range(256, 4097) if V % w == 0 and 64 <= V // w <= 1024), 0)


def _argmax(x: torch.Tensor) -> torch.Tensor:
    """argmax over the last dim of [B, V], the first index of the maximum as torch.argmax gives it, in two
    passes over chunks of W columns (W divides V, V / W chunks in [64, 1024]): each chunk's maximum and its
    first index, then the first chunk holding the largest. One argmax over a 128256-wide row is one long
    reduction per row (36 µs on the H200 at batch 1); the chunked one spreads it over V / W rows."""
    V = x.shape[-1]
    W = _argmax_chunk(V)
    if W == 0 or x.dim() != 2:
        return x.argmax(dim=-1)
    vals, idx = x.view(x.shape[0], V // W, W).max(dim=-1)  # [B, C]: each chunk's first maximum
    chunk = vals.argmax(dim=-1, keepdim=True)  # [B, 1]: the first chunk with the largest
    return (chunk * W + idx.gather(-1, chunk)).squeeze(-1)


def _record(loop: _Loop, token: torch.Tensor) -> None:
    """Stores the new tokens [B] (pad for sequences that had ended) and prepares the next step's
    inputs, all in place."""
    if loop.sampler.eos:
        token = torch.where(loop.finished, loop.sampler.pad, token)
        loop.finished |= (token.unsqueeze(1) == loop.eos).any(dim=1)
    loop.out.index_copy_(1, loop.step, token.unsqueeze(1))
    loop.tokens.copy_(token.unsqueeze(1))
    loop.positions.add_(1)
    loop.step.add_(1)
    if loop.seq_lens is not None:
        loop.seq_lens.add_(1)


def _start(loop: _Loop, logits: torch.Tensor, prompt_len: int) -> None:
    """The prefill's token: out column 0; the first decode step reads it at position prompt_len."""
    loop.step.zero_()
    loop.positions.fill_(prompt_len - 1)
    if loop.key_starts is not None:  # left padding: positions count from each row's first token
        loop.positions.sub_(loop.key_starts.view(-1, 1))
    if loop.seq_lens is not None:
        loop.seq_lens.fill_(prompt_len)  # the first step appends its key as row prompt_len: prompt_len + 1 held
    _record(loop, _pick(logits, loop.sampler, loop.generator))


def _step(model, loop: _Loop) -> None:
    """One decode step, on fixed buffers only (what the graph records): the fused step, or the model's
    forward."""
    if loop.fused is not None:
        logits = loop.fused(loop.tokens, loop.positions, loop.seq_lens, loop.kv, *loop.rope, key_starts=loop.key_starts)
    else:
        logits = _forward(model, loop.tokens, loop.positions, loop.cache)
    _record(loop, _pick(logits, loop.sampler, loop.generator))


def _warm_up_and_capture(model, loop: _Loop) -> None:
    """Runs one decode step eagerly on a side stream (lazy initializations: library handles, kernel
    plans, allocations), then records the step into ``loop.graph`` (recording runs nothing: the next
    step is the first replay)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        _step(model, loop)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    if loop.generator is not None:
        graph.register_generator_state(loop.generator)
    try:
        with torch.cuda.graph(graph):
            _step(model, loop)
    except RuntimeError as e:
        _GRAPHS.get(model, {}).pop((loop.tokens.shape[0], loop.out.shape[1], loop.key_starts is not None), None)
        raise RuntimeError(f"generate: capturing the decode step of {type(model).__name__} into a CUDA graph failed "
                           f"({e}); pass cuda_graph=False to run the loop without a graph") from e
    loop.graph = graph


def _length(new: torch.Tensor, sampler: _Sampler) -> int:
    """How many of the generated columns HF generate returns: all, unless every sequence emitted an
    end-of-sequence token, then up to the step at which the last one did."""
    if not sampler.eos:
        return new.shape[1]
    ended = torch.isin(new, torch.tensor(sampler.eos, device=new.device))
    if not bool(ended.any(dim=1).all()):
        return new.shape[1]
    return int(ended.int().argmax(dim=1).max()) + 1


__all__ = ["generate", "EOS_CHECK_EVERY"]
