"""kernelforge.generate: the static-cache generation loop (CUDA: the decode step in one CUDA graph).

CPU (float32, tiny random Llama / Qwen2 / Mistral): greedy tokens equal HF generate's exactly, unpatched
and patched (the patched model's decode steps run decode_attention with the static cache's key counts),
end-of-sequence handling as HF's, sampling reproducible with a seeded generator, argument errors, the
announced eager loop. CUDA: the graph replays what the eager loop computes (bit for bit), a second call
replays the same graph, the patched model's graph holds decode_attention, HF's first tokens in bf16.
"""

from __future__ import annotations

import importlib
import warnings

import pytest
import torch

transformers = pytest.importorskip("transformers")

# the CPU loop's announcement and TINY's (head dim 16: the model's forward instead of the fused decode step),
# both tested in test_zero_new_tokens_and_announced_eager_loop
pytestmark = [pytest.mark.filterwarnings("ignore:kernelforge. kernelforge.generate called with a model on cpu"),
              pytest.mark.filterwarnings("ignore:kernelforge. kernelforge.generate called with head dim 16")]

ARCHS = ["llama", "qwen2", "mistral"]
# hidden 64 with 4 heads of 16 (HF identity, unpatched); head_dim 64 for the patched model (the kernels' smallest)
TINY = dict(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2)
TINY_KERNEL = dict(TINY, num_attention_heads=2, num_key_value_heads=1, head_dim=64)


def tiny_model(arch, device="cpu", dtype=torch.float32, **cfg):
    cfg = dict(TINY, **cfg)
    cls = {"llama": (transformers.LlamaForCausalLM, transformers.LlamaConfig),
           "qwen2": (transformers.Qwen2ForCausalLM, transformers.Qwen2Config),
           "mistral": (transformers.MistralForCausalLM, transformers.MistralConfig)}[arch]
    torch.manual_seed(0)
    return cls[0](cls[1](**cfg)).to(device, dtype).eval()


def prompt(batch, length, device="cpu", seed=1):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(3, TINY["vocab_size"], (batch, length), generator=g).to(device)  # no bos / eos / pad ids


def hf_generate(model, ids, n, **kw):
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")  # HF's "no attention mask" notice: the batch has no padding
        return model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, do_sample=False, **kw)


@pytest.fixture
def gen():
    return importlib.import_module("kernelforge.generate")


@pytest.fixture
def fresh_warnings(monkeypatch):
    """The announced CPU loop: warned once per test, not an error (KF_STRICT unset)."""
    monkeypatch.delenv("KF_STRICT", raising=False)
    monkeypatch.setattr(importlib.import_module("kernelforge.patch._runtime"), "warned", set())


@pytest.fixture
def decode_calls(monkeypatch):
    """The q shapes and seq_lens of every kernelforge.decode_attention call."""
    dec = importlib.import_module("kernelforge.decode")
    calls, real = [], dec.decode_attention

    def spy(q, k_cache, v_cache, seq_lens, *args, **kw):
        calls.append((tuple(q.shape), seq_lens.clone()))  # the fused step's seq_lens is one buffer, updated
        return real(q, k_cache, v_cache, seq_lens, *args, **kw)

    monkeypatch.setattr(dec, "decode_attention", spy)
    return calls


# ---- CPU -------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("arch", ARCHS)
def test_greedy_equals_hf_generate(kf, fresh_warnings, arch):
    model = tiny_model(arch)
    ids = prompt(2, 7)
    want = hf_generate(model, ids, 12)
    got = kf.generate(model, ids, 12, ignore_eos=False)
    assert torch.equal(got, want)


@pytest.mark.parametrize("fused", [False, True])
@pytest.mark.parametrize("arch", ARCHS)
def test_patched_decode_steps_take_decode_attention(kf, fresh_warnings, decode_calls, arch, fused):
    """The patched model on the static cache: each decode step runs decode_attention with seq_lens =
    the keys held (prompt + tokens so far), the 7-row prefill too (7 new rows of 7 keys); the tokens
    equal the unpatched model's. A 20-row prefill runs the varlen kernel over the held keys. The same
    with the fused decode step (its own decode_attention calls; its fused prefill runs causal attention over
    the prompt, no decode_attention)."""
    model = tiny_model(arch, **TINY_KERNEL)
    for length in (7, 20):
        ids = prompt(2, length)
        want = hf_generate(model, ids, 6)
        kf.patch(model)
        decode_calls.clear()
        got = kf.generate(model, ids, 6, fused_step=fused)
        kf.unpatch(model)
        assert torch.equal(got, want)
        decode = [c for c in decode_calls if c[0][1] == 1]
        assert len(decode) == 5 * 2  # 5 decode steps after the prefill, 2 layers
        assert [int(c[1][0]) for c in decode[::2]] == [length + 1 + i for i in range(5)]
        assert len(decode_calls) == len(decode) + (2 if length <= 16 and not fused else 0)


