"""`kforge check`: every op, forward and backward, on the current GPU against two float64 oracles.

The ops, their check shapes (one per code path: one row, N = 1, odd N, long rows, ...; RoPE: GQA,
MQA, decode, partial rotary, odd head_dim; cross-entropy: vocabularies from 7 to 262144; attention:
every head dim pair, GQA / MQA, Sq != Sk both ways, ragged varlen; decode_attention: every head dim,
GQA groups 1 .. 16, 1 .. 8 new tokens, ragged lengths with an empty sequence, 32 K keys; linear: 1 ..
16 rows and one past them, odd N and K, K past a split, long N) and variants (with / without weight
and bias; AdaLN kinds and scale shapes; GELU erf / tanh, gate first / second; RoPE pairings, layouts
and cos/sin tables; loss reductions and options; attention causal, window, softcap, sinks, layouts,
lse; gradients of q, k, v, sinks with the deterministic backward; decode: page sizes, contiguous and
static caches, window, softcap, sinks, lse; linear: with / without bias, gradients of x, w, bias) are
the specs of kernelforge.specs. For each op, dtype, shape and variant, on fresh random data:

  * the GPU result through the public API (kf.*, autograd for the gradients) is compared with
    (a) the op's own CPU implementation, the C++ float64 reference, run on the inputs upcast to
        float64 (spec.cpp_reference), and
    (b) the spec's float64 PyTorch reference (spec.reference, autograd for its gradients),
  * NaN/Inf never passes, except where the reference itself is NaN (the mean over all-ignored rows,
    0 / 0 as in PyTorch): there the result must be NaN too, at the same positions; the allocator is
    pre-filled with NaN blocks of the outputs' sizes before each GPU call (an output element the
    kernel forgets then shows up as NaN),
  * the GPU forward and backward are run twice and must be bit-identical (fixed reduction order).

Error = max|got - ref| / max(max|ref|, 1), plus the relative L2 error (same floor of 1); PASS needs
both within TOL[dtype].max_err / .rel_l2 against both oracles (gradients x spec.grad_tol_factor).
Prints one PASS/FAIL line per op and dtype; exit status 1 if anything FAILs, 2 without a GPU or
without the extension.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
from dataclasses import dataclass, field

import torch

from .specs import GROUPS, OPS, SPECS, TOL, OpSpec
from .specs._spec import to_f64_cpu

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


def variant_label(v: dict) -> str:
    parts = [v["kind"]] if "kind" in v else []
    parts += [k for k in ("weight", "bias") if v.get(k)]
    if "mod" in v:
        parts.append("scale[" + ",".join(v["mod"]) + "]")
    if "approximate" in v:
        parts.append(v["approximate"])
    if "p" in v:  # the dropout family
        parts.append(f"p={v['p']:g}")
    if "gate_first" in v:
        parts.append("gate_first" if v["gate_first"] else "gate_second")
    if "interleaved" in v:
        parts.append("interleaved" if v["interleaved"] else "rotate_half")
        parts.append(v["layout"] + ("_view" if v["view"] else ""))
        parts.append({"BSR": "cos[B,S,R]", "SR32": "cos[S,R]f32", "cache": "cache+position_ids"}[v["tables"]])
    if "layout" in v and "interleaved" not in v:  # the attention family
        parts.append(v["layout"])
        if v.get("causal"):
            parts.append("causal")
        if v.get("window"):
            parts.append("window=({},{})".format(*v["window"]))
        if v.get("softcap"):
            parts.append(f"softcap={v['softcap']:g}")
        for key in ("sinks", "lse"):
            if v.get(key):
                parts.append(key)
    if "page" in v:  # the decode family
        parts.append("static_cache" if v.get("static") else "contiguous" if v["page"] == 0 else f"page={v['page']}")
        if v.get("window_left", -1) >= 0:
            parts.append(f"window_left={v['window_left']}")
        if v.get("softcap"):
            parts.append(f"softcap={v['softcap']:g}")
        for key in ("sinks", "lse"):
            if v.get(key):
                parts.append(key)
    if "reduce" in v:  # the graph family
        parts.insert(0, v["reduce"])
    if "reduction" in v:  # the loss family
        parts.append(v["reduction"])
        for key, short in (("label_smoothing", "ls"), ("z_loss_scale", "z"), ("softcap", "softcap"),
                           ("chunk_tokens", "chunk")):
            if v.get(key):
                parts.append(f"{short}={v[key]:g}")
        if v.get("ignore") == "all":
            parts.append("all_ignored")
    return "+".join(parts) if parts else "plain"


def errors(got: torch.Tensor, ref: torch.Tensor) -> tuple[float, float]:
    """(max|got - ref| / max(max|ref|, 1), relative L2); inf when got has NaN/Inf.

    The one exception to "NaN never passes": where the reference itself is NaN (the mean cross-entropy
    over rows that are all ignored is 0 / 0, as in PyTorch), got must be NaN at exactly those positions
    (else inf) and the other elements are compared as usual."""
    g = got.detach().to("cpu", torch.float64).flatten()
    r = ref.detach().to("cpu", torch.float64).flatten()
    if g.shape != r.shape:
        return math.inf, math.inf
    ref_nan = torch.isnan(r)
    if ref_nan.any():
        if not torch.equal(torch.isnan(g), ref_nan):
            return math.inf, math.inf
        g, r = g[~ref_nan], r[~ref_nan]
    if g.numel() == 0:
        return 0.0, 0.0
    if not torch.isfinite(g).all():
        return math.inf, math.inf
    diff = g - r
    mx = diff.abs().max().item() / max(r.abs().max().item(), 1.0)
    # relative L2 with the same floor: rms error over max(rms of ref, 1) (near-zero refs, e.g. the
    # gradients of an N = 1 row, are judged on absolute error, as the inputs are O(1))
    l2 = diff.norm().item() / max(r.norm().item(), math.sqrt(r.numel()))
    return mx, l2


def tolerance(spec: OpSpec, k: str, dtype) -> tuple[float, float]:
    """(max_err, rel_l2) of TOL[dtype]; gradients (keys "d...") times the spec's grad_tol_factor."""
    t = TOL[dtype]
    f = spec.grad_tol_factor if k.startswith("d") else 1.0
    return f * t.max_err, f * t.rel_l2


