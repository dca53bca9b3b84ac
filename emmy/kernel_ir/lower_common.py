"""What the three lowerings (lower.py: maps, rows, SIMT contractions; lower_mma.py; lower_flash.py)
share: the free loops that place a kernel's rows, flat addresses and whether they take vectors, how
a contraction's parts are laid out, and how a split contraction hands on its partial results."""

from __future__ import annotations

from emmy.affine import Affine, Dim, recombined, row_major_offset
from emmy.dtypes import DType
from emmy.errors import NotLoweredError
from emmy.kernel_ir.nodes import Param
from emmy.loop_ir import nodes as L
from emmy.schedule.geometry import workspace_name
from emmy.tile_ir.nodes import Fold, Sweep, TileKernel

MONOID = {"add": "sum", "sum": "sum", "maximum": "max", "max": "max", "minimum": "min", "min": "min",
          "multiply": "prod", "prod": "prod"}


Unsupported = NotLoweredError  # a schedule the Kernel IR lowering does not handle yet

def contraction_parts(tile: TileKernel) -> str:
    """A contraction lowers as one fold, then its epilogue; statements before the fold (a mask
    from the output's indices) join the epilogue when the fold does not read them."""
    folds = [p for p in tile.parts if isinstance(p, Fold)]
    if len(folds) != 1 or any(isinstance(p, Sweep) for p in tile.parts):
        return "a contraction with sweeps or several folds is not lowered yet"
    before = {s.name for p in tile.parts[:tile.parts.index(folds[0])] for s in p.body if isinstance(s, L.Assign)}
    read = {a for s in folds[0].lift + folds[0].combine for a in getattr(getattr(s, "expr", None), "args", ())}
    read |= {getattr(s, "value", None) for s in folds[0].lift + folds[0].combine}
    if before & read:
        return "a contraction whose fold reads statements computed before it is not lowered yet"
    return ""


def free_loops(kernel: L.Kernel, free: tuple[int, ...]) -> tuple[list[tuple[int, int]], tuple]:
    """The chain of free loops at the top of the kernel and the body inside them (L.row_nest)."""
    return L.row_nest(kernel.body, free)


def flat_index(buffer: str, index: tuple[Affine, ...], types: dict) -> Affine:
    # a merged reduction's reshape reads back as one contiguous walk
    return recombined(row_major_offset(index, types[buffer].shape))


def vectorizable(flat: Affine, var: int, width: int) -> bool:
    """The index walks `var` with stride 1 and starts every vector on a multiple of `width` (a
    div/mod term anywhere is taken one element at a time: its alignment is not checked)."""
    if width == 1:
        return False
    step = 0
    for atom, c in flat.terms:
        if not isinstance(atom, Dim):
            return False
        if atom.index == var:
            step = c
        elif c % width:
            return False
    return step == 1 and flat.const % width == 0


def split_outputs(tile: TileKernel, monoids, epilogue, params, batch_total: int, outputs: int,
                  register: DType = DType.F32):
    """How a contraction split along K (REDUCE=g<N>a or g<N>k) hands on its partial results:
    (accumulators combined atomically into the output, workspace buffer name, params with the
    workspace added). The schedule allows atomics only for one accumulator stored raw. The
    workspace holds the accumulators' `register` type (f64 partial sums stay f64)."""
    split = tile.geometry.split
    if split > 1 and tile.row.reduce.atomic:
        if len(monoids) != 1 or not all(isinstance(s, L.Store) and s.value == monoids[0][0] for s in epilogue):
            raise Unsupported(f"kernel {tile.kernel.name}: an atomic split needs one accumulator stored raw")
        return monoids, "", params
    if split > 1:  # [accumulator][split][batch][M][N]
        workspace = workspace_name(tile.kernel.name)
        return (), workspace, (*params, Param(workspace, register, True, len(monoids) * split * batch_total * outputs))
    return (), "", params
