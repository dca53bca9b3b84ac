"""Tile IR attention kernel (a softmax-twisted fold over the keys whose element holds a q.k
contraction) with a SIMT row -> Kernel IR FlashRows.

A warp owns TILE f<E> query rows; its lanes share each score (the q.k dot split over the head
dimension, then a warp sum) and own the value columns lane, lane + 32, ... (each keeps its own
(m, d, z) state, as the Loop IR fold does). Statements of the fold are split by what they depend
on: per key and row (the mask, the dot, the scaled score) or per value column (the V load and
the state step). The dot's key-independent part (q and its cast) is held in registers for the
whole walk over the keys. K and V tiles of BN keys are staged in shared memory when STAGE says so.
"""

from __future__ import annotations

from math import prod


from emmy.kernel_ir.nodes import FlashRows, KernelIR, Panel, Tile
from emmy.loop_ir import nodes as L
from emmy.tile_ir.nodes import Epilogue, Fold, TileKernel

LANES = 32


def supports_flash(tile: TileKernel) -> str:
    """Why this attention row cannot be lowered, or "" when it can."""
    row, g = tile.row, tile.geometry
    if g.mma:
        return "tensor-core (mma) flash attention is not lowered yet"
    if g.split > 1:
        return f"REDUCE={row.REDUCE}: split-KV attention is not lowered yet"
    if g.stage_how == "smem-tma":
        return f"STAGE={row.STAGE}: TMA staging of the K and V tiles is not lowered yet"
    if g.vec > 1 and not g.stage_depth:
        return f"TILE={row.TILE}: vector loads along the head dimension come with staged K and V tiles"
    if g.stage_how == "smem-async" and g.stage_depth < 2:
        return "a cp.async pipeline needs at least 2 stages"
    folds = [p for p in tile.parts if isinstance(p, Fold)]
    if len(folds) != 1 or not isinstance(tile.parts[0], Fold) or folds[0].twist != "softmax":
        return "flash attention needs one softmax-twisted fold first"
    if len([s for s in folds[0].lift if isinstance(s, L.Loop)]) != 1:
        return "flash attention needs one q.k contraction inside its fold"
    return ""


def _uses(stmt) -> tuple[set[str], set[int]]:
    """The SSA names and loop variables a statement reads."""
    names, dims = set(), set()

    def operand(o):
        if isinstance(o, str):
            names.add(o)

    if isinstance(stmt, L.Assign):
        e = stmt.expr
        if isinstance(e, L.Load):
            dims.update(*(a.dims() for a in e.index))
        elif isinstance(e, L.Op):
            for a in e.args:
                operand(a)
        elif isinstance(e, L.Masked):
            operand(e.value)
            dims.update(*(g.expr.dims() for g in e.guards))
    elif isinstance(stmt, (L.Accumulate, L.Update)):
        operand(stmt.value)
        names.add(stmt.acc)
    return names, dims


def _split(stmts, per: set[str], vars_: set[int]) -> tuple[tuple, tuple]:
    """(statements that do not depend on `vars_` or the names in `per`, those that do), each in order."""
    shared, dependent = [], []
    per = set(per)
    for s in stmts:
        names, dims = _uses(s) if not isinstance(s, L.Loop) else (set(), set())
        if names & per or dims & vars_:
            dependent.append(s)
            per.add(getattr(s, "name", None) or getattr(s, "acc", None))
        else:
            shared.append(s)
    return tuple(shared), tuple(dependent)


def lower_flash(tile: TileKernel, types: dict, params) -> KernelIR:
    from emmy.kernel_ir.lower import _free_loops, _vectorizable, flat_index

    g, shape = tile.geometry, tile.shape
    loops, _ = _free_loops(tile.kernel, tile.placement.free)
    row_vars = tuple((v, e) for v, e in loops if v in shape.m_vars)
    col_vars = tuple((v, e) for v, e in loops if v in shape.n_vars)
    batch = tuple((v, e) for v, e in loops if v not in shape.m_vars and v not in shape.n_vars)
    (fold,) = [p for p in tile.parts if isinstance(p, Fold)]
    epilogue = tuple(s for p in tile.parts if isinstance(p, Epilogue) for s in p.body)
    (dot,) = [s for s in fold.lift if isinstance(s, L.Loop)]
    cols = prod(e for _, e in col_vars)
    state = {i.acc for i in fold.init}
    per_key, per_col = _split(fold.lift + fold.combine, state, {v for v, _ in col_vars})
    # the dot's statements that do not read the key: computed once per row, kept in registers
    held, dot_body = _split(dot.body, set(), {fold.var})
    held = tuple(s for s in held if isinstance(s, L.Assign))
    keys = g.tile_k  # BN: keys a step
    panels = []
    if g.stage_depth:
        for stmt, column_var, extent in [(s, dot.var, dot.extent) for s in dot_body] + \
                [(s, None, cols) for s in per_col]:
            if not (isinstance(stmt, L.Assign) and isinstance(stmt.expr, L.Load)):
                continue
            flat = flat_index(stmt.expr.buffer, stmt.expr.index, types)
            if fold.var not in flat.dims():
                continue
            fast = column_var if column_var is not None else col_vars[-1][0]
            width = g.vec if g.vec > 1 and _vectorizable(flat, fast, g.vec) and \
                (column_var is not None or col_vars[-1][1] % g.vec == 0) else 1
            panels.append(Panel(stmt.name, stmt.expr.buffer, types[stmt.expr.buffer].dtype,
                                "k" if column_var is not None else "v", keys, extent, True, width))
    rows = prod(e for _, e in row_vars)
    warps = g.threads // LANES
    body = FlashRows(row_vars, col_vars, batch, fold.var, fold.extent, dot.var, dot.extent, g.elems, warps, keys,
                     -(-cols // LANES), -(-dot.extent // LANES), g.stage_depth, g.stage_how, tuple(panels),
                     fold.init, per_key, held, dot_body, per_col, epilogue)
    panel_bytes = g.stage_depth * sum(p.rows * p.cols * p.dtype.itemsize for p in panels)
    blocks = -(-rows // (warps * g.elems))
    return KernelIR(tile.kernel.name, params, Tile(("row", "col"), fold.extent, rows, g.threads),
                    (blocks, prod(e for _, e in batch) or 1, 1), (g.threads, 1, 1), (), (body,), str(tile.row),
                    tile.shape.describe(), dynamic_smem=panel_bytes)



