"""Tile IR kernel -> Kernel IR, for map kernels and SIMT row kernels (REDUCE `` or `coop`).

Row kernels: with REDUCE=coop a block owns a row: its threads stride over each fold with
TILE's vectors, combine their partial states by warp shuffles and a shared-memory tree, and
sweep the row again to write it; with REDUCE= a thread owns a row. Map kernels: each thread
owns TILE's elements of the flattened output. Loads that walk the fold's (or sweep's) variable
contiguously, from an aligned start, are taken a vector at a time.
"""

from __future__ import annotations

import dataclasses
from math import ceil, prod

from emmy.dtypes import DType
from emmy.kernel_ir.nodes import (Broadcast, ColumnCombine, ContractionTile, ElementLoop, Fill, GridMerge, GridRows,
                                  KernelIR, MapElements, MmaTile, OnlyThread, Panel, Param, PartialSlot, RowIndex, Scalar,
                                  Smem, SplitFinish, Store, Sync, Tile, TreeHalve, VecLoad, VecStore, WarpShuffle,
                                  WorkspaceMerge)
from emmy.kernel_ir.lower_common import (MONOID, Unsupported, contraction_parts, flat_index, free_loops,
                                         split_outputs, vectorizable)
from emmy.kernel_ir.index_faults import INDEX_FAULTS, faults_param
from emmy.kernel_ir.lower_flash import lower_flash, supports_flash
from emmy.kernel_ir.lower_mma import lower_mma, supports_mma
from emmy.schedule.knobs import STAGE_ASYNC
from emmy.loop_ir import nodes as L
from emmy.loop_ir.bounds import out_of_bounds
from emmy.tensor_ir.scalar_ops import REDUCE_OPS
from emmy.schedule.geometry import held_bytes, held_steps, workspace_name
from emmy.schedule.held import held_loads, invariant_loads
from emmy.tile_ir.build import fold_tree, tile_kernel
from emmy.tile_ir.nodes import Epilogue, Fold, Sweep, TileKernel
from emmy.schedule.shape import load_vars, panel_side

# the twisted states the runtime header can merge across threads (emmy::merge_softmax,
# merge_softmax_wsum, merge_welford)
MERGED = {("softmax", 2), ("softmax", 3), ("welford", 3)}


def lowers_row(kernel, shape, row, types: dict, memo: dict) -> bool:
    """Whether this lowering takes `row` of a Loop IR kernel: the check the schedule wing is given
    (emmy.schedule.pricing.Lowers). `memo` is kept across one kernel's rows (its fold tree, bounds)."""
    if "_parts" not in memo:
        memo["_parts"] = fold_tree(kernel, shape)
    return not supports(tile_kernel(kernel, shape, row, memo["_parts"]), types, memo)


def supports(tile: TileKernel, types: dict | None = None, memo: dict | None = None) -> str:
    """Why the lowering cannot take this kernel's row, or "" when it can (`types`, buffer name ->
    TensorType, lets it look at the operands' layouts too). `memo`: a dict kept across the rows
    of one kernel, for what depends on the kernel only (operand layouts)."""
    row = tile.row
    memo = {} if memo is None else memo
    if types is not None and "bounds" not in memo:  # the kernel's accesses, whatever the row
        problems = out_of_bounds(tile.kernel, {name: t.shape for name, t in types.items()})
        memo["bounds"] = f"an access may fall outside its buffer: {problems[0]}" if problems else ""
    if types is not None and memo["bounds"]:
        return memo["bounds"]
    if tile.shape.kind == "contraction":
        return _supports_contraction(tile, types, memo)
    if tile.shape.kind == "attention":
        return supports_flash(tile, memo)
    if tile.shape.kind not in ("map", "row", "column"):
        return f"{tile.shape.kind} kernels are not lowered to Kernel IR yet"
    split_ok = tile.shape.kind in ("row", "column") and row.reduce.atomic and tile.kernel.type.dtype.value == "f32"
    workspace_ok = tile.shape.kind == "row" and (row.reduce.workspace or row.reduce.grid)
    blocking = [f"REDUCE={row.REDUCE}"] if row.reduce.split > 1 and not (split_ok or workspace_ok) else []
    held = row.stage.held and tile.shape.kind == "row" and (row.reduce.coop or row.reduce.grid)
    blocking += [f"{knob}={getattr(row, knob)}" for knob in ("STAGE", "RASTER")
                 if getattr(row, knob) and not (knob == "STAGE" and held)]
    if blocking:
        return f"{', '.join(blocking)} {'is' if len(blocking) == 1 else 'are'} not lowered yet"
    # a map recomputes what is hoisted above its loops per element; a row would lose it
    if tile.shape.kind in ("row", "column") and \
            len(L.row_nest(tile.kernel.body, tile.placement.free)[0]) != len(tile.placement.free):
        return "free loops that do not nest one inside the other are not lowered yet"
    if tile.geometry.vec > 1 and types is not None:
        if ("vectors", tile.geometry.vec) not in memo:  # which loads walk contiguously is the kernel's
            memo[("vectors", tile.geometry.vec)] = _vector_promise(tile, types)
        if memo[("vectors", tile.geometry.vec)]:
            return f"TILE={row.TILE}: {memo[('vectors', tile.geometry.vec)]}"
    if split_ok and tile.geometry.split > 1:
        try:
            _row_atomic(tile)
        except Unsupported as why:
            return f"REDUCE={row.REDUCE}: {why}"
    if workspace_ok:
        why = _workspace_split(tile)
        if why:
            return f"REDUCE={row.REDUCE}: {why}"
    if held and types is not None:
        key = ("held", row.STAGE, row.reduce.grid, tile.geometry.vec)  # what a row can hold: not its sizes
        if key not in memo:
            try:
                _lower_row_grid(tile, types, ()) if row.reduce.grid else _lower_row(tile, types, ())
                memo[key] = ""
            except Unsupported as why:
                memo[key] = f"STAGE={row.STAGE}: {why}"
        if memo[key]:
            return memo[key]
    if row.reduce.coop or split_ok or workspace_ok:  # folds merged across threads: the runtime header's merges
        for fold in (p for p in tile.parts if isinstance(p, Fold) and p.twist):
            state = len([i for i in fold.init if _in_state(i, fold)])
            if (fold.twist, state) not in MERGED:
                return f"REDUCE={row.REDUCE}: a {fold.twist} fold with {state} state values merges across threads " \
                       "only in registers of one thread yet"
    return ""


