"""Tile IR contraction kernel with an mma row (TILE=mma_m16n8k16_*) -> Kernel IR MmaTile.

The schedule space offers mma atoms only for a fold that sums the product of two f16 or bf16
operands (schedule.shape): each a load (through casts to f32), or elementwise work on one load and
literals (a prologue: relu(x) @ w), which each warp applies to the elements of its fragments in
registers before the mma; the tensor cores compute the rest. Each operand's panel layout follows its source:
K along the panel's columns when the source is contiguous along K, else along its rows (then
ldmatrix transposes), so that panels fill with 16-byte copies either way.
"""

from __future__ import annotations

from math import prod

from emmy.affine import Dim
from emmy.dtypes import DType
from emmy.kernel_ir.lower_common import contraction_parts, flat_index, free_loops, split_outputs, vectorizable
from emmy.kernel_ir.nodes import KernelIR, MmaOperand, MmaTile, Tile
from emmy.schedule.knobs import STAGE_ASYNC, STAGE_TMA
from emmy.schedule.shape import load_vars, mma_operand
from emmy.loop_ir import nodes as L
from emmy.tile_ir.nodes import Epilogue, Fold, TileKernel

PANEL_VECTOR = 8  # f16/bf16 elements in a 16-byte copy
BANK_GROUPS = 8  # 16-byte chunks of one 128-byte line of shared memory: 32 banks of 4 bytes


