"""The runner of `kforge bench`: which cases run, and one case's correctness check and timings.

A case is (op, shape, dtype). For each of its modes, kernelforge runs first (its outputs, and for
fwdbwd its gradients, are the reference of the peers' check), then each peer is checked against it
(relative L2 within TOL[dtype].peer_l2) and timed; a peer that raises is recorded with a NaN time.
"""

from __future__ import annotations

import argparse
import re

import torch

from ..specs import (FAMILIES, SPECS, TOL, AttnShape, BmmShape, DecodeShape, FlceShape, GroupedShape, LinearShape,
                     OpSpec, RopeShape, base_mode, shape_label, shape_rows)
from ..specs._spec import last_plan
from ..specs.decode import CascadeShape
from ..specs.graph import GraphShape
from .report import DTYPES, Result
from .timing import Timer

DECODE_MAX_ROWS = 64  # rows (apply_rope: tokens) at or under this also get fwd_graph and fwd_call
ROPE_SHAPE_RE = re.compile(r"b(\d+)s(\d+)h(\d+)/(\d+)d(\d+)")
FLCE_SHAPE_RE = re.compile(r"t(\d+)h(\d+)v(\d+)")
# the anchors' attention form: b{B}h{Hq}[/{Hkv}]s{Sq}[/{Sk}]d{D}[/{Dv}][c][-varlen]
ATTN_SHAPE_RE = re.compile(r"b(\d+)h(\d+)(?:/(\d+))?s(\d+)(?:/(\d+))?d(\d+)(?:/(\d+))?(c)?(-varlen)?")
# decode_attention: b{B}h{Hq}[/{Hkv}]kv{kv}d{D}p{page}[q{Lq}] (p0: a contiguous cache)
DECODE_SHAPE_RE = re.compile(r"b(\d+)h(\d+)(?:/(\d+))?kv(\d+)d(\d+)p(\d+)(?:q(\d+))?")
# cascade_decode_attention: b{B}h{Hq}[/{Hkv}]pre{P}kv{kv}d{D}p{page}[q{Lq}]
CASCADE_SHAPE_RE = re.compile(r"b(\d+)h(\d+)(?:/(\d+))?pre(\d+)kv(\d+)d(\d+)p(\d+)(?:q(\d+))?")
# linear: m{M}n{N}k{K}[-bias]
LINEAR_SHAPE_RE = re.compile(r"m(\d+)n(\d+)k(\d+)(-bias)?(?:-(relu|gelu_tanh))?")
BMM_SHAPE_RE = re.compile(r"b(\d+)m(\d+)n(\d+)k(\d+)")  # bmm: b{B}m{M}n{N}k{K}
GROUPED_SHAPE_RE = re.compile(r"e(\d+)t(\d+)n(\d+)k(\d+)(-even)?")  # grouped_mm: e{E}t{T}n{N}k{K}[-even]
GRAPH_SHAPE_RE = re.compile(r"n(\d+)e(\d+)f(\d+)")  # graph family: nodes, edges, features


# ---- shapes and cases -----------------------------------------------------------------------------


