"""One spec per op, read by `kforge bench`, `kforge check` and the tests.

    from kernelforge.specs import SPECS, TOL
    spec = SPECS["rms_norm"]
    t = spec.inputs((16384, 4096), torch.bfloat16, "cuda", None)
    spec.traffic((16384, 4096), "fwd", 2)     # minimum bytes

Families, in bench order: norm, activation, rope, softmax, loss, attention, decode, linear, gemm. Importing this
package needs no compiled extension; the kernelforge calls import it when they run.
"""

from __future__ import annotations

from . import (activation, attention, cross_entropy, decode, diagonal_matmul, dropout, fused_linear_rowsum, gemm,
               graph, grouped_mm, linear, norm, rope, softmax)
from ._spec import (MODES, TOL, AttnShape, BatchedRowsShape, BmmShape, DecodeShape, FlceShape, GroupedShape,
                    LinearShape, OpSpec, RopeShape, Tol, base_mode, shape_label, shape_rows)

FAMILIES = {
    "norm": norm.SPECS,
    "activation": activation.SPECS,
    "rope": rope.SPECS,
    "softmax": softmax.SPECS,
    "loss": cross_entropy.SPECS,
    "attention": attention.SPECS,
    "decode": decode.SPECS,
    "linear": linear.SPECS,
    "gemm": gemm.SPECS + grouped_mm.SPECS,
    "diagonal_matmul": diagonal_matmul.SPECS,
    "fused_linear_rowsum": fused_linear_rowsum.SPECS,
    "dropout": dropout.SPECS,
    "graph": graph.SPECS,
}
SPECS: dict[str, OpSpec] = {s.name: s for family in FAMILIES.values() for s in family}
OPS = tuple(SPECS)
# op groups of the command line: a family name, or "all"
GROUPS = {"all": OPS, **{f: tuple(s.name for s in specs) for f, specs in FAMILIES.items()}}

__all__ = ["SPECS", "OPS", "GROUPS", "FAMILIES", "TOL", "Tol", "OpSpec", "RopeShape", "FlceShape", "AttnShape",
           "DecodeShape", "LinearShape", "BatchedRowsShape", "BmmShape", "GroupedShape", "MODES", "base_mode", "shape_label", "shape_rows"]