def _vector_promise(tile: TileKernel, types: dict) -> str:
    """Why a map or row kernel would not move TILE's vectors (a row whose knobs promise vectors
    emits them, or is not offered), or "" when it would."""
    width = tile.geometry.vec
    if tile.shape.kind == "map":
        loops, body = _map_nest(tile.kernel.body)
        if not loops or loops[-1][1] % width:
            return f"the innermost extent is not a multiple of {width}, so {width}-wide vectors would straddle rows"
        if not any(_vector_accesses(body, loops[-1][0], width, types)):
            return f"no load or store walks a{loops[-1][0]} contiguously from a {width}-aligned start"
        return ""
    walks = [(p.var, p.lift + p.combine if isinstance(p, Fold) else p.body) for p in tile.parts
             if isinstance(p, (Fold, Sweep))]
    if not any(any(_vector_accesses(body, var, width, types)) for var, body in walks):
        return f"no load of the row walks its fold contiguously from a {width}-aligned start"
    return ""


def _supports_contraction(tile: TileKernel, types: dict | None, memo: dict) -> str:
    row, g = tile.row, tile.geometry
    if g.mma:
        return supports_mma(tile, types, memo)
    if row.reduce.atomic and tile.kernel.type.dtype.value != "f32":
        return f"REDUCE={row.REDUCE}: atomics into a {tile.kernel.type.dtype} output are not lowered yet"
    if g.stage_how == STAGE_ASYNC and g.stage_depth < 2:
        return "a cp.async pipeline needs at least 2 stages"
    if "parts" not in memo:  # the fold structure is the kernel's, not the row's
        memo["parts"] = contraction_parts(tile)
    if memo["parts"]:
        return memo["parts"]
    folds = [p for p in tile.parts if isinstance(p, Fold)]
    if folds[0].twist:
        return "a twisted contraction fold is not lowered yet"
    if g.split > 1 and len({i.dtype.accumulator for i in folds[0].init}) > 1:  # one workspace type
        return f"REDUCE={row.REDUCE}: a split's accumulators are of several types"
    if g.stage_depth and types is not None:
        key = ("panels", g.tile_m, g.tile_n, g.tile_k, g.vec, g.micro_m)  # what they depend on besides the kernel
        if key not in memo:
            loops, _ = free_loops(tile.kernel, tile.placement.free)
            m_vars = tuple((v, e) for v, e in loops if v in tile.shape.m_vars)
            n_vars = tuple((v, e) for v, e in loops if v in tile.shape.n_vars)
            batch = tuple((v, e) for v, e in loops if v not in tile.shape.m_vars and v not in tile.shape.n_vars)
            panels = (_micro_panels if g.micro_m else _simt_panels)(tile, folds[0], m_vars, n_vars, batch, types)
            memo[key] = (len(panels), sum(p.rows * p.cols * p.dtype.itemsize for p in panels))
        count, per_stage = memo[key]
        if g.stage_depth * per_stage > STATIC_SMEM:
            return (f"STAGE={row.STAGE}: its {count} panels need {g.stage_depth * per_stage} bytes of static "
                    f"shared memory ({STATIC_SMEM} at most)")
    if g.vec > 1 and not g.micro_m and types is not None:  # a micro-tile's TILE promises no global vectors
        if ("vectors", g.vec) not in memo:  # which operands are contiguous along K is the kernel's
            memo[("vectors", g.vec)] = bool(_vector_accesses(folds[0].lift, folds[0].var, g.vec, types)[0])
        if not memo[("vectors", g.vec)]:
            return f"TILE={row.TILE}: no operand is contiguous along K to load {g.vec} at a time"
    return ""


def lower_kernel(tile: TileKernel, types: dict) -> list[KernelIR]:
    """The kernels that run `tile` in order (a split reduction's output is filled with the identity
    first). `types`: buffer name -> TensorType, for every buffer of the program."""
    why = supports(tile, types)
    if why:
        raise Unsupported(f"kernel {tile.kernel.name} ({tile.shape.describe()}, {tile.row}): {why}")
    params = _params(tile.kernel, types)
    if tile.shape.kind == "map":
        return [_lower_map(tile, types, params)]
    if tile.shape.kind == "attention":
        return [lower_flash(tile, types, params)]
    if tile.shape.kind == "contraction":
        main = lower_mma(tile, types, params) if tile.geometry.mma else _lower_contraction(tile, types, params)
        (body,) = main.body
        if body.split == 1:
            return [main]
        if body.workspace:
            return [main, _finishing_kernel(tile, main, body, types)]
        return [_fill_kernel(tile, types, REDUCE_OPS[body.atomics[0][1]]), main]
    if tile.shape.kind == "row" and tile.geometry.split > 1 and tile.row.reduce.workspace:
        return _lower_row_workspace(tile, types, params)
    if tile.shape.kind == "row" and tile.row.reduce.grid:
        return [_lower_row_grid(tile, types, params)]
    if tile.shape.kind == "column" and not tile.row.reduce.serial:
        main = _lower_column(tile, types, params)
    else:
        main = _lower_row(tile, types, params)
    if tile.geometry.split == 1:
        return [main]
    return [_fill_kernel(tile, types, REDUCE_OPS[_row_atomic(tile)]), main]


