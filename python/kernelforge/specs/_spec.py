"""The op spec: everything `kforge bench`, `kforge check` and the tests need to know about one op.

An op is described once, in its family's module (specs/norm.py, activation.py, rope.py, softmax.py,
cross_entropy.py, attention.py, decode.py, linear.py): how to make inputs for a shape, the minimum bytes and
nominal FLOPs it must move and do, how kernelforge and the peers compute it, its float64 reference,
the shapes the bench times and the shapes and variants `kforge check` runs. Adding an op is adding
one OpSpec to its family's module (and its name to the family's SPECS tuple).

Bench inputs use the names of the op's keyword arguments plus the incoming gradients (`dy`, or one
per output: `dq_out`, `dk_out`); check inputs add the variant's optional tensors.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, NamedTuple

import torch

f64 = torch.float64

# A spec's modes. The bench also times fwd_graph and fwd_call for decode-sized rows: those count the
# forward's bytes (base_mode).
MODES = ("fwd", "fwdbwd")


def base_mode(mode: str) -> str:
    return "fwdbwd" if mode == "fwdbwd" else "fwd"


# ---- tolerances: one table, one row per dtype ------------------------------------------------------


@dataclass(frozen=True)
class Tol:
    """How far a result in one dtype may be from the float64 reference, per kind of comparison.

    The kernels compute in float32 and round the result once (rms_norm twice: x * rstd is cast to the
    dtype before * weight, as HF's LlamaRMSNorm does): half-precision rows allow about 2 ulp (fp16
    2^-9, bf16 2^-6 relative), float32 rows the accumulation error of 131072-element rows."""

    out: float  # outputs: |a - e| <= out + out |e| against the reference rounded like the library
    grad: float  # gradients: rtol = grad, atol = grad * max(1, max|e|) (reductions cancel near 0)
    floor: float  # magnitudes a kernel may flush or round differently (ex2.ftz below 2^-126; fp16 subnormals)
    lse: float  # float32 statistics (logsumexp), whatever the input dtype
    loss: float  # a loss returned in the input dtype: one rounding on top of `lse`
    gemm: float  # results through a GEMM of dtype-rounded logits (fused linear cross-entropy loss)
    max_err: float  # kforge check: max|got - ref| / max(max|ref|, 1)
    rel_l2: float  # kforge check: ||got - ref|| / max(||ref||, sqrt(numel))
    peer_l2: float  # kforge bench: a peer's relative L2 distance from kernelforge's result (two roundings)
    # attention outputs: |a - e| <= attn (1 + |e|) against the float64 reference rounded to the dtype;
    # flash kernels round the probabilities P to the dtype for the PV GEMM (one more rounding of each
    # term, averaged over the keys) on top of the output's own rounding
    attn: float = 0.0


TOL = {
    torch.float32: Tol(out=1e-5, grad=1e-4, floor=1e-37, lse=2e-5, loss=2e-5, gemm=1e-4,
                       max_err=1e-4, rel_l2=3e-5, peer_l2=1e-4, attn=1e-5),
    torch.float16: Tol(out=2e-3, grad=3e-3, floor=6e-8, lse=2e-5, loss=1e-3, gemm=5e-3,
                       max_err=4e-3, rel_l2=2e-3, peer_l2=5e-3, attn=4e-3),
    torch.bfloat16: Tol(out=1.6e-2, grad=1e-2, floor=1e-37, lse=2e-5, loss=8e-3, gemm=2e-2,
                        max_err=2e-2, rel_l2=8e-3, peer_l2=2e-2, attn=2e-2),
    # float64 (the CPU reference, the float64-on-CUDA fallback): differences of summation order only
    torch.float64: Tol(out=1e-12, grad=1e-10, floor=1e-300, lse=1e-6, loss=1e-6, gemm=1e-10,
                       max_err=1e-10, rel_l2=1e-10, peer_l2=1e-10, attn=1e-12),
}


# ---- shapes ---------------------------------------------------------------------------------------
# Row ops take (rows, hidden) tuples, written ROWSxHIDDEN.


class RopeShape(NamedTuple):
    """An apply_rope bench shape, written b{batch}s{seq}h{q heads}/{kv heads}d{head dim}: q [B, Hq, S, D]
    and k [B, Hk, S, D] (views of [B, S, H, D] memory, as HF attention hands them over), cos/sin
    [B, S, D]."""

    b: int
    s: int
    hq: int
    hk: int
    d: int

    def __str__(self) -> str:
        return f"b{self.b}s{self.s}h{self.hq}/{self.hk}d{self.d}"


class FlceShape(NamedTuple):
    """A fused_linear_cross_entropy shape: tokens x hidden x vocab, written t{T}h{H}v{V}."""

    t: int
    h: int
    v: int

    def __str__(self) -> str:
        return f"t{self.t}h{self.h}v{self.v}"


class AttnShape(NamedTuple):
    """An attention bench shape: B sequences (varlen: B ragged sequences packed into one [T, H, D]
    tensor), Hq / Hkv heads, Sq query and Sk key rows, head dims D (q, k) and Dv (v, out)."""

    b: int
    hq: int
    hk: int
    sq: int
    sk: int
    d: int
    dv: int
    causal: bool
    varlen: bool = False

    def __str__(self) -> str:
        s = f"b{self.b}h{self.hq}" + (f"/{self.hk}" if self.hk != self.hq else "")
        s += f"s{self.sq}" + (f"/{self.sk}" if self.sk != self.sq else "")
        s += f"d{self.d}" + (f"/{self.dv}" if self.dv != self.d else "")
        return s + ("c" if self.causal else "") + ("-varlen" if self.varlen else "")


class DecodeShape(NamedTuple):
    """A decode_attention bench shape, written b{B}h{Hq}[/{Hkv}]kv{kv}d{D}p{page}[q{Lq}]: B sequences
    of kv cached keys each (the Lq new tokens included), Hq / Hkv heads, head dim D, page size (p0: a
    contiguous cache, transformers' static-cache layout), Lq new tokens per sequence (default 1)."""

    b: int
    hq: int
    hk: int
    kv: int
    d: int
    page: int
    lq: int = 1

    def __str__(self) -> str:
        s = f"b{self.b}h{self.hq}" + (f"/{self.hk}" if self.hk != self.hq else "")
        return s + f"kv{self.kv}d{self.d}p{self.page}" + (f"q{self.lq}" if self.lq != 1 else "")


class LinearShape(NamedTuple):
    """A linear / gemm bench shape, written m{M}n{N}k{K}[-bias][-relu|-gelu_tanh]: x [M, K] (M rows:
    tokens), w [N, K] (nn.Linear's weight: N outputs, K inputs), bias [N] with -bias, the activation
    after it (gemm)."""

    m: int
    n: int
    k: int
    bias: bool = False
    act: str = ""

    def __str__(self) -> str:
        return f"m{self.m}n{self.n}k{self.k}" + ("-bias" if self.bias else "") + (f"-{self.act}" if self.act else "")


class BmmShape(NamedTuple):
    """A batched product shape, written b{B}m{M}n{N}k{K}: a [B, M, K] @ b [B, K, N] -> [B, M, N]."""

    b: int
    m: int
    n: int
    k: int

    def __str__(self) -> str:
        return f"b{self.b}m{self.m}n{self.n}k{self.k}"


class GroupedShape(NamedTuple):
    """A grouped (MoE) product shape, written e{E}t{T}n{N}k{K}[-even]: x [T, K] sorted by expert, w [E, N, K],
    out [T, N]. Routing: expert e gets a share of the tokens proportional to e + 1 (skewed: the last
    expert E times the first's), or equal shares with -even."""

    e: int
    t: int
    n: int
    k: int
    even: bool = False

    def __str__(self) -> str:
        return f"e{self.e}t{self.t}n{self.n}k{self.k}" + ("-even" if self.even else "")


class BatchedRowsShape(NamedTuple):
    """A batched row-op shape, written b{B}m{M}n{N}[-bcast]: b [B, M, N]; -bcast: a per-row operand
    of [M] broadcast over the batch (diagonal_matmul's scales) instead of one per row [B, M]."""

    b: int
    m: int
    n: int
    bcast: bool = False

    def __str__(self) -> str:
        return f"b{self.b}m{self.m}n{self.n}" + ("-bcast" if self.bcast else "")


def shape_label(shape: tuple) -> str:
    """ROWSxHIDDEN, or a RopeShape's / FlceShape's / AttnShape's / DecodeShape's / LinearShape's /
    BatchedRowsShape's own form (any shape type with its own __str__, e.g. the graph family's)."""
    return (str(shape) if isinstance(shape, (RopeShape, FlceShape, AttnShape, DecodeShape, LinearShape,
                                             BatchedRowsShape)) or type(shape).__str__ is not tuple.__str__
            else f"{shape[0]}x{shape[1]}")


def shape_rows(shape: tuple) -> int:
    """Rows of a bench shape (apply_rope: tokens B*S; the fused loss: tokens; attention: query
    tokens, B*Sq; decode_attention: new tokens, B*Lq; linear: M; bmm: B*M; grouped_mm: T)."""
    if isinstance(shape, RopeShape):
        return shape.b * shape.s
    if isinstance(shape, AttnShape):
        return shape.b * shape.sq
    if isinstance(shape, DecodeShape):
        return shape.b * shape.lq
    if isinstance(shape, FlceShape):
        return shape.t
    if isinstance(shape, LinearShape):
        return shape.m
    if isinstance(shape, GroupedShape):
        return shape.t
    if isinstance(shape, (BatchedRowsShape, BmmShape)):
        return shape.b * shape.m
    return shape[0]


# ---- the spec -------------------------------------------------------------------------------------

Tensors = dict  # name -> tensor (or None for an absent optional tensor)


@dataclass(frozen=True)
class OpSpec:
    name: str  # kf.<name>: the bench and check case name
    family: str  # norm | activation | rope | softmax | loss | attention | decode | linear (the CLI's op groups)
    # rows (ROWSxHIDDEN) | rope (RopeShape) | flce (FlceShape) | attn (AttnShape) | decode | linear | bmm | grouped
    shape_kind: str

    # -- bench --
    inputs: Callable[[tuple, torch.dtype, Any, torch.Generator], Tensors]  # fresh random inputs + grads
    run: Callable[[Tensors], tuple]  # kernelforge's call; outputs[i] pairs with grad_outputs[i]
    grad_inputs: tuple[str, ...]  # what fwd+bwd differentiates
    row_bytes: Callable[[tuple, str, int], int]  # (shape, mode, element size) -> minimum bytes
    flops: Callable[[tuple, str], int]  # (shape, mode) -> nominal floating-point operations
    shapes: tuple  # default bench shapes
    eager: Callable[[], Callable] | None = None  # () -> the code the model libraries run
    torch_native: Callable[[], Callable] | None = None  # () -> a fused PyTorch op
    liger: Callable[[], Callable | None] | None = None  # () -> Liger-Kernel's, or None if not importable
    providers: tuple[str, ...] = ("kernelforge", "eager", "torch_native", "compile", "liger")
    grad_outputs: tuple[str, ...] = ("dy",)  # incoming gradients, one per differentiated output
    outputs: tuple[str, ...] = ("y",)  # names of run()'s outputs (the peer-check report)
    sweep_shapes: tuple = ()  # `kforge bench --sweep`
    measure_memory: bool = False  # bench reports peak memory above inputs and outputs
    # providers beyond eager / torch_native / compile / liger: name -> () -> callable (attention: SDPA
    # pinned to one backend, flex_attention)
    extra_peers: dict = field(default_factory=dict)
    peer_applies: Callable[[str, tuple], bool] | None = None  # (provider, shape) -> whether it runs the shape
    # shape -> whether the op takes it at all (ops sharing a shape kind: decode_attention's head dims
    # 64 / 128 / 256, mla_decode's 576); None: every shape of its kind
    shape_applies: Callable[[tuple], bool] | None = None
    peer_modes: dict = field(default_factory=dict)  # provider -> the base modes it has (absent: all the op's)
    modes: tuple[str, ...] = MODES  # what the op has (a forward-only op: ("fwd",))
    dtypes: tuple | None = None  # the dtypes the op takes (None: every bench / check dtype)
    # "memory": GB/s of the minimum traffic against a copy of the same bytes; "compute": TFLOP/s
    bound: str = "memory"
    # random outputs (dropout): peers draw other masks, so the bench does not compare them with kernelforge
    stochastic: bool = False

    # -- kforge check: every shape x variant, against two float64 oracles --
    check_shapes: tuple = ()
    variants: tuple = ({},)
    check_inputs: Callable[[tuple, dict, torch.dtype, Any], Tensors] | None = None
    check_run: Callable[[Any, Tensors, dict], dict] | None = None  # kf.* + autograd -> outputs, grads
    cpp_reference: Callable[[Tensors, dict], dict] | None = None  # the op's CPU (C++ float64) path
    reference: Callable[[Tensors, dict], dict] | None = None  # float64 PyTorch formula + autograd
    check_label: Callable[[tuple], str] = shape_label
    grad_tol_factor: float = 1.0  # check: gradient tolerance x this (GEMMs over dtype-rounded grads)

    extra: dict = field(default_factory=dict)  # family-specific constants (eps, ...)

    def traffic(self, shape: tuple, mode: str, elt: int) -> int:
        return self.row_bytes(shape, base_mode(mode), elt)

    def flop_count(self, shape: tuple, mode: str) -> int:
        return self.flops(shape, base_mode(mode))

    def peer(self, provider: str) -> Callable | None:
        """The callable of a provider (t -> tuple of outputs), or None where the op has none."""
        if provider not in self.providers:
            return None
        if provider == "kernelforge":
            return self.run
        if provider == "compile":
            return torch.compile(self.eager(), dynamic=False) if self.eager else None
        if provider in self.extra_peers:
            return self.extra_peers[provider]()
        factory = {"eager": self.eager, "torch_native": self.torch_native, "liger": self.liger}[provider]
        return factory() if factory else None


# ---- helpers shared by the family modules ---------------------------------------------------------


def kf():
    """The kernelforge package, imported when first called (the CLI starts without the extension)."""
    import kernelforge  # noqa: PLC0415

    return kernelforge


def last_plan() -> str | None:
    """kf.last_plan() where the package has it, else None."""
    fn = getattr(kf(), "last_plan", None)
    return fn() if fn is not None else None


def randn(gen: torch.Generator | None, device, dtype, *shape, scale: float = 1.0, offset: float = 0.0):
    """N(offset, scale^2) values generated in float32 (never all zeros), then cast to dtype."""
    v = torch.randn(*shape, generator=gen, device=device, dtype=torch.float32)
    return (v * scale + offset).to(dtype)


def to_f64_cpu(t: Tensors) -> Tensors:
    """Floating tensors as float64 on the CPU; integer ones (targets, position_ids) keep their dtype."""
    return {k: (v.detach().to("cpu", f64 if v.is_floating_point() else v.dtype)
                if isinstance(v, torch.Tensor) else v)
            for k, v in t.items()}


def poison(shapes, dtype, device) -> None:
    """Leave NaN-filled blocks of these sizes in the CUDA caching allocator, for the next outputs: an
    element a kernel forgets to write then reads as NaN."""
    if torch.device(device).type != "cuda":
        return
    blocks = [torch.full(s, float("nan"), dtype=dtype, device=device) for s in shapes]
    del blocks


def check_out(name: str, o: torch.Tensor, shape: tuple, dtype) -> None:
    if tuple(o.shape) != tuple(shape) or o.dtype != dtype:
        raise AssertionError(f"{name} has shape {tuple(o.shape)} {o.dtype}, expected {tuple(shape)} {dtype}")


def grads_of(outputs: list, grads: list, leaves: Tensors, names: list[str], like: Tensors) -> dict:
    """{"d" + name: gradient} of `outputs` (backward of `grads`) for each leaf, shape-checked against
    `like[name]`."""
    gs = torch.autograd.grad(outputs, [leaves[k] for k in names], grads)
    res = {}
    for k, g in zip(names, gs):
        if g.shape != like[k].shape:
            raise AssertionError(f"d{k} has shape {tuple(g.shape)}, expected {tuple(like[k].shape)}")
        res["d" + k] = g
    return res