def parse_shapes(text: str) -> list[tuple]:
    """ROWSxHIDDEN items give (rows, hidden); b{B}s{S}h{Hq}/{Hk}d{D} a RopeShape; t{T}h{H}v{V} a
    FlceShape; b{B}h{Hq}[/{Hkv}]s{Sq}[/{Sk}]d{D}[/{Dv}][c][-varlen] an AttnShape;
    b{B}h{Hq}[/{Hkv}]kv{kv}d{D}p{page}[q{Lq}] a DecodeShape; b{B}h{Hq}[/{Hkv}]pre{P}kv{kv}d{D}p{page}[q{Lq}]
    a CascadeShape; m{M}n{N}k{K}[-bias][-relu|-gelu_tanh] a LinearShape;
    b{B}m{M}n{N}k{K} a BmmShape; e{E}t{T}n{N}k{K}[-even] a GroupedShape; n{N}e{E}f{F} a GraphShape."""
    shapes: list[tuple] = []
    for item in text.split(","):
        item = item.strip().lower()
        if not item:
            continue
        m = FLCE_SHAPE_RE.fullmatch(item)
        if m:
            fs = FlceShape(*(int(v) for v in m.groups()))
            if min(fs) == 0:
                raise argparse.ArgumentTypeError(f"shape {item!r}: sizes must be > 0")
            shapes.append(fs)
            continue
        m = ATTN_SHAPE_RE.fullmatch(item)
        if m:
            b, hq, hk, sq, sk, d, dv, causal, varlen = m.groups()
            a = AttnShape(int(b), int(hq), int(hk or hq), int(sq), int(sk or sq), int(d), int(dv or d),
                          causal == "c", varlen is not None)
            if min(a[:7]) == 0 or a.hq % a.hk or (a.varlen and a.sk != a.sq):
                raise argparse.ArgumentTypeError(f"shape {item!r}: sizes must be > 0, Hq a multiple of Hkv, "
                                                 "and varlen shapes have Sk = Sq")
            shapes.append(a)
            continue
        m = DECODE_SHAPE_RE.fullmatch(item)
        if m:
            b, hq, hk, kv, d, page, lq = m.groups()
            ds = DecodeShape(int(b), int(hq), int(hk or hq), int(kv), int(d), int(page), int(lq or 1))
            if min(ds.b, ds.hq, ds.hk, ds.kv, ds.d, ds.lq) == 0 or ds.hq % ds.hk or ds.lq > ds.kv or (
                    ds.page & (ds.page - 1)):
                raise argparse.ArgumentTypeError(f"shape {item!r}: sizes must be > 0, Hq a multiple of Hkv, "
                                                 "Lq at most kv and the page size a power of two (p0: contiguous)")
            shapes.append(ds)
            continue
        m = CASCADE_SHAPE_RE.fullmatch(item)
        if m:
            b, hq, hk, pre, kv, d, page, lq = m.groups()
            cs = CascadeShape(int(b), int(hq), int(hk or hq), int(pre), int(kv), int(d), int(page), int(lq or 1))
            if min(cs.b, cs.hq, cs.hk, cs.kv, cs.d, cs.page, cs.lq) == 0 or cs.hq % cs.hk or cs.lq > cs.kv or (
                    cs.page & (cs.page - 1)) or cs.prefix % cs.page:
                raise argparse.ArgumentTypeError(f"shape {item!r}: sizes must be > 0, Hq a multiple of Hkv, Lq at "
                                                 "most kv, the page size a power of two and the prefix a multiple "
                                                 "of it")
            shapes.append(cs)
            continue
        m = LINEAR_SHAPE_RE.fullmatch(item)
        if m:
            ls = LinearShape(int(m[1]), int(m[2]), int(m[3]), m[4] is not None, m[5] or "")
            if min(ls.m, ls.n, ls.k) == 0:
                raise argparse.ArgumentTypeError(f"shape {item!r}: sizes must be > 0")
            shapes.append(ls)
            continue
        m = BMM_SHAPE_RE.fullmatch(item)
        if m:
            bs = BmmShape(*(int(v) for v in m.groups()))
            if min(bs) == 0:
                raise argparse.ArgumentTypeError(f"shape {item!r}: sizes must be > 0")
            shapes.append(bs)
            continue
        m = GROUPED_SHAPE_RE.fullmatch(item)
        if m:
            gs = GroupedShape(*(int(v) for v in m.groups()[:4]), even=bool(m.group(5)))
            if min(gs[:4]) == 0:
                raise argparse.ArgumentTypeError(f"shape {item!r}: sizes must be > 0")
            shapes.append(gs)
            continue
        m = GRAPH_SHAPE_RE.fullmatch(item)
        if m:
            gs = GraphShape(*(int(v) for v in m.groups()))
            if min(gs) == 0:
                raise argparse.ArgumentTypeError(f"shape {item!r}: sizes must be > 0")
            shapes.append(gs)
            continue
        m = ROPE_SHAPE_RE.fullmatch(item)
        if m:
            rs = RopeShape(*(int(v) for v in m.groups()))
            if min(rs) == 0 or rs.d % 2:
                raise argparse.ArgumentTypeError(f"shape {item!r}: sizes must be > 0 and the head dim "
                                                 "even (RoPE rotates pairs of columns)")
            shapes.append(rs)
            continue
        parts = item.split("x")
        if len(parts) != 2 or not all(p.isdigit() and int(p) > 0 for p in parts):
            raise argparse.ArgumentTypeError(f"shape {item!r} is not ROWSxHIDDEN, e.g. 16384x4096, nor "
                                             "b{B}s{S}h{Hq}/{Hk}d{D} (apply_rope), e.g. b4s4096h32/8d128, "
                                             "nor t{T}h{H}v{V} (fused_linear_cross_entropy), "
                                             "nor b{B}h{Hq}[/{Hkv}]s{Sq}[/{Sk}]d{D}[/{Dv}][c][-varlen] "
                                             "(attention), e.g. b4h32/8s4096d128c, nor "
                                             "b{B}h{Hq}[/{Hkv}]kv{kv}d{D}p{page}[q{Lq}] (decode_attention), "
                                             "e.g. b16h32/8kv4096d128p16, nor m{M}n{N}k{K}[-bias] (linear), "
                                             "e.g. m1n4096k4096, nor b{B}m{M}n{N}k{K} (bmm), e.g. "
                                             "b32m1024n1024k128, nor e{E}t{T}n{N}k{K}[-even] (grouped_mm), e.g. "
                                             "e8t16384n14336k4096, nor n{N}e{E}f{F} (graph), "
                                             "e.g. n1000000e20000000f128")
        shapes.append((int(parts[0]), int(parts[1])))
    if not shapes:
        raise argparse.ArgumentTypeError("--shapes is empty")
    return shapes