def _row_atomic(tile: TileKernel) -> str:
    """The monoid a row split's blocks combine their partial results with (one plain accumulator)."""
    folds = [p for p in tile.parts if isinstance(p, Fold)]
    if len(folds) != 1:
        raise Unsupported(f"kernel {tile.kernel.name}: an atomic split needs one fold, not {len(folds)}")
    (fold,) = folds
    monoids = {MONOID[s.op] for s in fold.combine if isinstance(s, L.Accumulate)}
    if len(monoids) != 1 or any(isinstance(s, L.Update) for s in fold.combine):
        raise Unsupported(f"kernel {tile.kernel.name}: an atomic split needs one monoid")
    if any(i.dtype.accumulator is not DType.F32 for i in fold.init):  # the runtime header's atomics combine f32
        raise Unsupported(f"kernel {tile.kernel.name}: an atomic split needs f32 accumulators")
    return monoids.pop()


def _workspace_split(tile: TileKernel) -> str:
    """Why a row cannot split its fold over blocks that hand their partial states on through a
    workspace, or "": one fold (REDUCE=g<N>s: one grid barrier a row), nothing stored before it
    (every block runs what precedes the fold), f32 accumulators (the workspace is f32), and for
    REDUCE=g<N>k nothing swept after it (a sweep would need the whole row's result in every block,
    which only the grid barrier of g<N>s gives)."""
    what = "a grid-synced row" if tile.row.reduce.grid else "a workspace split"
    folds = [p for p in tile.parts if isinstance(p, Fold)]
    if len(folds) != 1:
        return f"{what} needs one fold, not {len(folds)}"
    if not tile.row.reduce.grid and any(isinstance(p, Sweep) for p in tile.parts):
        return "a row swept after its fold cannot split it across blocks"
    before = tile.parts[:tile.parts.index(folds[0])]
    if any(isinstance(s, L.Store) for p in before for s in p.body):
        return "a row that stores before its fold cannot split it across blocks"
    if any(i.dtype.accumulator is not DType.F32 for i in folds[0].init):
        return f"{what} needs f32 accumulators (the workspace is f32)"
    return ""


