"""grouped_mm (kernelforge.grouped_mm: the grouped GEMMs of a mixture-of-experts layer): x [T, K] sorted
by expert, w [E, N, K], offsets int32 [E] (the groups' row ends); out[r] = x[r] w[e]^T for the rows of
group e. The backward: dx with w's transposed view (the same kernel), dw per expert with a variable
reduction length (grouped_mm_wgrad).

Bench shapes are GroupedShapes, e{E}t{T}n{N}k{K}[-even], skewed routing by default (expert e gets a
share proportional to e + 1). The defaults: Mixtral-like 8 experts (4096 -> 14336) and DeepSeek /
Qwen-MoE-like 64 experts (4096 -> 1536 and 1536 -> 4096), 16384 tokens.

Compute-bound (``bound="compute"``): TFLOP/s of 2 T N K forward, 6 T N K forward + backward.

Peers: ``torch_grouped`` torch._grouped_mm (bfloat16, with its own autograd), ``loop`` a loop of
cuBLAS GEMMs over the experts (torch.mm into slices of one output; the backward two loops), with the
group sizes known on the host ahead of the call (a model would have to synchronize to get them).

Check shapes are (E, T, N, K): one row, odd N and K (the portable kernel), empty experts; variants:
w as given and as the transposed view of a [E, K, N] stack, and routing with rows of no expert.
"""

from __future__ import annotations

import math

import torch

from ._spec import GroupedShape, OpSpec, check_out, f64, grads_of, kf, poison, randn

# ---- routing and the float64 reference ------------------------------------------------------------


def group_sizes(e: int, t: int, even: bool = False) -> list[int]:
    """Tokens per expert: shares e + 1 (skewed) or equal, rounded so that they sum to t."""
    shares = [1.0] * e if even else [i + 1.0 for i in range(e)]
    total, acc, ends = sum(shares), 0.0, []
    for s in shares:
        acc += s
        ends.append(round(acc / total * t))
    ends[-1] = t
    return [b - a for a, b in zip([0] + ends[:-1], ends)]


def grouped_ref(x, w, offsets):
    """out[r] = x[r] w[e]^T for the rows of group e (the clamp rule of grouped_mm.h), float64."""
    t, ends, lo = x.shape[0], [], 0
    m = None
    for v in offsets.tolist():
        m = v if m is None else max(m, v)
        ends.append(min(max(m, 0), t))
    out = x.new_zeros((t, w.shape[1]), dtype=f64)
    for e, hi in enumerate(ends):
        if hi > lo:
            out[lo:hi] = x[lo:hi].to(f64) @ w[e].to(f64).t()
        lo = hi
    return out


# ---- bytes and FLOPs ------------------------------------------------------------------------------


def _bytes(shape: GroupedShape, mode: str, elt: int) -> int:
    # x, w read, out written (informational: the op is compute-bound)
    fwd = (shape.t * shape.k + shape.e * shape.n * shape.k + shape.t * shape.n) * elt
    return fwd * 3 if mode == "fwdbwd" else fwd


def _flops(shape: GroupedShape, mode: str) -> int:
    fwd = 2 * shape.t * shape.n * shape.k
    return 3 * fwd if mode == "fwdbwd" else fwd


# ---- bench ----------------------------------------------------------------------------------------


def _make(e, t, n, k, dtype, device, gen, sizes, w_kn=False):
    """x ~ N(0, 1) [T, K], w ~ N(0, 1 / K) [E, N, K] (or the transposed view of a [E, K, N] stack), dy ~ N(0, 1)."""
    scale = 1 / math.sqrt(max(k, 1))
    w = (randn(gen, device, dtype, e, k, n, scale=scale).transpose(1, 2) if w_kn
         else randn(gen, device, dtype, e, n, k, scale=scale))
    ends = torch.tensor(sizes, dtype=torch.int64).cumsum(0)
    return {"x": randn(gen, device, dtype, t, k), "w": w, "offsets": ends.to(device=device, dtype=torch.int32),
            "dy": randn(gen, device, dtype, t, n), "sizes": list(sizes)}


def _inputs(shape: GroupedShape, dtype, device, gen):
    return _make(shape.e, shape.t, shape.n, shape.k, dtype, device, gen, group_sizes(shape.e, shape.t, shape.even))


def _kf_run(t):
    return (kf().grouped_mm(t["x"], t["w"], t["offsets"]),)


