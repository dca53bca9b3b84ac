"""Tile IR attention kernel (a softmax-twisted fold over the keys whose element holds a q.k
contraction) -> Kernel IR: FlashMma for mma rows, FlashRows for SIMT rows.

Tensor cores (FlashMma): the fold is recognised as a softmax-weighted sum (`_mma_pieces`: the
q.k dot of two loads, a running maximum, the state that reads the V load) and computed as
S = Q K^T, then O += P V, a block of keys at a time.

SIMT (FlashRows): a warp owns TILE f<E> query rows; its lanes share each score (the q.k dot split over the head
dimension, then a warp sum) and own the value columns lane, lane + 32, ... (each keeps its own
(m, d, z) state, as the Loop IR fold does). Statements of the fold are split by what they depend
on: per key and row (the mask, the dot, the scaled score) or per value column (the V load and
the state step). The dot's key-independent part (q and its cast) is held in registers for the
whole walk over the keys. K and V tiles of BN keys are staged in shared memory when STAGE says so.
"""

from __future__ import annotations

from math import prod

from emmy.kernel_ir.lower_common import flat_index, free_loops, vectorizable
from emmy.kernel_ir.lower_mma import panel_swizzle
from emmy.kernel_ir.nodes import FlashMma, FlashRows, KernelIR, MmaOperand, Panel, Tile
from emmy.schedule.key_bounds import key_range_guards, running_max
from emmy.schedule.knobs import STAGE_ASYNC, STAGE_TMA
from emmy.loop_ir import nodes as L
from emmy.tile_ir.nodes import Epilogue, Fold, Sweep, TileKernel

LANES = 32


def supports_flash(tile: TileKernel, memo: dict | None = None) -> str:
    """Why this attention row cannot be lowered, or "" when it can (`memo`: kept across one
    kernel's rows, for what depends on the kernel only)."""
    row, g = tile.row, tile.geometry
    if g.split > 1:
        return f"REDUCE={row.REDUCE}: split-KV attention is not lowered yet"
    if g.stage_how == STAGE_TMA:
        return f"STAGE={row.STAGE}: TMA staging of the K and V tiles is not lowered yet"
    if g.vec > 1 and not g.stage_depth:
        return f"TILE={row.TILE}: vector loads along the head dimension come with staged K and V tiles"
    if g.stage_how == STAGE_ASYNC and g.stage_depth < 2:
        return "a cp.async pipeline needs at least 2 stages"
    memo = {} if memo is None else memo
    if "fold" not in memo:  # the fold structure is the kernel's, not the row's
        memo["fold"] = _fold_shape(tile)
    if memo["fold"]:
        return memo["fold"]
    if g.mma:
        if any(s.expr.guards for p in tile.parts if isinstance(p, Fold) for s in _loads(_flat(p.lift))):
            return "tensor-core flash attention: a guarded load (a concatenation or padding of q, k or v) " \
                   "is not staged for tensor cores yet"
        if "mma" not in memo:
            try:
                _mma_pieces(tile)
                memo["mma"] = ""
            except ValueError as why:
                memo["mma"] = f"tensor-core flash attention: {why}"
        return memo["mma"]
    return ""