def _lower_row_grid(tile: TileKernel, types: dict, params) -> KernelIR:
    """A grid-synced row (REDUCE=g<N>s): a cooperative grid of `split` blocks takes every row in
    turn; each block folds a whole-step slice of the row, combines it across its threads and leaves
    its partial state in a workspace ([accumulator][row parity][slice]: a row's states are written
    while the last row's may still be read); after a grid barrier the first warp of each block
    merges all of them (GridMerge), runs the row's epilogue (the row's results stored by the grid's
    first thread) and sweeps its slice of the row. One launch; the row's second read comes from L2,
    or from registers under STAGE=regs."""
    g = tile.geometry
    loops, _ = free_loops(tile.kernel, tile.placement.free)
    rows, split, threads, width = prod(e for _, e in loops), g.split, g.threads, g.vec
    unroll = max(1, g.elems // max(1, width))
    (fold,) = [p for p in tile.parts if isinstance(p, Fold)]
    groups = _fold_groups(fold)
    accs = [acc for _, _, group in groups for acc in group]
    workspace, size = workspace_name(tile.kernel.name), len(accs) * 2 * split
    plain = tuple(p for p in params if p.name != INDEX_FAULTS)
    faults = tuple(p for p in params if p.name == INDEX_FAULTS)
    body: list = []
    shared: list[Smem] = [Smem(DType.F32, "grid_partials", len(accs))]
    for part in tile.parts:
        if isinstance(part, Epilogue):
            body += [dataclasses.replace(n, who="grid_first") if isinstance(n, OnlyThread) else n
                     for n in _scalar_and_stores(part.body, types, True)]
        elif isinstance(part, Fold):
            body.append(Scalar(part.init))
            loop = _element_loop(part.var, part.extent, part.lift + part.combine, types, width, threads, unroll, "thread")
            body.append(dataclasses.replace(loop, split=split))
            combine, smem = _block_combine(part, threads)
            body += combine
            _add_shared(shared, smem)
            body.append(OnlyThread(tuple(Store(workspace, DType.F32, PartialSlot(slot, 2, split, alternate=True), acc)
                                         for slot, acc in enumerate(accs))))
            body.append(GridMerge(tuple((op, group) for op, _, group in groups), workspace, split, "grid_partials"))
        elif isinstance(part, Sweep):
            loop = _element_loop(part.var, part.extent, part.body, types, width, threads, unroll, "thread")
            body.append(dataclasses.replace(loop, split=split))
    if tile.row.stage.held:
        body = _held_row(tile, body, types)
    twists = ((fold.twist, tuple(i.acc for i in fold.init if _in_state(i, fold))),) if fold.twist else ()
    extent = max(p.extent for p in tile.parts if isinstance(p, (Fold, Sweep)))
    return KernelIR(name=tile.kernel.name, params=(*plain, Param(workspace, DType.F32, True, size), *faults),
                    tile=Tile(("row", "col"), extent, rows, threads), grid=(split, 1, 1), block=(threads, 1, 1),
                    shared=tuple(shared), body=(GridRows(tuple(loops), tuple(body)),), knobs=str(tile.row),
                    summary=tile.shape.describe(), twists=twists, cooperative=True, dynamic_smem=g.smem_bytes)


def _lower_row_workspace(tile: TileKernel, types: dict, params) -> list[KernelIR]:
    """A row split over `split` blocks (REDUCE=g<N>k): each block folds a whole-step slice,
    combines it across its threads and leaves its partial state in a workspace
    ([accumulator][row][slice]); a finishing kernel, a thread a row, merges the partial states in
    slice order and runs the row's epilogue. Statements before the fold run in both."""
    g = tile.geometry
    loops, _ = free_loops(tile.kernel, tile.placement.free)
    rows, split, threads = prod(e for _, e in loops), g.split, g.threads
    (fold,) = [p for p in tile.parts if isinstance(p, Fold)]
    before, after = tile.parts[:tile.parts.index(fold)], tile.parts[tile.parts.index(fold) + 1:]
    groups = _fold_groups(fold)
    accs = [acc for _, _, group in groups for acc in group]
    workspace, size = workspace_name(tile.kernel.name), len(accs) * split * rows
    plain = tuple(p for p in params if p.name != INDEX_FAULTS)
    faults = tuple(p for p in params if p.name == INDEX_FAULTS)
    body: list = [RowIndex(tuple(loops), "block", split)]
    for part in before:
        body += _scalar_and_stores(part.body, types, True)
    body.append(Scalar(fold.init))
    loop = _element_loop(fold.var, fold.extent, fold.lift + fold.combine, types, g.vec, threads,
                         max(1, g.elems // max(1, g.vec)), "thread")
    body.append(dataclasses.replace(loop, split=split))
    combine, shared = _block_combine(fold, threads)
    body += combine
    body.append(OnlyThread(tuple(Store(workspace, DType.F32, PartialSlot(slot, rows, split), acc)
                                 for slot, acc in enumerate(accs))))
    twists = ((fold.twist, tuple(i.acc for i in fold.init if _in_state(i, fold))),) if fold.twist else ()
    main = KernelIR(name=tile.kernel.name, params=(*plain, Param(workspace, DType.F32, True, size), *faults),
                    tile=Tile(("row", "col"), fold.extent, rows, threads), grid=(rows * split, 1, 1),
                    block=(threads, 1, 1), shared=tuple(shared), body=tuple(body), knobs=str(tile.row),
                    summary=tile.shape.describe(), twists=twists)
    finish_body: list = [RowIndex(tuple(loops), "thread")]
    for part in before:
        finish_body += _scalar_and_stores(part.body, types, False)
    finish_body.append(WorkspaceMerge(tuple((op, group) for op, _, group in groups), workspace, split, rows))
    for part in after:
        finish_body += _scalar_and_stores(part.body, types, False)
    block = min(256, -(-rows // 32) * 32)
    finish = KernelIR(name=f"{tile.kernel.name}_finish",
                      params=(*plain, Param(workspace, DType.F32, False, size), *faults),
                      tile=Tile(("row", "col"), 1, rows, 1), grid=(-(-rows // block), 1, 1), block=(block, 1, 1),
                      shared=(), body=tuple(finish_body), knobs=str(tile.row),
                      summary=f"{tile.shape.describe()}: the {split} partial states merged", twists=twists)
    return [main, finish]


def _fill_kernel(tile: TileKernel, types: dict, identity: float) -> KernelIR:
    output = tile.kernel.output
    total = prod(types[output].shape)
    return KernelIR(name=f"{tile.kernel.name}_fill", params=(Param(output, types[output].dtype, True),),
                    tile=Tile(("element",), 256, total, 256), grid=(-(-total // 256), 1, 1), block=(256, 1, 1),
                    shared=(), body=(Fill(output, types[output].dtype, total, identity),), knobs="",
                    summary=f"{output} := {identity}")


def _params(kernel: L.Kernel, types: dict) -> tuple[Param, ...]:
    read, written = [], []
    for stmt in L.statements(kernel.body):
        if isinstance(stmt, L.Assign) and isinstance(stmt.expr, L.Load) and stmt.expr.buffer not in read:
            read.append(stmt.expr.buffer)
        if isinstance(stmt, L.Store) and stmt.buffer not in written:
            written.append(stmt.buffer)
    gathers = L.kernel_index_tensors(kernel)
    read += sorted(gathers - set(read))  # read inside index expressions
    names = sorted(b for b in read if b not in written) + written
    return tuple(Param(n, types[n].dtype, n in written) for n in names) + ((faults_param(),) if gathers else ())


def _vector_accesses(body, var: int, width: int, types: dict) -> tuple[tuple, tuple]:
    """The loads and stores of `body` that walk `var` contiguously from an aligned start: they can
    move `width` elements at once, where that is 4, 8 or 16 bytes (what the runtime's vectors move:
    two bools of a mask stay two single stores)."""
    loads, stores = [], []

    def moves(buffer: str) -> bool:
        return width * types[buffer].dtype.itemsize in (4, 8, 16)

    for stmt in body:
        if isinstance(stmt, L.Assign) and isinstance(stmt.expr, L.Load) and not stmt.expr.guards:
            flat = flat_index(stmt.expr.buffer, stmt.expr.index, types)
            if vectorizable(flat, var, width) and moves(stmt.expr.buffer):
                loads.append(VecLoad(f"{stmt.name}_v", stmt.expr.buffer, types[stmt.expr.buffer].dtype, flat, width,
                                     var))
        elif isinstance(stmt, L.Store):
            flat = flat_index(stmt.buffer, stmt.index, types)
            if vectorizable(flat, var, width) and moves(stmt.buffer) and not any(s.buffer == stmt.buffer for s in stores):
                stores.append(VecStore(f"{stmt.buffer}_s", stmt.buffer, types[stmt.buffer].dtype, flat, width, var))
    return tuple(loads), tuple(stores)


def _element_loop(var, extent, body, types, width, workers, unroll, worker) -> ElementLoop:
    """One thread's share of `var` over `body` (Loop IR statements), with the loads and stores that
    can move a vector at a time taken out as VecLoads and VecStores. The schedule space only offers
    widths that divide the contiguous extent, so the scalar tail is there for extents it does not."""
    loads, stores = _vector_accesses(body, var, width, types) if width > 1 else ((), ())
    if not loads and not stores:
        width = 1  # nothing gains from vectors: plain strided elements
    return ElementLoop(var=var, extent=extent, width=width, workers=workers, unroll=max(1, unroll), worker=worker,
                       vectors=loads, body=tuple(body), tail=extent % width != 0, stores=stores)


CHUNK_ELEMENTS = 256  # a thread's elements a fold chains before its state is merged into the row's


def _chunked(loop: ElementLoop, fold: Fold) -> ElementLoop:
    """A fold whose thread folds more than CHUNK_ELEMENTS elements: its floating sums, products and
    twisted states restart every chunk and merge into the row's, so rounding chains over at most a
    chunk and then once a chunk (a sum's small terms are not lost against a large running total).
    Maxima and minima are exact, integer sums too: they fold on."""
    groups = tuple((op, dtype, accs) for op, dtype, accs in _fold_groups(fold)
                   if dtype.is_float and op not in ("max", "min"))
    per_step = loop.width * loop.unroll
    if not groups or _slice_steps(loop) * per_step <= CHUNK_ELEMENTS:
        return loop
    return dataclasses.replace(loop, chunk_steps=max(1, CHUNK_ELEMENTS // per_step), restarted=groups)


def _slice_steps(n: ElementLoop) -> int:
    """The steps a thread takes in an element loop: its block's slice of whole steps of the
    threads' vectors (ElementLoop.j2's `lo`, `hi`)."""
    chunk = n.workers * n.width * n.unroll
    return ceil(ceil((n.extent - n.extent % n.width) / chunk) / n.split)


def _held_row(tile: TileKernel, body: list, types: dict) -> list:
    """STAGE=regs: the row's element loops walk a constant count of steps (their block's slice of
    the row), each fold keeping in registers the vectors a later loop of the row loads again
    (emmy.schedule.held says which), and those loops reading them from there. Every such load
    must move the loop's vectors (a width-1 loop takes one-element vectors), so the cost model's
    count of what is held is what the kernel holds. Under STAGE=regs/w<N> (grid-synced rows) the
    first N weights (held.invariant_loads) are loaded on the first row into each thread's own
    slots of dynamic shared memory (geometry.held_bytes a weight a thread) and read from there on
    every later row."""
    pairs = held_loads(tile.kernel.body)
    weights = invariant_loads(tile.kernel.body)[:tile.row.stage.weights]
    if weights and not tile.row.reduce.grid:
        raise Unsupported("weights kept in shared memory need a grid-synced row (REDUCE=g<N>s), whose blocks "
                          "read the same slice every row")
    if len(weights) < tile.row.stage.weights:
        raise Unsupported(f"the row's sweep reads {len(weights)} weight(s) alike every row, "
                          f"not {tile.row.stage.weights}")
    g = tile.geometry
    region = g.threads * held_bytes(tile.shape, g.threads, g.elems, g.split)  # one weight's slots
    loops = [n for n in body if isinstance(n, ElementLoop)]
    if not pairs or not loops:
        raise Unsupported("the row loads nothing twice, so there is nothing to hold")
    widths = {n.width for n in loops}
    if len(widths) != 1 or any(n.tail for n in loops):
        raise Unsupported("the row's loops do not all move whole vectors of one width")
    (width,) = widths
    count = held_steps(tile.shape, g.threads, g.elems, g.split)  # the geometry's, which sized the slots
    if any(_slice_steps(n) != count for n in loops):
        raise Unsupported(f"the row's loops do not all walk the {count} steps the geometry holds")
    held_loops, placed = {}, set()
    for n in loops:
        vectors = list(n.vectors)
        if width == 1:  # one-element vectors, so there is a register array to keep them in
            names = set(pairs) | set(pairs.values()) | set(weights)
            narrow = sorted({types[s.expr.buffer].dtype.value for s in n.body if isinstance(s, L.Assign)
                             and s.name in names and types[s.expr.buffer].dtype.itemsize < 4})
            if narrow:  # the runtime's vectors move 4, 8 or 16 bytes
                raise Unsupported(f"one {' or '.join(narrow)} element at a time is not a vector the row can hold")
            vectors += [VecLoad(f"{s.name}_v", s.expr.buffer, types[s.expr.buffer].dtype,
                                flat_index(s.expr.buffer, s.expr.index, types), 1, n.var)
                        for s in n.body if isinstance(s, L.Assign) and s.name in names]
        loaded = {v.dst[:-2] for v in vectors}
        keep = tuple(f"{name}_v" for name in loaded if name in pairs.values())
        reuse = tuple((f"{name}_v", f"{pairs[name]}_v") for name in loaded if name in pairs)
        staged = tuple((f"{name}_v", i * region) for i, name in enumerate(weights) if name in loaded)
        placed |= {name for name in loaded if name in pairs or name in weights}
        held_loops[id(n)] = dataclasses.replace(n, vectors=tuple(vectors), steps=count, keep=tuple(sorted(keep)),
                                                reuse=tuple(sorted(reuse)), staged=staged)
    if placed != set(pairs) | set(weights):
        missing = sorted(set(pairs) | set(weights) - placed)
        raise Unsupported(f"{', '.join(missing)} would be loaded one element at a time, not held")
    return [held_loops.get(id(n), n) if isinstance(n, ElementLoop) else n for n in body]


def _lower_row(tile: TileKernel, types: dict, params) -> KernelIR:
    g, row = tile.geometry, tile.row
    loops, _ = free_loops(tile.kernel, tile.placement.free)
    rows = prod(e for _, e in loops)
    split = g.split  # > 1: a row's fold spread over `split` blocks that combine atomically
    coop = row.reduce.coop or split > 1
    atomic = _row_atomic(tile) if split > 1 else ""
    threads, width = g.threads, g.vec
    unroll = max(1, g.elems // max(1, width))
    body: list = [RowIndex(tuple(loops), "block" if coop else "thread", split)]
    shared: list[Smem] = []
    twists = []
    for part in tile.parts:
        if isinstance(part, Epilogue):
            body += _scalar_and_stores(part.body, types, coop, atomic)
        elif isinstance(part, Fold):
            body.append(Scalar(part.init))
            workers, worker = (threads, "thread") if coop else (1, "alone")
            loop = _element_loop(part.var, part.extent, part.lift + part.combine, types, width, workers, unroll,
                                 worker)
            if split > 1:  # this block's slice of the fold: whole steps of the threads' vectors
                loop = dataclasses.replace(loop, split=split)
            if not row.stage.held:
                loop = _chunked(loop, part)
            body.append(loop)
            if coop:
                combine, smem = _block_combine(part, threads)
                body += combine
                _add_shared(shared, smem)
            if part.twist:
                twists.append((part.twist, tuple(i.acc for i in part.init if _in_state(i, part))))
        elif isinstance(part, Sweep):
            workers, worker = (threads, "thread") if coop else (1, "alone")
            body.append(_element_loop(part.var, part.extent, part.body, types, width, workers, unroll, worker))
    if row.stage.held:
        body = _held_row(tile, body, types)
    extent = max((p.extent for p in tile.parts if isinstance(p, (Fold, Sweep))), default=1)
    blocks = rows * split if coop else -(-rows // threads)
    return KernelIR(name=tile.kernel.name, params=params,
                    tile=Tile(("row", "col"), extent, rows, threads if coop else 1), grid=(blocks, 1, 1),
                    block=(threads, 1, 1), shared=tuple(shared), body=tuple(body), knobs=str(row),
                    summary=tile.shape.describe(), twists=tuple(twists))


def _lower_column(tile: TileKernel, types: dict, params) -> KernelIR:
    """A column reduction, 32 outputs a block: lane l of every warp owns output 32*block + l
    (consecutive lanes read consecutive addresses), the warps split each fold, and their partial
    states meet in shared memory. Lanes past the last output repeat it and store nothing. Split
    (g<N>a): `split` blocks take a slice of the fold each and combine into the output atomically."""
    g = tile.geometry
    loops, _ = free_loops(tile.kernel, tile.placement.free)
    rows = prod(e for _, e in loops)
    warps = g.threads // 32
    atomic = _row_atomic(tile) if g.split > 1 else ""
    body: list = [RowIndex(tuple(loops), "column", g.split)]
    shared: list[Smem] = []
    twists = []
    for part in tile.parts:
        if isinstance(part, Epilogue):
            pending = [s for s in part.body if not isinstance(s, L.Store)]
            stores = [Store(s.buffer, types[s.buffer].dtype, flat_index(s.buffer, s.index, types),
                            _operand(s.value), atomic) for s in part.body if isinstance(s, L.Store)]
            body += [Scalar(tuple(pending))] if pending else []
            body += [OnlyThread(tuple(stores), "output_lanes")] if stores else []
        elif isinstance(part, Fold):
            body.append(Scalar(part.init))
            loop = _element_loop(part.var, part.extent, part.lift + part.combine, types, 1, warps, g.elems,
                                 "warp")
            body.append(dataclasses.replace(loop, split=g.split))
            for op, dtype, accs in _fold_groups(part):
                name = f"{op}_columns" if dtype is DType.F32 else f"{op}_{dtype.value}_columns"
                memory = Smem(dtype, name, warps * 32 * len(accs))
                _add_shared(shared, [memory])
                body.append(ColumnCombine(op, accs, name, warps, dtype))
            if part.twist:
                twists.append((part.twist, tuple(i.acc for i in part.init if _in_state(i, part))))
        else:
            raise Unsupported(f"kernel {tile.kernel.name}: a column reduction with a sweep is not lowered")
    extent = max((p.extent for p in tile.parts if isinstance(p, Fold)), default=1)
    return KernelIR(name=tile.kernel.name, params=params, tile=Tile(("row", "col"), extent, rows, g.threads),
                    grid=(-(-rows // 32) * g.split, 1, 1), block=(g.threads, 1, 1), shared=tuple(shared),
                    body=tuple(body), knobs=str(tile.row), summary=tile.shape.describe(), twists=tuple(twists))


def _in_state(init: L.Init, fold: Fold) -> bool:
    return any(isinstance(s, L.Update) and s.acc == init.acc for s in fold.combine)


def _add_shared(shared: list[Smem], more: list[Smem]) -> None:
    """Add shared arrays to a kernel's: the folds of a row reuse one array of a name (their combines
    run one after another), sized for the fold that combines the most accumulators in it."""
    for memory in more:
        at = next((i for i, m in enumerate(shared) if m.name == memory.name), None)
        if at is None:
            shared.append(memory)
        elif memory.size > shared[at].size:
            shared[at] = memory


def _block_combine(fold: Fold, threads: int):
    """Warp shuffles, then per-warp values through shared memory and a tree in the first warp, for
    each group of plain accumulators (by monoid) and for a twisted fold's state."""
    warps = max(1, threads // 32)
    stmts, smem = [], []
    for op, dtype, accs in _fold_groups(fold):
        name = f"{op}_partials" if dtype is DType.F32 else f"{op}_{dtype.value}_partials"
        memory = Smem(dtype, name, warps * len(accs))
        smem.append(memory)
        stmts += [WarpShuffle(op, accs, name, dtype=dtype), Sync(), TreeHalve(op, accs, name, warps, dtype=dtype),
                  Sync(), Broadcast(accs, name), Sync()]
    return stmts, smem


def _fold_groups(fold: Fold) -> list[tuple[str, DType, tuple[str, ...]]]:
    """A fold's accumulators as they combine across threads: (monoid, register type, accumulators)
    per group of plain ones, then (twist, register type, state) for a twisted fold's state."""
    state = tuple(i.acc for i in fold.init if _in_state(i, fold))
    register = {i.acc: i.dtype.accumulator for i in fold.init}  # scalar_c's Init
    plain = {}
    for s in fold.combine:
        if isinstance(s, L.Accumulate):  # one group per monoid and register type (int64 keys: argmax)
            plain.setdefault((MONOID[s.op], register[s.acc]), []).append(s.acc)
    groups = [(op, dtype, tuple(accs)) for (op, dtype), accs in sorted(plain.items(), key=lambda g: (g[0][0],
                                                                                                  g[0][1].value))]
    if state:
        if (fold.twist, len(state)) not in MERGED:
            raise Unsupported(f"a {fold.twist} fold with {len(state)} state values is not lowered yet")
        groups.append((fold.twist, register[state[0]], state))
    return groups


def _scalar_and_stores(stmts, types, coop: bool, atomic: str = "") -> list:
    """Row-level statements: every thread computes the scalars; a row's stores are written by one
    thread of the block that owns it (coop; with `atomic`, combined into the output by that monoid),
    or by the thread that owns it."""
    out, pending = [], []
    for s in stmts:
        if isinstance(s, L.Store) and coop:
            if pending:
                out.append(Scalar(tuple(pending)))
                pending = []
            out.append(OnlyThread((Store(s.buffer, types[s.buffer].dtype, flat_index(s.buffer, s.index, types),
                                         _operand(s.value), atomic),)))
        else:
            pending.append(s)
    if pending:
        out.append(Scalar(tuple(pending)))
    return out


def _operand(value) -> str | float:
    """A stored value: its name, or a literal's constant."""
    return value if isinstance(value, str) else value.value


def _lower_map(tile: TileKernel, types: dict, params) -> KernelIR:
    g = tile.geometry
    loops, body = _map_nest(tile.kernel.body)
    total = prod(e for _, e in loops)
    per_block = g.threads * g.elems
    blocks = -(-total // per_block)
    width, loads, stores = 1, (), ()
    if g.vec > 1 and loops and loops[-1][1] % g.vec == 0:  # a vector never straddles two rows
        loads, stores = _vector_accesses(body, loops[-1][0], g.vec, types)
        width = g.vec if loads or stores else 1
    elements = MapElements(tuple(loops), g.elems, total, tuple(body), width, loads, stores)
    return KernelIR(name=tile.kernel.name, params=params, tile=Tile(("element",), per_block, total, g.threads),
                    grid=(blocks, 1, 1), block=(g.threads, 1, 1), shared=(), body=(elements,), knobs=str(tile.row),
                    summary=tile.shape.describe())


def _map_nest(body) -> tuple[list[tuple[int, int]], list]:
    """A map's loop nest as (its loops, outermost first; the statements of every level in order).
    Statements hoisted to an outer level are recomputed per element, which is what they are."""
    loops, stmts = [], []
    while True:
        inner = [s for s in body if isinstance(s, L.Loop)]
        stmts += [s for s in body if not isinstance(s, L.Loop)]
        if not inner:
            return loops, stmts
        if len(inner) > 1 or inner[0].reduction or body[-1] is not inner[0]:
            raise Unsupported("a map kernel whose loops are not one nest")
        loops.append((inner[0].var, inner[0].extent))
        body = inner[0].body


def _lower_contraction(tile: TileKernel, types: dict, params) -> KernelIR:
    g, shape = tile.geometry, tile.shape
    loops, _ = free_loops(tile.kernel, tile.placement.free)
    extents = dict(loops)
    m_vars = tuple((v, extents[v]) for v, _ in loops if v in shape.m_vars)
    n_vars = tuple((v, extents[v]) for v, _ in loops if v in shape.n_vars)
    batch = tuple((v, e) for v, e in loops if v not in shape.m_vars and v not in shape.n_vars)
    (fold,) = [p for p in tile.parts if isinstance(p, Fold)]
    epilogue = tuple(s for p in tile.parts if isinstance(p, Epilogue) for s in p.body)
    bm, bn, bk = g.tile_m, g.tile_n, g.tile_k
    if g.micro_m:
        panels = _micro_panels(tile, fold, m_vars, n_vars, batch, types)
    else:
        panels = _simt_panels(tile, fold, m_vars, n_vars, batch, types)
    vectors = ()
    if g.vec > 1 and not g.stage_depth:  # operands contiguous along K: a vector of K at a time per output
        vectors, _ = _vector_accesses(fold.lift, fold.var, g.vec, types)
    if g.vec > 1 and not g.micro_m and not any(p.width > 1 for p in panels) and not vectors:
        raise Unsupported(f"kernel {tile.kernel.name} ({tile.row}): no operand is contiguous along K, so "
                          f"TILE={tile.row.TILE}'s vector loads cannot be kept")
    m_total, n_total = prod(e for _, e in m_vars), prod(e for _, e in n_vars)
    tiles = -(-m_total // bm) * -(-n_total // bn)
    monoids = tuple((s.acc, MONOID[s.op]) for s in fold.combine if isinstance(s, L.Accumulate))
    atomics, workspace, params = split_outputs(tile, monoids, epilogue, params, prod(e for _, e in batch) or 1,
                                               m_total * n_total, fold.init[0].dtype.accumulator)
    body = ContractionTile(m_vars=m_vars, n_vars=n_vars, batch_vars=batch, k_var=fold.var, k_extent=fold.extent,
                           bm=bm, bn=bn, bk=bk, per_thread=g.elems, depth=g.stage_depth, how=g.stage_how,
                           panels=tuple(panels), inits=fold.init, lift=fold.lift, combine=fold.combine,
                           epilogue=epilogue, split=g.split, atomics=atomics, workspace=workspace,
                           raster=g.raster_group, k_width=g.vec if vectors else 1, vectors=vectors, micro_m=g.micro_m,
                           micro_n=g.micro_n)
    shared = tuple(Smem(p.dtype, f"{p.name}_panel", g.stage_depth * p.rows * p.cols) for p in panels)
    return KernelIR(name=tile.kernel.name, params=params, tile=Tile(("m", "n"), bk, m_total * n_total, g.threads),
                    grid=(tiles, prod(e for _, e in batch) or 1, g.split), block=(g.threads, 1, 1), shared=shared,
                    body=(body,), knobs=str(tile.row), summary=shape.describe())


def _panel_loads(fold: Fold, m_vars, n_vars, batch, types: dict):
    """(Loop IR load, its flat index, side) for each load of the fold that walks K and one side's
    outputs, the loads a staged contraction reads from shared memory."""
    for stmt in fold.lift:
        if not (isinstance(stmt, L.Assign) and isinstance(stmt.expr, L.Load)):
            continue
        flat = flat_index(stmt.expr.buffer, stmt.expr.index, types)
        side = panel_side(load_vars(stmt.expr) - {v for v, _ in batch}, fold.var, [v for v, _ in m_vars],
                          [v for v, _ in n_vars])
        if side:
            yield stmt, flat, side


def _micro_panels(tile: TileKernel, fold: Fold, m_vars, n_vars, batch, types: dict) -> list[Panel]:
    """A micro-tiled contraction's panels, K-major (MICRO_K rows of BM or BN), so that a thread's
    4 consecutive rows or columns are one shared-memory vector. A panel fills 4 elements at a time
    along its outputs where the source is contiguous there (each vector inside one output row), else
    4 along K where the source is contiguous along K (stored transposed), else one at a time."""
    g, panels = tile.geometry, []
    for stmt, flat, side in _panel_loads(fold, m_vars, n_vars, batch, types):
        outer = m_vars if side == "a" else n_vars
        inner_var, inner_extent = outer[-1]
        cols = g.tile_m if side == "a" else g.tile_n
        itemsize = types[stmt.expr.buffer].dtype.itemsize
        fits = MICRO_VECTOR * itemsize <= 16 and not stmt.expr.guards  # a guarded load fills an element at a time
        along_outer = fits and inner_extent % MICRO_VECTOR == 0 and vectorizable(flat, inner_var, MICRO_VECTOR)
        along_k = (not along_outer and fits and fold.extent % MICRO_VECTOR == 0
                   and vectorizable(flat, fold.var, MICRO_VECTOR))
        width = MICRO_VECTOR if along_outer or along_k else 1
        panels.append(Panel(name=stmt.name, buffer=stmt.expr.buffer, dtype=types[stmt.expr.buffer].dtype, side=side,
                            rows=g.tile_k, cols=cols, k_fast=False, width=width, fill_along_k=along_k,
                            guards=stmt.expr.guards))
    return panels


MICRO_VECTOR = 4  # elements a micro-tile's shared-memory loads and panel fills move at once


def _simt_panels(tile: TileKernel, fold: Fold, m_vars, n_vars, batch, types: dict) -> list[Panel]:
    """The shared-memory panels of a staged SIMT contraction: one per load of the fold that walks
    K and one side's outputs (an operand prologue with several loads on a side stages each)."""
    g = tile.geometry
    panels = []
    if not g.stage_depth:
        return panels
    for stmt, flat, side in _panel_loads(fold, m_vars, n_vars, batch, types):
        width = g.vec if g.vec > 1 and not stmt.expr.guards and vectorizable(flat, fold.var, g.vec) else 1
        k_fast = side == "a" or width > 1
        rows, cols = ((g.tile_m if side == "a" else g.tile_n), g.tile_k) if k_fast else (g.tile_k, g.tile_n)
        panels.append(Panel(name=stmt.name, buffer=stmt.expr.buffer, dtype=types[stmt.expr.buffer].dtype, side=side,
                            rows=rows, cols=cols, k_fast=k_fast, width=width, guards=stmt.expr.guards))
    return panels


STATIC_SMEM = 48 * 1024  # bytes of static __shared__ arrays a kernel may declare (CUDA guide)


def _finishing_kernel(tile: TileKernel, main: KernelIR, body, types: dict) -> KernelIR:
    """A split contraction's second kernel (after a ContractionTile or an MmaTile): the partial
    results reduced, the epilogue, the store."""
    if isinstance(body, MmaTile):
        monoids = ((body.acc, "sum"),)
    else:
        monoids = tuple((s.acc, MONOID[s.op]) for s in body.combine if isinstance(s, L.Accumulate))
    workspace = next(p for p in main.params if p.name == body.workspace)
    outputs = [p for p in main.params if p.written and p.name not in (body.workspace, INDEX_FAULTS)]
    gathers = L.index_tensors(body.epilogue)
    reads = sorted({s.expr.buffer for s in body.epilogue if isinstance(s, L.Assign) and isinstance(s.expr, L.Load)}
                   | gathers)
    params = (Param(workspace.name, workspace.dtype, False, workspace.scratch),
              *(Param(b, types[b].dtype, False) for b in reads), *outputs, *((faults_param(),) if gathers else ()))
    total = prod(e for _, e in (*body.m_vars, *body.n_vars, *body.batch_vars))
    finish = SplitFinish(body.m_vars, body.n_vars, body.batch_vars, body.split, body.workspace, monoids,
                         body.epilogue)
    return KernelIR(name=f"{tile.kernel.name}_finish", params=params, tile=Tile(("element",), 256, total, 256),
                    grid=(-(-total // 256), 1, 1), block=(256, 1, 1), shared=(), body=(finish,), knobs=main.knobs,
                    summary=f"{main.summary}: the {body.split} partial results reduced")