def test_sliding_window_shorter_than_the_cache(kf, fresh_warnings):
    """Mistral with a 5-token window: the static cache rolls; the loop (no graph) still equals HF's."""
    model = tiny_model("mistral", sliding_window=5)
    ids = prompt(2, 7)
    assert torch.equal(kf.generate(model, ids, 8), hf_generate(model, ids, 8))


@pytest.mark.parametrize("which", ["one", "all"])
def test_end_of_sequence_as_hf(kf, fresh_warnings, which):
    """A sequence that emits an eos token continues with the pad token; when every sequence has
    ended the output stops there, as HF generate's."""
    model = tiny_model("llama")
    ids = prompt(2, 7)
    free = kf.generate(model, ids, 10, ignore_eos=True)[:, 7:]
    if which == "one":
        eos = int(free[0, 3])  # row 0 ends at step 3 at the latest
    else:
        common = set(free[0].tolist()) & set(free[1].tolist())
        if not common:
            pytest.skip("the two rows share no token to end both")
        eos = common.pop()
    want = hf_generate(model, ids, 10, eos_token_id=eos, pad_token_id=5)
    got = kf.generate(model, ids, 10, eos_token_id=eos)
    model.generation_config.pad_token_id = 5
    got_pad = kf.generate(model, ids, 10, eos_token_id=eos)
    assert got_pad.shape == want.shape and torch.equal(got_pad, want)
    assert got.shape == want.shape  # pad defaults to the eos token (HF's default too)
    if which == "all":
        assert want.shape[1] < 17


def test_sampling_reproducible(kf, fresh_warnings):
    model = tiny_model("llama")
    ids = prompt(3, 5)
    runs = [kf.generate(model, ids, 10, do_sample=True, temperature=0.8, top_k=20,
                        generator=torch.Generator().manual_seed(s), ignore_eos=True) for s in (7, 7, 8)]
    assert torch.equal(runs[0], runs[1])
    assert not torch.equal(runs[0], runs[2])
    assert runs[0].shape == (3, 15) and int(runs[0].max()) < TINY["vocab_size"]
    top1 = kf.generate(model, ids, 10, do_sample=True, top_k=1, generator=torch.Generator().manual_seed(0),
                       ignore_eos=True)
    assert torch.equal(top1, kf.generate(model, ids, 10, ignore_eos=True))  # top-1 sampling is greedy


def test_sampling_distribution(gen):
    """The exponential race draws token i with probability softmax(logits / T)_i (top-k: renormalized
    over the k largest)."""
    logits = torch.tensor([[2.0, 1.0, 0.0, -1.0]]).expand(40000, 4)
    g = torch.Generator().manual_seed(0)
    for top_k, temperature in ((0, 1.0), (2, 0.5)):
        s = gen._Sampler(True, temperature, top_k, (), 0)
        freq = torch.bincount(gen._pick(logits, s, g), minlength=4).double() / logits.shape[0]
        p = torch.softmax(logits[0].double() / temperature, 0)
        if top_k:
            p[top_k:] = 0
            p /= p.sum()
        assert (freq - p).abs().max() < 0.01, (freq, p)


def test_zero_new_tokens_and_announced_eager_loop(kf, fresh_warnings, monkeypatch):
    monkeypatch.setattr(importlib.import_module("kernelforge.generate"), "FUSED_STEP_BY_DEFAULT", True)
    model = tiny_model("llama")
    ids = prompt(1, 4)
    assert torch.equal(kf.generate(model, ids, 0), ids)
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        kf.generate(model, ids, 2)
        kf.generate(model, ids, 2)
        kf.generate(model, ids, 2, cuda_graph=False)
    msgs = [str(x.message) for x in w if "kernelforge.generate" in str(x.message)]
    assert len([m for m in msgs if "without CUDA graph" in m]) == 1
    # TINY's head dim 16 is not decode_attention's: the model's forward, announced once too
    assert len([m for m in msgs if "head dim 16" in m and "fused_step=False" in m]) == 1 and len(msgs) == 2


def test_strict_makes_the_cpu_loop_an_error(kf, fresh_warnings, monkeypatch):
    monkeypatch.setenv("KF_STRICT", "1")
    model = tiny_model("llama")
    with pytest.raises(RuntimeError, match="KF_STRICT"):
        kf.generate(model, prompt(1, 4), 2)
    assert kf.generate(model, prompt(1, 4), 2, cuda_graph=False, fused_step=False).shape == (1, 6)


