"""End-to-end model steps with and without kernelforge, in one process (random weights, bf16).

Cases (--cases, comma separated):
  ltx      LTX-Video transformer denoising step: 28 blocks, hidden 2048 (32 heads x 64), 2688 video
           tokens (7 x 16 x 24 latents), 128 text tokens, CFG batch 2; forward only, no grad.
  llama    Llama-3.2-1B-shaped prefill: 16 layers, hidden 2048, 32/8 heads x 64, MLP 8192, vocab
           128256, batch 4 x 2048 tokens, logits of the last token; forward only, no grad.
  llama_train  the same model, one training step (forward + backward of the causal-LM loss), 4 x 2048.

Providers, timed in one process on the same weights:
  eager            the unpatched model
  compile          torch.compile of the unpatched model
  kf               kf.patch(model) (every family kernelforge has, attention included where it applies)
  kf_compile       torch.compile of the patched model

Each provider runs `--warmup` steps, then `--iters` timed steps (CUDA events, median); the report
prints ms per step and the speed-up over eager and over compile, and the patch report's summary.

  PYTHONPATH=python python3 dev/e2e.py [--cases ltx,llama] [--providers eager,compile,kf]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch


def timed(fn, warmup: int, iters: int) -> float:
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(iters):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    return statistics.median(times)


def ltx_case():
    from diffusers import LTXVideoTransformer3DModel

    torch.manual_seed(0)
    model = LTXVideoTransformer3DModel(num_layers=28).to("cuda", torch.bfloat16).eval()
    b, f, h, w, text = 2, 7, 16, 24, 128
    cfg = model.config
    inputs = dict(
        hidden_states=torch.randn(b, f * h * w, cfg.in_channels, device="cuda", dtype=torch.bfloat16),
        encoder_hidden_states=torch.randn(b, text, cfg.caption_channels, device="cuda", dtype=torch.bfloat16),
        timestep=torch.full((b,), 500, device="cuda", dtype=torch.long),
        encoder_attention_mask=torch.ones(b, text, device="cuda", dtype=torch.bool),
        num_frames=f,
        height=h,
        width=w,
        return_dict=False,
    )
    return model, (lambda m: m(**inputs)), False


def llama_model():
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(
        hidden_size=2048, intermediate_size=8192, num_hidden_layers=16, num_attention_heads=32,
        num_key_value_heads=8, head_dim=64, vocab_size=128256, max_position_embeddings=4096,
        rope_theta=500000.0, tie_word_embeddings=True,
    )
    torch.manual_seed(0)
    return LlamaForCausalLM(cfg).to("cuda", torch.bfloat16)


def llama_case():
    model = llama_model().eval()
    ids = torch.randint(0, model.config.vocab_size, (4, 2048), device="cuda")
    return model, (lambda m: m(input_ids=ids, logits_to_keep=1)), False


def llama_train_case():
    model = llama_model().train()
    ids = torch.randint(0, model.config.vocab_size, (4, 2048), device="cuda")

    def step(m):
        loss = m(input_ids=ids, labels=ids).loss
        loss.backward()
        for p in m.parameters():
            p.grad = None

    return model, step, True


CASES = {"ltx": ltx_case, "llama": llama_case, "llama_train": llama_train_case}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cases", default="ltx,llama")
    ap.add_argument("--providers", default="eager,compile,kf,kf_compile")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--iters", type=int, default=10)
    args = ap.parse_args()
    import kernelforge as kf

    for name in args.cases.split(","):
        model, step, train = CASES[name]()
        res: dict[str, float] = {}
        for prov in args.providers.split(","):
            t0 = time.time()
            torch._dynamo.reset()
            m = model
            if prov.startswith("kf"):
                report = kf.patch(model)
                print(f"[{name}] kf.patch: {report.format()}")
            if prov.endswith("compile"):
                m = torch.compile(model)
            ctx = torch.enable_grad() if train else torch.no_grad()
            with ctx:
                res[prov] = timed(lambda: step(m), args.warmup, args.iters)
            if prov.startswith("kf"):
                kf.unpatch(model)
            print(f"[{name}] {prov:11s} {res[prov]:9.2f} ms/step  (set-up and warm-up {time.time() - t0:.0f} s)")
        base = res.get("eager")
        comp = res.get("compile")
        for prov, ms in res.items():
            vs_e = f"{base / ms:5.2f}x eager" if base else ""
            vs_c = f"{comp / ms:5.2f}x compile" if comp else ""
            print(f"RESULT {name:12s} {prov:11s} {ms:9.2f} ms  {vs_e}  {vs_c}")
        del model
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