def _fold_shape(tile: TileKernel) -> str:
    folds = [p for p in tile.parts if isinstance(p, Fold)]
    if len(folds) != 1 or not isinstance(tile.parts[0], Fold) or folds[0].twist != "softmax":
        return "flash attention needs one softmax-twisted fold first"
    if any(isinstance(p, Sweep) for p in tile.parts):
        # the template stores once per row after the fold; a sweep's stores would be dropped
        return "flash attention: a sweep over the keys after the fold is not lowered"
    dots = [s for s in folds[0].lift if isinstance(s, L.Loop)]
    if len(dots) != 1:
        return "flash attention needs one q.k contraction inside its fold"
    if any(isinstance(s, L.Loop) for s in _flat(dots[0].body)):
        # a projection fused into the dot (k = x @ w computed per score): its sums would need
        # their own accumulators per lane, and it recomputes the projection per query
        return "flash attention: a contraction nested in the q.k dot (a fused projection) is not lowered"
    per_key, _ = _split(folds[0].lift + folds[0].combine, {i.acc for i in folds[0].init}, set(tile.shape.n_vars))
    if not any(isinstance(s, L.Loop) for s in per_key):
        return "flash attention needs a q.k contraction that does not read the value columns or the state"
    if any(len({a.acc for a in s.body if isinstance(a, L.Accumulate)}) != 1 for s in per_key if isinstance(s, L.Loop)):
        # the lanes reduce one sum per key (q.k); a loop summing more beside it (a bottleneck
        # attention's relative-position logits, timm's SEBotNet) has no template yet
        return "flash attention: a per-key dot product with several sums is not lowered"
    return ""


def _flat(stmts) -> list:
    """Statements, those of nested loops included."""
    out, stack = [], list(reversed(stmts))
    while stack:
        stmt = stack.pop()
        out.append(stmt)
        if isinstance(stmt, L.Loop):
            stack.extend(reversed(stmt.body))
    return out


def _loads(stmts) -> list:
    return [s for s in stmts if isinstance(s, L.Assign) and isinstance(s.expr, L.Load)]


def _source(defs: dict, name: str) -> str:
    """The load a value comes from through casts ("" when it is computed otherwise)."""
    while name in defs:
        e = defs[name].expr
        if isinstance(e, L.Load):
            return name
        if not (isinstance(e, L.Op) and e.op == "cast"):
            return ""
        name = e.args[0]
    return ""


def _mma_pieces(tile: TileKernel):
    """(dot loop, q load, k load, v load, score statements, score name, (m, d, z)) of a
    softmax-weighted-sum fold whose tensor-core form is S = Q K^T, O += P V; ValueError says what
    does not fit."""
    shape = tile.shape
    (fold,) = [p for p in tile.parts if isinstance(p, Fold)]
    (dot,) = [s for s in fold.lift if isinstance(s, L.Loop)]
    state = [i.acc for i in fold.init]
    if len(state) != 3:
        raise ValueError(f"a softmax fold with {len(state)} state values (not m, d, z)")
    per_key, per_col = _split(fold.lift + fold.combine, set(state), set(shape.n_vars))
    accs = [s for s in dot.body if isinstance(s, L.Accumulate)]
    defs = {s.name: s for s in dot.body if isinstance(s, L.Assign)}
    if len(accs) != 1 or accs[0].op not in ("add", "sum") or len(_loads(dot.body)) != 2:
        raise ValueError("the q.k dot is not a sum of products of two loads")
    product = defs.get(accs[0].value)
    if product is None or not isinstance(product.expr, L.Op) or product.expr.op != "multiply":
        raise ValueError("the q.k dot is not a sum of products of two loads")
    sources = [_source(defs, a) for a in product.expr.args if isinstance(a, str)]
    if len(sources) != 2 or not all(sources):
        raise ValueError("the q.k dot is not a sum of products of two loads")
    key_side = [n for n in sources if fold.var in set().union(*(a.dims() for a in defs[n].expr.index))]
    if len(key_side) != 1:
        raise ValueError("one operand of the q.k dot must read the key")
    k_load = defs[key_side[0]]
    q_load = defs[next(n for n in sources if n != key_side[0])]
    col_defs = {s.name: s for s in per_col if isinstance(s, L.Assign)}
    v_loads = _loads(per_col)
    if len(v_loads) != 1:
        raise ValueError("the weighted sum must read one value tensor")
    maxima = [s for s in per_col if isinstance(s, L.Assign) and isinstance(s.expr, L.Op)
              and s.expr.op == "maximum" and set(s.expr.args) & set(state)]
    if len(maxima) != 1:
        raise ValueError("no running maximum in the fold's step")
    m = next(a for a in maxima[0].expr.args if a in state)
    score = next(a for a in maxima[0].expr.args if a != m)
    weight_users = {n for n, st in col_defs.items() if _source(col_defs, n) == v_loads[0].name}
    uses = {}
    for st in per_col:  # which state accumulator's step reads the weight
        names, _ = _uses(st)
        key = getattr(st, "name", None) or getattr(st, "acc", None)
        uses[key] = set(names) | set().union(*(uses.get(n, set()) for n in names))
    z = [a for a in state if a != m and (uses.get(a, set()) & weight_users)]
    if len(z) != 1 or not isinstance(score, str):
        raise ValueError("the fold's step is not a softmax-weighted sum of the value tensor")
    d = next(a for a in state if a not in (m, z[0]))
    scores = tuple(st for st in per_key if not isinstance(st, L.Loop) and getattr(st, "acc", None) != accs[0].acc)
    return dot, q_load, k_load, v_loads[0], scores, score, accs[0].acc, (m, d, z[0])


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
    elif isinstance(stmt, L.Loop):  # what its body reads from outside it
        for inner in stmt.body:
            more_names, more_dims = _uses(inner)
            names |= more_names
            dims |= more_dims - {stmt.var}
        names -= {getattr(inner, "name", None) or getattr(inner, "acc", None) for inner in stmt.body}
    return names, dims