@pytest.mark.parametrize("bad,match", [
    (dict(max_new_tokens=-1), "max_new_tokens must be an int >= 0"),
    (dict(max_new_tokens=2.0), "max_new_tokens must be an int >= 0"),
    (dict(input_ids=torch.zeros(5, dtype=torch.long)), "input_ids must be a 2-D integer tensor"),
    (dict(input_ids=torch.zeros(1, 5)), r"input_ids must be a 2-D integer tensor .*float32"),
    (dict(input_ids=torch.zeros(1, 0, dtype=torch.long)), "at least one token"),
    (dict(do_sample=True, temperature=0.0), "temperature must be a number > 0"),
    (dict(do_sample=True, top_k=-2), "top_k must be None or an int >= 0"),
    (dict(do_sample=True, top_k=10**6), "top_k must be at most the vocabulary size"),
    (dict(generator=3), "generator must be a torch.Generator"),
])
def test_bad_arguments(kf, bad, match):
    model = tiny_model("llama")
    args = dict(input_ids=prompt(1, 4), max_new_tokens=3)
    args.update(bad)
    with pytest.raises((ValueError, TypeError), match=match):
        kf.generate(model, **args)


def test_bad_model(kf):
    with pytest.raises(TypeError, match="model must be a transformers causal LM"):
        kf.generate(torch.nn.Linear(2, 2), prompt(1, 4), 3)


# ---- CUDA --------------------------------------------------------------------------------------------------------


@pytest.mark.cuda
@pytest.mark.parametrize("arch", ARCHS)
def test_cuda_graph_replays_the_eager_loop(kf, gen, arch):
    """bf16: the graph's tokens equal the eager loop's bit for bit; the first new token equals HF
    generate's where HF's two best logits are apart by more than bf16 rounding can move them; a
    second call (another prompt of the same shape) replays the same graph."""
    model = tiny_model(arch, "cuda", torch.bfloat16)
    ids = prompt(2, 9, "cuda")
    got = kf.generate(model, ids, 16, ignore_eos=True)
    loop = gen._GRAPHS[model][(2, 25, False)]
    graph = loop.graph
    assert graph is not None
    assert torch.equal(got, kf.generate(model, ids, 16, ignore_eos=True, cuda_graph=False))
    with torch.no_grad():
        top2 = model(ids).logits[:, -1].float().topk(2, dim=-1).values
    clear = (top2[:, 0] - top2[:, 1]) > 0.05 * top2[:, 0].abs().clamp_min(1.0)
    assert torch.equal(got[clear, :10], hf_generate(model, ids, 1)[clear])
    ids2 = prompt(2, 9, "cuda", seed=2)
    got2 = kf.generate(model, ids2, 16, ignore_eos=True)
    assert gen._GRAPHS[model][(2, 25, False)] is loop and loop.graph is graph
    assert torch.equal(got2, kf.generate(model, ids2, 16, ignore_eos=True, cuda_graph=False))


@pytest.mark.cuda
@pytest.mark.parametrize("arch", ARCHS)
def test_cuda_float32_equals_hf_generate(kf, arch):
    model = tiny_model(arch, "cuda", torch.float32)
    ids = prompt(2, 7, "cuda")
    assert torch.equal(kf.generate(model, ids, 12), hf_generate(model, ids, 12))


@pytest.mark.cuda
@pytest.mark.parametrize("fused", [False, True])
@pytest.mark.parametrize("arch", ARCHS)
def test_cuda_graph_patched_holds_decode_attention(kf, gen, decode_calls, arch, fused):
    """The patched model's captured step calls decode_attention (recorded once at capture, replayed
    per token): Python sees it at the prefill (9 rows), the warm-up step and the capture, 2 layers
    each; a second call only at its prefill. The tokens equal the patched eager loop's. The same with
    the fused decode step, whose fused prefill runs causal attention over the prompt instead."""
    model = tiny_model(arch, "cuda", torch.bfloat16, **TINY_KERNEL)
    kf.patch(model)
    ids = prompt(2, 9, "cuda")
    got = kf.generate(model, ids, 16, ignore_eos=True, fused_step=fused)
    prefill = [] if fused else [(2, 9, 2, 64)] * 2
    assert [c[0] for c in decode_calls] == prefill + [(2, 1, 2, 64)] * 4
    assert (gen._GRAPHS[model][(2, 25, False)].fused is not None) == fused
    decode_calls.clear()
    again = kf.generate(model, ids, 16, ignore_eos=True, fused_step=fused)
    assert [c[0] for c in decode_calls] == prefill
    assert torch.equal(again, got)
    assert torch.equal(got, kf.generate(model, ids, 16, ignore_eos=True, cuda_graph=False, fused_step=fused))
    kf.unpatch(model)
    assert gen._GRAPHS[model][(2, 25, False)].graph is not None