class _Loop(torch.autograd.Function):
    """One cuBLAS GEMM per expert, written into slices of one output (no concatenation copy); the
    backward: dx the same way, dw[e] = dy_e^T x_e per expert (an empty expert's dw zeroed)."""

    @staticmethod
    def forward(ctx, x, w, sizes):
        ctx.save_for_backward(x, w)
        ctx.sizes = sizes
        out = x.new_empty((x.shape[0], w.shape[1]))
        lo = 0
        for e, s in enumerate(sizes):
            if s:
                torch.mm(x[lo:lo + s], w[e].t(), out=out[lo:lo + s])
            lo += s
        if lo < x.shape[0]:
            out[lo:].zero_()
        return out

    @staticmethod
    def backward(ctx, dy):
        x, w = ctx.saved_tensors
        dx = x.new_zeros(x.shape) if ctx.needs_input_grad[0] else None
        dw = w.new_empty(w.shape) if ctx.needs_input_grad[1] else None
        lo = 0
        for e, s in enumerate(ctx.sizes):
            if dx is not None and s:
                torch.mm(dy[lo:lo + s], w[e], out=dx[lo:lo + s])
            if dw is not None:
                if s:
                    torch.mm(dy[lo:lo + s].t(), x[lo:lo + s], out=dw[e])
                else:
                    dw[e].zero_()
            lo += s
        return dx, dw, None


def _loop():
    return lambda t: (_Loop.apply(t["x"], t["w"], t["sizes"]),)


def _torch_grouped():
    """torch._grouped_mm(x, w^T, offs): torch's grouped GEMM (sm_90 fast path for bfloat16)."""
    fn = getattr(torch, "_grouped_mm", None)
    if fn is None:
        return None
    return lambda t: (fn(t["x"], t["w"].transpose(1, 2), offs=t["offsets"]),)


# Mixtral-like 8 experts 4096 -> 14336 (skewed and even), DeepSeek / Qwen-MoE-like 64 experts up (4096 -> 1536)
# and down (1536 -> 4096), 128 small experts (2048 -> 768), 16384 tokens.
SHAPES = (GroupedShape(8, 16384, 14336, 4096), GroupedShape(8, 16384, 14336, 4096, True),
          GroupedShape(64, 16384, 1536, 4096), GroupedShape(64, 16384, 4096, 1536),
          GroupedShape(128, 16384, 768, 2048))

# ---- check ----------------------------------------------------------------------------------------

# (E, T, N, K): one row; odd N and K (the portable kernel); aligned sizes (the wgmma kernel on sm_90);
# more experts than tokens (empty experts)
CHECK_SHAPES = ((1, 1, 8, 8), (3, 37, 19, 33), (4, 200, 64, 128), (8, 300, 136, 72), (16, 9, 24, 40))
VARIANTS = ({}, {"w_kn": True}, {"tail": True})


def _check_inputs(shape, v, dtype, device):
    e, t, n, k = shape
    sizes = group_sizes(e, t)
    if v.get("tail"):  # a quarter of the rows belong to no expert (written as 0)
        keep = t - t // 4
        sizes = group_sizes(e, keep) if keep else [0] * e
    gen = torch.Generator(device=device).manual_seed(0) if torch.device(device).type == "cuda" else None
    return _make(e, t, n, k, dtype, device, gen, sizes, w_kn=v.get("w_kn", False))


def _grads(t, y_of):
    leaves = {k: t[k].detach().clone().requires_grad_(True) for k in ("x", "w")}
    y = y_of(leaves["x"], leaves["w"], t["offsets"])
    return y, {"y": y.detach(), **grads_of([y], [t["dy"]], leaves, ["x", "w"], t)}


def _check_run(kfm, t, v):
    shape = (t["x"].shape[0], t["w"].shape[1])
    poison([shape, tuple(t["w"].shape)], t["x"].dtype, t["x"].device)
    y, res = _grads(t, kfm.grouped_mm)
    check_out("y", y, shape, t["x"].dtype)
    return res


def _cpp_reference(a, v):
    """kf.grouped_mm on float64 CPU tensors: the C++ reference and its autograd."""
    return _grads(a, kf().grouped_mm)[1]


def _reference(a, v):
    return _grads(a, grouped_ref)[1]


GROUPED_MM = OpSpec(
    name="grouped_mm", family="gemm", shape_kind="grouped",
    inputs=_inputs, run=_kf_run, grad_inputs=("x", "w"), grad_outputs=("dy",), outputs=("y",),
    row_bytes=_bytes, flops=_flops, shapes=SHAPES, providers=("kernelforge", "torch_grouped", "loop"),
    extra_peers={"torch_grouped": _torch_grouped, "loop": _loop},
    modes=("fwd", "fwdbwd"), dtypes=(torch.bfloat16, torch.float16), bound="compute",
    check_shapes=CHECK_SHAPES, variants=VARIANTS, check_inputs=_check_inputs, check_run=_check_run,
    cpp_reference=_cpp_reference, reference=_reference, check_label=lambda s: "e{}t{}n{}k{}".format(*s),
    grad_tol_factor=2.0,
)

SPECS = (GROUPED_MM,)