def panel_swizzle(cols: int) -> tuple[int, int]:
    """(shift, mask) of a panel with `cols` 16-bit elements a row: its 16-byte chunk c of row r is
    stored at chunk c ^ ((r >> shift) & mask). Each 8x8 matrix an ldmatrix reads is one chunk of 8
    consecutive rows from a multiple of 8; stored as they are, rows 128 bytes or more apart share
    their banks (an 8-way conflict for a 128-element row) and 32- or 64-byte rows half of them. The
    XOR spreads the 8 rows over the 8 chunks of a 128-byte line, with no padding (the panel's bytes
    stay those the cost model counts). (0, 0) where the chunks a row are not a power of two of at
    least 2 (one chunk a row is conflict-free as it is)."""
    chunks = cols // PANEL_VECTOR
    if cols % PANEL_VECTOR or chunks < 2 or chunks & (chunks - 1):
        return 0, 0
    if chunks >= BANK_GROUPS:
        return 0, BANK_GROUPS - 1
    return (BANK_GROUPS // chunks).bit_length() - 1, chunks - 1  # rows sharing a line take turns


def supports_mma(tile: TileKernel, types: dict | None = None, memo: dict | None = None) -> str:
    """Why an mma row of this contraction cannot be lowered, or "" when it can."""
    row, g = tile.row, tile.geometry
    if row.reduce.atomic and tile.kernel.type.dtype is not DType.F32:
        return f"REDUCE={row.REDUCE}: atomics into a {tile.kernel.type.dtype} output are not lowered yet"

    memo = {} if memo is None else memo
    if "mma parts" not in memo:  # the fold structure is the kernel's, not the row's
        # a prologue is applied whole, its roundings too (schedule.shape.mma_operand admitted it)
        memo["mma parts"] = contraction_parts(tile) or ("" if tile.shape.prologue else _rounding_casts(tile))
    if memo["mma parts"]:
        return memo["mma parts"]
    if g.stage_how == STAGE_ASYNC and g.stage_depth < 2:
        return "a cp.async pipeline needs at least 2 stages"
    if g.stage_how == STAGE_TMA and types is not None:
        if "tma" not in memo:  # which operands a tensor map covers depends on the kernel, not the row
            memo["tma"] = next((o.buffer for o in _operands(tile, types) if not o.tma), "")
        if memo["tma"]:
            return (f"STAGE={row.STAGE}: operand {memo['tma']} is not read as row-major matrices a TMA "
                    "box can copy (strided, offset or rows not a multiple of 16 bytes)")
    return ""


def _rounding_casts(tile: TileKernel) -> str:
    """The tensor cores take the loaded values as they are: a cast on the way to the product that
    rounds (to a narrower type than the load's) would be skipped, so such a fold is refused."""
    (fold,) = [p for p in tile.parts if isinstance(p, Fold)]
    defs = {s.name: s for s in fold.lift if isinstance(s, L.Assign)}
    for stmt in defs.values():
        if isinstance(stmt.expr, L.Op) and stmt.expr.op == "cast" and stmt.dtype is not DType.F32:
            source = defs.get(stmt.expr.args[0]) if isinstance(stmt.expr.args[0], str) else None
            if source is None or source.dtype is not stmt.dtype:
                return f"a cast to {stmt.dtype} before the product would be skipped by the tensor cores"
    return ""


def _loops(tile: TileKernel):
    loops, _ = free_loops(tile.kernel, tile.placement.free)
    shape = tile.shape
    m_vars = tuple((v, e) for v, e in loops if v in shape.m_vars)
    n_vars = tuple((v, e) for v, e in loops if v in shape.n_vars)
    batch = tuple((v, e) for v, e in loops if v not in shape.m_vars and v not in shape.n_vars)
    return m_vars, n_vars, batch


def _operands(tile: TileKernel, types: dict) -> tuple[MmaOperand, MmaOperand]:
    g, shape = tile.geometry, tile.shape
    m_vars, n_vars, batch = _loops(tile)
    (fold,) = [p for p in tile.parts if isinstance(p, Fold)]
    bm, bn, bk = g.tile_m, g.tile_n, g.tile_k
    prologues = _prologues(fold) if tile.shape.prologue else {}
    found = {}
    for stmt in fold.lift:
        if not (isinstance(stmt, L.Assign) and isinstance(stmt.expr, L.Load)):
            continue
        flat = flat_index(stmt.expr.buffer, stmt.expr.index, types)
        side = "a" if load_vars(stmt.expr) & set(shape.m_vars) else "b"
        outer = m_vars if side == "a" else n_vars
        last_var, last_extent = outer[-1]
        if stmt.expr.guards:  # filled an element at a time, the guards read per element (a convolution's padding)
            k_fast, width = True, 1
        elif vectorizable(flat, fold.var, PANEL_VECTOR):
            k_fast, width = True, PANEL_VECTOR
        elif last_extent % PANEL_VECTOR == 0 and vectorizable(flat, last_var, PANEL_VECTOR):
            k_fast, width = False, PANEL_VECTOR
        else:
            k_fast, width = True, 1
        span = bm if side == "a" else bn
        rows, cols = (span, bk) if k_fast else (bk, span)
        tma, first_row = _matrix_rows(flat, fold.var, outer, k_fast, batch, types[stmt.expr.buffer]) \
            if g.stage_how == STAGE_TMA and not stmt.expr.guards else (0, ())
        chain, value = prologues.get(stmt.name, ((), stmt.name))
        # a TMA box lands as it is in the tensor: those panels stay unswizzled
        shift, mask = panel_swizzle(cols) if g.stage_depth and g.stage_how != STAGE_TMA else (0, 0)
        found[side] = MmaOperand(name=stmt.name, buffer=stmt.expr.buffer, dtype=types[stmt.expr.buffer].dtype,
                                 side=side, index=flat, rows=rows, cols=cols, k_fast=k_fast, width=width, tma=tma,
                                 tma_batch_rows=first_row, guards=stmt.expr.guards, prologue=chain, value=value,
                                 swizzle_shift=shift, swizzle_mask=mask)
    return found["a"], found["b"]


def _prologues(fold: Fold) -> dict:
    """Load name -> (the elementwise statements that turn each loaded element into what the tensor
    cores multiply, the name of that value), for operands with a prologue (schedule.shape.mma_operand)."""
    defs = {s.name: s for s in fold.lift if isinstance(s, L.Assign)}
    (accumulate,) = [s for s in fold.combine if isinstance(s, L.Accumulate)]
    found = {}
    for arg in defs[accumulate.value].expr.args:
        operand = mma_operand(defs, arg)
        if operand is None or not operand[1]:
            continue
        chain = operand[1]
        (load,) = {a for s in chain for a in s.expr.args if isinstance(a, str) and isinstance(defs[a].expr, L.Load)}
        found[load] = (chain, defs[arg].expr.args[0])
    return found


def _matrix_rows(flat, k_var: int, outer, k_fast: bool, batch, type_) -> tuple[int, tuple]:
    """(elements per row, (batch variable, rows a step of it) for the batch's first row) when the operand reads its
    buffer as row-major matrices stacked by batch (index = fast + row * slow + whole rows per
    batch; one outer variable; rows of whole 16 bytes): a 2-D tensor map over the buffer covers
    it. (0, ()) when it does not. Rows a box reads past M or N feed only masked outputs."""
    if len(outer) != 1 or flat.const or any(not isinstance(a, Dim) for a, _ in flat.terms):
        return 0, ()
    coeffs = {a.index: c for a, c in flat.terms}
    ((outer_var, _),) = outer
    fast, slow = (k_var, outer_var) if k_fast else (outer_var, k_var)
    batch_vars = {v for v, _ in batch}
    if coeffs.get(fast) != 1 or slow not in coeffs or set(coeffs) - {fast, slow} - batch_vars:
        return 0, ()
    row = coeffs[slow]
    offsets = {v: c for v, c in coeffs.items() if v in batch_vars}
    if prod(type_.shape) % row or (row * type_.dtype.itemsize) % 16 or any(c % row for c in offsets.values()):
        return 0, ()
    return row, tuple((v, c // row) for v, c in sorted(offsets.items()))


def lower_mma(tile: TileKernel, types: dict, params) -> KernelIR:
    g, row = tile.geometry, tile.row
    work, atom = row.work, row.tile
    m_vars, n_vars, batch = _loops(tile)
    (fold,) = [p for p in tile.parts if isinstance(p, Fold)]
    (init,) = fold.init
    epilogue = tuple(s for p in tile.parts if isinstance(p, Epilogue) for s in p.body)
    a, b = _operands(tile, types)
    m_total, n_total = prod(e for _, e in m_vars), prod(e for _, e in n_vars)
    atomics, workspace, params = split_outputs(tile, ((init.acc, "sum"),), epilogue, params,
                                               prod(e for _, e in batch) or 1, m_total * n_total)
    body = MmaTile(atom=atom.atom, m_vars=m_vars, n_vars=n_vars, batch_vars=batch, k_var=fold.var,
                   k_extent=fold.extent, warps_m=work.warps_m, warps_n=work.warps_n, frag_m=atom.frag_m,
                   frag_n=atom.frag_n, k_chunks=atom.k_chunks, depth=g.stage_depth, how=g.stage_how, operands=(a, b),
                   acc=init.acc, epilogue=epilogue, split=g.split, atomics=atomics, workspace=workspace,
                   raster=g.raster_group)
    panel_bytes = sum(o.rows * o.cols * o.dtype.itemsize for o in (a, b)) * g.stage_depth
    tensor_maps = tuple((o.buffer, o.tma, o.rows, o.cols) for o in (a, b) if o.tma)
    tiles = -(-m_total // body.bm) * -(-n_total // body.bn)
    return KernelIR(name=tile.kernel.name, params=params,
                    tile=Tile(("m", "n"), body.bk, m_total * n_total, g.threads),
                    grid=(tiles, prod(e for _, e in batch) or 1, g.split), block=(g.threads, 1, 1), shared=(),
                    body=(body,), knobs=str(row), summary=tile.shape.describe(), dynamic_smem=panel_bytes,
                    tensor_maps=tensor_maps)