@dataclass
class Tally:
    fwd_err: float = 0.0
    bwd_err: float = 0.0
    worst_fwd: str = ""
    worst_bwd: str = ""
    cases: int = 0
    failures: list = field(default_factory=list)


def check_case(kf, op: str, shape: tuple, v: dict, dtype, device, tally: Tally) -> None:
    spec = SPECS[op]
    label = f"{spec.check_label(shape)} {variant_label(v)}"
    tally.cases += 1
    try:
        t = spec.check_inputs(shape, v, dtype, device)
        got = spec.check_run(kf, t, v)
        again = spec.check_run(kf, t, v)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        for k in got:
            if not torch.equal(got[k], again[k]) and torch.isfinite(got[k]).all():
                tally.failures.append(f"{label}: {k} differs between two identical runs (race or "
                                      "nondeterministic reduction)")
        refs = {"C++ ref": spec.cpp_reference(to_f64_cpu(t), v), "torch f64": spec.reference(to_f64_cpu(t), v)}
    except Exception as e:  # noqa: BLE001  (an op that raises is a FAIL with its message)
        msg = str(e).strip().splitlines()[0] if str(e).strip() else ""
        tally.failures.append(f"{label}: raised {type(e).__name__}: {msg[:200]}")
        return
    for oracle, ref in refs.items():
        for k, r in ref.items():
            if k not in got:
                tally.failures.append(f"{label}: no {k} from kernelforge (oracle {oracle} has one)")
                continue
            mx, l2 = errors(got[k], r)
            tol_max, tol_l2 = tolerance(spec, k, dtype)
            if r.numel() < 16:  # an L2 average over a few elements is their max error: judged by tol_max
                tol_l2 = tol_max
            bwd = k.startswith("d")
            if bwd and mx > tally.bwd_err:
                tally.bwd_err, tally.worst_bwd = mx, f"{label} {k}"
            if not bwd and mx > tally.fwd_err:
                tally.fwd_err, tally.worst_fwd = mx, f"{label} {k}"
            if not (mx <= tol_max and l2 <= tol_l2):
                tally.failures.append(f"{label}: {k} vs {oracle}: max_err {mx:.2e} (tol {tol_max:.0e}), "
                                      f"rel_l2 {l2:.2e} (tol {tol_l2:.0e})")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("ops", nargs="*", metavar="OP",
                   help=f"ops to check (default all): {' '.join(OPS)}; groups: {', '.join(GROUPS)}")
    p.add_argument("--dtype", default="bf16,fp16,fp32",
                   help="comma list of bf16, fp16, fp32 (default all three)")
    p.add_argument("--seed", type=int, default=None, help="random seed (default: fresh each run)")
    p.add_argument("--device", default="cuda", help=argparse.SUPPRESS)  # cpu: smoke tests only