def _kind(shape) -> str:
    if isinstance(shape, GraphShape):
        return "graph"
    if isinstance(shape, AttnShape):
        return "attn"
    if isinstance(shape, DecodeShape):
        return "decode"
    if isinstance(shape, CascadeShape):
        return "cascade"
    if isinstance(shape, LinearShape):
        return "linear"
    if isinstance(shape, BmmShape):
        return "bmm"
    if isinstance(shape, GroupedShape):
        return "grouped"
    return "rope" if isinstance(shape, RopeShape) else "flce" if isinstance(shape, FlceShape) else "rows"


def op_shapes(spec: OpSpec, shapes: list | None, sweep: bool = False, rows: list | None = None) -> list[tuple]:
    """The op's shapes: those of its kind in --shapes, else its sweep or default shapes; --rows keeps
    the shapes with those rows."""
    if shapes is not None:
        out = [sh for sh in shapes
               if _kind(sh) == spec.shape_kind and (spec.shape_applies is None or spec.shape_applies(sh))]
    else:
        out = list(spec.sweep_shapes if sweep else spec.shapes)
    if rows:
        out = [sh for sh in out if shape_rows(sh) in rows]
    return out


def plan_cases(ops, shapes, dtypes, sweep: bool = False, rows: list | None = None) -> list[tuple[str, tuple, str]]:
    """Family by family (norm, activation, rope, softmax, loss: a run cut short by --max-seconds loses
    the later families first), shape-major within a family: every op at the first shape, then the next
    shape, ... so that a cut run has covered all of a family's ops at the leading shapes (summary and
    plots regroup by op)."""
    cases = []
    for family in FAMILIES.values():
        fam_ops = [s for s in family if s.name in ops]
        per_op = {s.name: op_shapes(s, shapes, sweep, rows) for s in fam_ops}
        ordered: list = []
        for s in fam_ops:
            ordered += [sh for sh in per_op[s.name] if sh not in ordered]
        for dims in ordered:
            for s in fam_ops:
                if dims in per_op[s.name]:
                    cases += [(s.name, dims, dt) for dt in dtypes if dtype_applies(s, dt)]
    return cases