def _split(stmts, per: set[str], vars_: set[int]) -> tuple[tuple, tuple]:
    """(statements that do not depend on `vars_` or the names in `per`, those that do), each in order."""
    shared, dependent = [], []
    per = set(per)
    for s in stmts:
        names, dims = _uses(s)
        if names & per or dims & vars_:
            dependent.append(s)
            per.add(getattr(s, "name", None) or getattr(s, "acc", None))
        else:
            shared.append(s)
    return tuple(shared), tuple(dependent)


def lower_flash(tile: TileKernel, types: dict, params) -> KernelIR:
    if tile.geometry.mma:
        return _lower_flash_mma(tile, types, params)

    g, shape = tile.geometry, tile.shape
    loops, _ = free_loops(tile.kernel, tile.placement.free)
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
            if not (isinstance(stmt, L.Assign) and isinstance(stmt.expr, L.Load)) or stmt.expr.guards:
                continue  # a guarded load is read where its guards hold, from global memory
            flat = flat_index(stmt.expr.buffer, stmt.expr.index, types)
            if fold.var not in flat.dims():
                continue
            fast = column_var if column_var is not None else col_vars[-1][0]
            width = g.vec if g.vec > 1 and vectorizable(flat, fast, g.vec) and \
                (column_var is not None or col_vars[-1][1] % g.vec == 0) else 1
            panels.append(Panel(name=stmt.name, buffer=stmt.expr.buffer, dtype=types[stmt.expr.buffer].dtype,
                                side="k" if column_var is not None else "v", rows=keys, cols=extent, k_fast=True,
                                width=width))
    rows = prod(e for _, e in row_vars)
    warps = g.threads // LANES
    key_range = _key_range(fold, row_vars, batch)
    body = FlashRows(key_range=key_range, running_max=running_max(fold.lift + fold.combine, state) if key_range else "",
                     row_vars=row_vars, col_vars=col_vars, batch_vars=batch, key_var=fold.var, key_extent=fold.extent,
                     inner_var=dot.var, inner_extent=dot.extent, rows_per_warp=g.elems, warps=warps, keys_step=keys,
                     cols_per_lane=-(-cols // LANES), inner_per_lane=-(-dot.extent // LANES), depth=g.stage_depth,
                     how=g.stage_how, panels=tuple(panels), inits=fold.init, per_key=per_key, held=held, dot=dot_body,
                     per_col=per_col, epilogue=epilogue)
    panel_bytes = g.stage_depth * sum(p.rows * p.cols * p.dtype.itemsize for p in panels)
    blocks = -(-rows // (warps * g.elems))
    return KernelIR(name=tile.kernel.name, params=params, tile=Tile(("row", "col"), fold.extent, rows, g.threads),
                    grid=(blocks, prod(e for _, e in batch) or 1, 1), block=(g.threads, 1, 1), shared=(),
                    body=(body,), knobs=str(tile.row), summary=tile.shape.describe(), dynamic_smem=panel_bytes)





def _key_range(fold: Fold, row_vars, batch_vars) -> tuple:
    """The fold's guards bounding its keys (a causal bound, a window) over the block's row and batch
    variables (emmy.schedule.key_bounds)."""
    return key_range_guards(fold.lift + fold.combine, fold.var, {v for v, _ in row_vars} | {v for v, _ in batch_vars})


def _lower_flash_mma(tile: TileKernel, types: dict, params) -> KernelIR:
    g, shape, row = tile.geometry, tile.shape, tile.row
    loops, _ = free_loops(tile.kernel, tile.placement.free)
    row_vars = tuple((v, e) for v, e in loops if v in shape.m_vars)
    col_vars = tuple((v, e) for v, e in loops if v in shape.n_vars)
    batch = tuple((v, e) for v, e in loops if v not in shape.m_vars and v not in shape.n_vars)
    dot, q_load, k_load, v_load, scores, score, dot_acc, state = _mma_pieces(tile)
    (fold,) = [p for p in tile.parts if isinstance(p, Fold)]
    epilogue = tuple(s for p in tile.parts if isinstance(p, Epilogue) for s in p.body)
    warps, fm, fn = row.work.warps_m, row.tile.frag_m, row.tile.frag_n
    bm, bn, cols = 16 * fm * warps, 8 * fn, prod(e for _, e in col_vars)

    def operand(stmt, side, rows, columns, column_var=None):
        """A staged tile of `rows` x `columns`, filled 16 bytes at a time where the source runs
        contiguously along `column_var` (the head dimension for K, the last value column for V)."""
        flat = flat_index(stmt.expr.buffer, stmt.expr.index, types)
        dtype = types[stmt.expr.buffer].dtype
        width = 8 if column_var is not None and vectorizable(flat, column_var[0], 8) and column_var[1] % 8 == 0 \
            else 1
        shift, mask = panel_swizzle(columns) if g.stage_depth else (0, 0)  # ldmatrix without bank conflicts
        return MmaOperand(name=stmt.name, buffer=stmt.expr.buffer, dtype=dtype, side=side, index=flat, rows=rows,
                          cols=columns, k_fast=True, width=width, swizzle_shift=shift, swizzle_mask=mask)

    body = FlashMma(atom=row.tile.atom, row_vars=row_vars, col_vars=col_vars, batch_vars=batch, key_var=fold.var,
                    key_extent=fold.extent, inner_var=dot.var, inner_extent=dot.extent, warps=warps, frag_m=fm,
                    frag_n=fn, depth=g.stage_depth, how=g.stage_how, q=operand(q_load, "q", bm, dot.extent),
                    k=operand(k_load, "k", bn, dot.extent, (dot.var, dot.extent)),
                    v=operand(v_load, "v", -(-bn // 16) * 16, cols, col_vars[-1]), scores=scores, dot_acc=dot_acc,
                    score=score, state=state, epilogue=epilogue, key_range=_key_range(fold, row_vars, batch))
    panel_bytes = 0
    if g.stage_depth:
        q, k, v = body.q, body.k, body.v
        panel_bytes = (q.rows * q.cols + g.stage_depth * (k.rows * k.cols + v.rows * v.cols)) * q.dtype.itemsize
    rows = prod(e for _, e in row_vars)
    return KernelIR(name=tile.kernel.name, params=params, tile=Tile(("row", "col"), fold.extent, rows, g.threads),
                    grid=(-(-rows // bm), prod(e for _, e in batch) or 1, 1), block=(g.threads, 1, 1), shared=(),
                    body=(body,), knobs=str(row), summary=tile.shape.describe(), dynamic_smem=panel_bytes)