def main(args: argparse.Namespace) -> int:
    t0 = time.monotonic()
    args.ops = [o for n in args.ops for o in GROUPS.get(n, (n,))]
    bad = [o for o in args.ops if o not in OPS]
    dts = [d.strip() for d in args.dtype.split(",") if d.strip()]
    bad += [d for d in dts if d not in DTYPES]
    if bad or not dts:
        print(f"kforge check: unknown op/dtype {', '.join(bad) or '(none)'}; ops: {' '.join(OPS)}; "
              f"dtypes: {', '.join(DTYPES)}", file=sys.stderr)
        return 2
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        print("kforge check: no CUDA GPU is visible (torch.cuda.is_available() is False); the check "
              "runs the CUDA kernels against the float64 reference and needs one.", file=sys.stderr)
        return 2
    try:
        import kernelforge as kf  # noqa: PLC0415

        torch.ops.kernelforge.rms_norm  # the compiled library is loaded
        for name in OPS:  # and every checked op has its Python function
            getattr(kf, name)
    except Exception as e:  # noqa: BLE001
        print(f"kforge check: the kernelforge ops are not loaded ({type(e).__name__}: {e}). Build the "
              "extension first (scripts/dev_build.sh copies it to python/kernelforge/).",
              file=sys.stderr)
        return 2
    seed = args.seed if args.seed is not None else int.from_bytes(os.urandom(4), "little")
    torch.manual_seed(seed)
    where = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    print(f"kforge check on {where} | torch {torch.__version__} | seed {seed} | "
          f"oracles: C++ float64 reference (CPU op) and the specs' float64 PyTorch references", flush=True)
    print(f"{'':6}{'op':<27}{'dtype':<6}{'cases':>6}  {'fwd max_err':>11}  {'bwd max_err':>11}  "
          f"{'tol':>7}  worst", flush=True)
    ops = list(dict.fromkeys(args.ops or OPS))
    any_fail = False
    for op in ops:
        spec = SPECS[op]
        for dt in dts:
            dtype = DTYPES[dt]
            if spec.dtypes is not None and dtype not in spec.dtypes:
                print(f"{'skip':<6}{op:<27}{dt:<6}  (the op takes {', '.join(str(d)[6:] for d in spec.dtypes)})",
                      flush=True)
                continue
            tally = Tally()
            for shape in spec.check_shapes:
                for v in spec.variants:
                    check_case(kf, op, shape, v, dtype, device, tally)
            status = "FAIL" if tally.failures else "PASS"
            any_fail |= bool(tally.failures)
            worst = tally.worst_bwd if tally.bwd_err >= tally.fwd_err else tally.worst_fwd
            print(f"{status:<6}{op:<27}{dt:<6}{tally.cases:>6}  {tally.fwd_err:>11.2e}  "
                  f"{tally.bwd_err:>11.2e}  {TOL[dtype].max_err:>7.0e}  {worst}", flush=True)
            for f in tally.failures[:8]:
                print(f"        {f}", flush=True)
            if len(tally.failures) > 8:
                print(f"        ... {len(tally.failures) - 8} more", flush=True)
    print(f"kforge check: {'FAIL' if any_fail else 'PASS'} ({time.monotonic() - t0:.1f} s, seed {seed})",
          flush=True)
    return 1 if any_fail else 0