def dtype_applies(spec: OpSpec, dt: str) -> bool:
    """Whether the op takes the dtype named dt (attention: float16 / bfloat16 only)."""
    return spec.dtypes is None or DTYPES[dt] in spec.dtypes


def modes_for(rows: int, modes, spec: OpSpec | None = None) -> list[str]:
    """The modes of a case: fwd_graph / fwd_call only for decode-sized rows; only the spec's modes
    (forward-only ops have no fwdbwd)."""
    have = spec.modes if spec is not None else ("fwd", "fwdbwd")
    return [m for m in modes if (m in ("fwd", "fwdbwd") or rows <= DECODE_MAX_ROWS)
            and (m in have or (m in ("fwd_graph", "fwd_call") and "fwd" in have))]


def op_order(groups: list[list[Result]], ops) -> list[list[Result]]:
    """Groups regrouped by op (stable: shapes keep their run order)."""
    return sorted((g for g in groups if g), key=lambda g: list(ops).index(g[0].op))


def liger_available() -> bool:
    try:
        import liger_kernel  # noqa: F401, PLC0415
    except Exception:  # noqa: BLE001  (not installed, or its import fails: no liger peer)
        return False
    return SPECS["rms_norm"].peer("liger") is not None


# ---- one call, checked ----------------------------------------------------------------------------


def rel_l2(a: torch.Tensor, b: torch.Tensor) -> float:
    a = a.detach().double().flatten()
    b = b.detach().double().flatten()
    if not torch.isfinite(a).all():
        return float("inf")
    den = b.norm().item()
    return (a - b).norm().item() / (den if den > 0 else 1.0)


def backward(spec: OpSpec, outs, t) -> None:
    """Backward of the outputs that carry a gradient (outputs[i] with t[grad_outputs[i]])."""
    if len(spec.grad_outputs) == 1:
        outs[0].backward(t[spec.grad_outputs[0]])
    else:
        torch.autograd.backward(outs[:len(spec.grad_outputs)], [t[g] for g in spec.grad_outputs])


def run_once(fn, t, spec: OpSpec, mode: str) -> list[torch.Tensor]:
    """Outputs (and, for fwdbwd, the grads of the spec's grad_inputs) of one call, detached copies."""
    names = spec.grad_inputs
    if mode == "fwdbwd":
        for n in names:
            t[n].grad = None
        outs = fn(t)
        backward(spec, outs, t)
        res = [o.detach().clone() for o in outs] + [t[n].grad.clone() for n in names]
        for n in names:
            t[n].grad = None
        return res
    with torch.no_grad():
        return [o.detach().clone() for o in fn(t)]


def result_names(spec: OpSpec, mode: str) -> list[str]:
    return list(spec.outputs) + ([f"d{n}" for n in spec.grad_inputs] if mode == "fwdbwd" else [])


def time_one(fn, t, spec: OpSpec, mode: str, timer: Timer) -> float:
    if mode == "fwdbwd":
        names = spec.grad_inputs

        def pre():
            for n in names:
                t[n].grad = None

        if len(spec.grad_outputs) == 1:
            dy = t[spec.grad_outputs[0]]

            def step():
                fn(t)[0].backward(dy)
        else:  # several outputs carry a gradient (apply_rope: q_out, k_out)
            grads = tuple(t[g] for g in spec.grad_outputs)

            def step():
                torch.autograd.backward(fn(t), grads)

        return timer.median_ms(step, pre)
    with torch.no_grad():
        if mode == "fwd":
            return timer.median_ms(lambda: fn(t))
        if mode == "fwd_graph":
            return timer.graph_ms(lambda: fn(t))
        if mode == "fwd_call":
            return timer.call_ms(lambda: fn(t))
    raise ValueError(mode)