@pytest.mark.cuda
def test_cuda_graph_recaptured_after_unpatch(kf, gen):
    """A graph captured from the patched model is not replayed for the unpatched one."""
    model = tiny_model("llama", "cuda", torch.bfloat16, **TINY_KERNEL)
    ids = prompt(1, 9, "cuda")
    kf.patch(model)
    kf.generate(model, ids, 8, ignore_eos=True)  # the same sampling as below: only the patch state differs
    patched_loop = gen._GRAPHS[model][(1, 17, False)]
    kf.unpatch(model)
    got = kf.generate(model, ids, 8, ignore_eos=True)
    assert gen._GRAPHS[model][(1, 17, False)] is not patched_loop
    assert torch.equal(got, kf.generate(model, ids, 8, ignore_eos=True, cuda_graph=False))


@pytest.mark.cuda
def test_cuda_generator_on_another_device(kf):
    model = tiny_model("llama", "cuda", torch.bfloat16)
    with pytest.raises(ValueError, match="generator must be on the model's device"):
        kf.generate(model, prompt(1, 4, "cuda"), 3, do_sample=True, generator=torch.Generator())


@pytest.mark.cuda
def test_cuda_graph_sampling_with_generator(kf):
    """Sampling inside the graph with a CUDA generator: same seed, same tokens (replays), another
    seed other tokens; top-1 sampling is greedy. float32: bf16 logits tie at the top often enough that
    top-1 sampling (which keeps every tied token, as HF's top-k) could pick another than argmax's."""
    model = tiny_model("llama", "cuda", torch.float32)
    ids = prompt(2, 9, "cuda")
    g = torch.Generator(device="cuda")

    def run(seed, **kw):
        g.manual_seed(seed)
        return kf.generate(model, ids, 16, do_sample=True, temperature=0.9, generator=g, ignore_eos=True, **kw)

    first = run(3)
    assert torch.equal(run(3), run(3))
    assert not torch.equal(run(3), run(4))
    assert first.shape == (2, 25) and int(first.max()) < TINY["vocab_size"]
    g.manual_seed(0)
    top1 = kf.generate(model, ids, 16, do_sample=True, top_k=1, generator=g, ignore_eos=True)
    assert torch.equal(top1, kf.generate(model, ids, 16, ignore_eos=True))


def test_e2e_generate_providers():
    """`kforge e2e`: the generate providers run generation cases only and report tokens/s and the
    decode floor (weights + average KV bytes per step at the measured copy bandwidth)."""
    E = importlib.import_module("kernelforge.e2e")
    assert E.applies("llama_generate", "kernelforge_generate") and not E.applies("llama_train", "generate")
    assert E.applies("llama_generate", "kernelforge_generate_fused")
    assert not E.applies("llama_prefill", "kernelforge_generate_fused")
    for provider in ("generate", "kernelforge_generate", "kernelforge_generate_fused"):
        r = E.run_worker("llama_generate", provider, "small", "cpu", 1, 1)
        assert r["ms"] > 0 and r["tok_s"] > 0 and r["floor_ms"] > 0 and r["step_mb"] > 0
        assert (r["patched_modules"] > 0) == provider.startswith("kernelforge")
    assert any("decode floor" in line for line in E.table_lines([r]))


def test_bench_generate_alias():
    """`kforge bench generate` is `kforge e2e` over the three generation batches with HF's and kernelforge's
    generate; later arguments override its cases and providers."""
    cli = importlib.import_module("kernelforge.cli")
    args = cli.build_parser().parse_args(cli.expand_aliases(["bench", "generate", "--quick"]))
    assert args.cases == ["llama_generate", "llama_generate_b16", "llama_generate_b64"] and args.quick
    assert args.providers == ["eager", "compile", "generate", "kernelforge_generate_fused"]
    args = cli.build_parser().parse_args(cli.expand_aliases(["bench", "generate", "--cases", "llama_generate"]))
    assert args.cases == ["llama_generate"]
    assert cli.expand_aliases(["bench", "e2e", "--quick"]) == ["e2e", "--quick"]
    assert cli.expand_aliases(["bench", "rms_norm"]) == ["bench", "rms_norm"]