def peak_extra_mib(fn, t, spec: OpSpec, mode: str, device) -> float:
    """Peak memory of one call, in MiB, above what existed before it (the inputs) and what it leaves
    (its outputs; for fwdbwd the gradients): the memory cost of the op itself, e.g. the [tokens, vocab]
    logits and their gradient of an eager loss."""
    names = spec.grad_inputs
    for n in names:
        t[n].grad = None
    torch.cuda.synchronize(device)
    torch.cuda.reset_peak_memory_stats(device)
    base = torch.cuda.memory_allocated(device)
    if mode == "fwdbwd":
        outs = fn(t)
        backward(spec, outs, t)
        kept = [t[n].grad for n in names] + list(outs)
    else:
        with torch.no_grad():
            kept = list(fn(t))
    torch.cuda.synchronize(device)
    extra = torch.cuda.max_memory_allocated(device) - base - sum(k.numel() * k.element_size() for k in kept)
    for n in names:
        t[n].grad = None
    return extra / 2**20


# ---- one case -------------------------------------------------------------------------------------


def _short(e: Exception) -> str:
    msg = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    return msg[:160]


def run_case(op, dims, dt, modes, timer, info, providers, log, show_plan=False) -> list[list[Result]]:
    """All modes and providers of one (op, shape, dtype); returns one list of results per mode."""
    spec = SPECS[op]
    dtype = DTYPES[dt]
    device = timer.device
    torch._dynamo.reset()  # fresh compile caches: every shape compiles for itself (dynamic=False)
    t = spec.inputs(dims, dtype, device, torch.Generator(device=device).manual_seed(0))
    fns: dict = {}
    for name in providers:
        if spec.peer_applies is not None and not spec.peer_applies(name, dims):
            continue
        try:
            fn = spec.peer(name)
        except Exception as e:  # noqa: BLE001
            fn = e
        if fn is not None:
            fns[name] = fn
    groups = []
    for mode in modes_for(shape_rows(dims), modes, spec):
        bmode = base_mode(mode)
        for n in spec.grad_inputs:
            t[n].requires_grad_(bmode == "fwdbwd")
        ref = None
        group = []
        for name, fn in fns.items():
            if name in spec.peer_modes and bmode not in spec.peer_modes[name]:
                continue  # e.g. a forward-only peer (torch._addmm_activation has no derivative)
            note = ""
            ms = peak = float("nan")
            try:
                if isinstance(fn, Exception):
                    raise fn
                if mode in ("fwd", "fwdbwd"):  # correctness against kernelforge (which runs first)
                    got = run_once(fn, t, spec, bmode)
                    if name == "kernelforge":
                        ref = got
                        if show_plan:
                            plan = last_plan()
                            print(f"plan {op} {mode} {shape_label(dims)} {dt}: "
                                  f"{plan if plan is not None else '- (kf.last_plan is not available)'}",
                                  flush=True)
                    elif ref is not None and not spec.stochastic:
                        tol = TOL[dtype].peer_l2
                        errs = [rel_l2(a, b) for a, b in zip(got, ref)]
                        worst = max(range(len(errs)), key=lambda i: errs[i])
                        if errs[worst] > tol:
                            note = (f"MISMATCH vs kernelforge: {result_names(spec, bmode)[worst]} "
                                    f"rel_l2={errs[worst]:.2e} > {tol:.0e}")
                ms = time_one(fn, t, spec, mode, timer)
                if spec.measure_memory and mode in ("fwd", "fwdbwd") and device.type == "cuda":
                    peak = peak_extra_mib(fn, t, spec, mode, device)
            except Exception as e:  # noqa: BLE001  (a failing provider is recorded, not fatal)
                note = f"FAILED: {type(e).__name__}: {_short(e)}"
                if device.type == "cuda":
                    torch.cuda.synchronize(device)
            res = Result(op, mode, dims, dt, name, ms, note, peak)
            group.append(res)
            if note:
                info.problems.append(((op, res.shape, dt, name, note), mode))
            log(res, info)
        for n in spec.grad_inputs:
            t[n].requires_grad_(False)
            t[n].grad = None
        groups.append(group)
    del t, fns
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return groups
