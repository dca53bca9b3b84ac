"""Loop IR + the schedule space -> Tile IR: each kernel gets its cheapest legal row."""

from __future__ import annotations

from emmy.errors import EmmyError
from emmy.knobs import KnobRow, check_target
from emmy.loop_ir.nodes import Accumulate, Init, Kernel, Loop, LoopProgram, Update, row_nest
from emmy.loop_ir.signature import signature
from emmy.tile_ir.geometry import Geometry, geometry
from emmy.tile_ir.nodes import Epilogue, Fold, Placement, Sweep, TileKernel, TileProgram
from emmy.tile_ir.shape import KernelShape, kernel_shape


def build_tile_program(loops: LoopProgram, target, pins: KnobRow = KnobRow(), egraph=None,
                       roots: dict | None = None, chosen: dict | None = None, schedule_rules: tuple = ()) -> TileProgram:
    """`egraph`, `roots`: the optimizer's e-graph and each kernel's root Term in it (see
    emmy.egraph.schedules.build_space); without them the space is built on its own. `chosen`:
    kernel name -> the row to use instead of the cheapest (it must be offered for that kernel).
    `schedule_rules`: the user's emmy.rules.ScheduleRuleGroup, run beside the built-in ones."""
    from emmy.egraph.schedules import build_space

    check_target(pins, target)
    shapes = [kernel_shape(k) for k in loops.kernels]
    space = build_space(shapes, target, pins, egraph, roots, schedule_rules)
    full = build_space(shapes, target, KnobRow(), egraph, roots, schedule_rules) if pins.pinned() else space
    kernels = []
    types = buffer_types(loops)
    for kernel, shape in zip(loops.kernels, shapes):
        rows = offered_rows(kernel, shape, space.rows[kernel.name], types)
        if not rows:
            if not pins.pinned():  # every kernel has a legal schedule; none means a rule is wrong
                raise RuntimeError(f"no legal schedule for kernel {kernel.name} ({shape.describe()}) "
                                   f"on {target.name}, with nothing pinned")
            raise EmmyError(no_row_message(shape, pins, full.rows[kernel.name], target))
        ranked = ranked_rows(kernel, shape, rows, target, types)
        best = ranked[0]
        if chosen and kernel.name in chosen:
            best = next((b for b in ranked if b.row == chosen[kernel.name]), None)
            if best is None:
                raise EmmyError(f"row {chosen[kernel.name]} is not offered for kernel {kernel.name} "
                                f"({shape.describe()}) on {target.name}; `emmy schedules` lists the rows")
        g = geometry(shape, best.row)
        offered = rows if not pins.pinned() else offered_rows(kernel, shape, full.rows[kernel.name], types)
        kernels.append(TileKernel(kernel, shape, best.row, g, _placement(shape, best.row, g),
                                  tuple(_parts(kernel, shape)), len(offered), best.total_s, best,
                                  signature(kernel, types)))
    return TileProgram(tuple(kernels), loops)


def buffer_types(loops: LoopProgram) -> dict:
    """Every buffer of the program (inputs, weights, kernel outputs) -> TensorType."""
    return dict(loops.inputs) | dict(loops.weights) | {name: t for k in loops.kernels for name, t in k.outputs}


def offered_rows(kernel: Kernel, shape: KernelShape, rows, types: dict, strict: bool = False) -> tuple[KnobRow, ...]:
    """The legal rows the Kernel IR lowering takes: the space offers only those. When it takes
    none (a kind of kernel not lowered yet), all legal rows (the kernel then stops at Tile IR and
    the lowering says why), or none when `strict` (extraction prices such a kernel as unavailable,
    so it never chooses a form that does not lower when one that does exists)."""
    from emmy.kernel_ir.lower import supports

    parts = tuple(_parts(kernel, shape))
    kept, memo = [], {}
    for row in rows:
        if not supports(tile_kernel(kernel, shape, row, parts), types, memo):
            kept.append(row)
    return tuple(kept) if kept or strict else tuple(rows)


def tile_kernel(kernel: Kernel, shape: KernelShape, row: KnobRow, parts: tuple | None = None) -> TileKernel:
    """The Tile IR kernel a row makes of a Loop IR kernel (unpriced); `parts`, when given, its fold
    tree (the same for every row of the kernel)."""
    g = geometry(shape, row)
    parts = tuple(_parts(kernel, shape)) if parts is None else parts
    return TileKernel(kernel, shape, row, g, _placement(shape, row, g), parts, 0, 0.0)


def supported(kernel: Kernel, shape: KernelShape, row: KnobRow, types: dict, memo: dict) -> bool:
    """Whether the Kernel IR lowering takes this row of this kernel (`memo` kept across its rows)."""
    from emmy.kernel_ir.lower import supports

    parts = memo.get("_parts")
    if parts is None:
        parts = memo["_parts"] = tuple(_parts(kernel, shape))
    return not supports(tile_kernel(kernel, shape, row, parts), types, memo)


def _unnamed(shape: KernelShape) -> KernelShape:
    """The shape with the kernel's own names dropped: what its legal rows depend on."""
    import dataclasses

    return dataclasses.replace(shape, kernel="", free_vars=(), m_vars=(), n_vars=())


def ranked_rows(kernel: Kernel, shape: KernelShape, rows, target, types: dict) -> list:
    """Every row's cost breakdown (emmy.extract.cost_model), cheapest first; ties keep the space's order.
    `types`: buffer name -> TensorType for the kernel's buffers (the program's `buffer_types`). A
    measured time for the kernel's signature (emmy.loop_ir.signature), the row and the target
    (extract/measured.py) replaces the prediction."""
    import dataclasses

    from emmy.extract.cost_model import predict
    from emmy.extract.loop_cost import kernel_cost
    from emmy.extract.measured import current

    cost = kernel_cost(kernel, {name: (t.numel, t.dtype.itemsize) for name, t in types.items()})
    measurements = current()
    key = signature(kernel, types) if measurements.rows else ""
    predicted = []
    for row in rows:
        breakdown = predict(shape, row, target, cost)
        seconds = measurements.lookup(target.key, key, str(row)) if key else None
        if seconds is not None:
            breakdown = dataclasses.replace(breakdown, total_s=seconds, measured=True)
        predicted.append(breakdown)
    order = sorted(range(len(rows)), key=lambda i: (predicted[i].total_s, i))
    return [predicted[i] for i in order]


def no_row_message(shape: KernelShape, pins: KnobRow, unpinned: tuple[KnobRow, ...], target) -> str:
    """Why pins leave a kernel no legal row: each pinned value the kernel cannot take at all, with
    the values it can; or, when each could be legal alone, that they are not legal together."""
    pinned = pins.pinned()
    head = f"no legal schedule for kernel {shape.kernel} ({shape.describe()}) on {target.name} with {pins}"
    reasons = []
    tile_atom = pinned.get("TILE", "").split("/")[0]
    if tile_atom.startswith("mma_"):
        from emmy.rules.schedules import ATOM_DTYPE

        if not shape.mma:
            reasons.append(f"TILE={pinned['TILE']} needs a contraction of f16 or bf16 operands; this kernel is a "
                           f"{shape.describe()}")
        elif ATOM_DTYPE[tile_atom] != shape.mma:
            reasons.append(f"TILE={pinned['TILE']} multiplies {ATOM_DTYPE[tile_atom]} operands; this kernel's are "
                           f"{shape.mma}")
    for knob, value in pinned.items():
        legal = sorted({getattr(r, knob) for r in unpinned})
        if value not in legal and not (knob == "TILE" and reasons):
            shown = ", ".join(v if v else "(empty)" for v in legal[:12]) + (" ..." if len(legal) > 12 else "")
            reasons.append(f"{knob}={value} is not legal for this kernel; legal {knob} values here: {shown}")
    work, tile = pinned.get("WORK", ""), pinned.get("TILE", "")
    if work and tile and work.startswith("w") != tile.startswith("mma_"):
        reasons.append("WORK=t<N> (threads) goes with SIMT tiles f<N>[/v<V>], WORK=w<M>x<N> (warps) with mma tiles; "
                       f"WORK={work} and TILE={tile} do not pair")
    if not reasons:
        reasons.append("each pinned value is legal alone but no legal row has them together "
                       "(tile sizes, shared memory or split limits; `emmy schedules` lists the rows)")
    return head + ": " + "; ".join(reasons)


def _placement(shape: KernelShape, row: KnobRow, g: Geometry) -> Placement:
    free = shape.free_vars
    names = [f"a{v}" for v in free]
    if shape.kind == "attention":  # query-row blocks by batch; the value dimension is the state vector
        m = "·".join(f"a{v}" for v in shape.m_vars)
        batch = [f"a{v}" for v in free if v not in shape.m_vars and v not in shape.n_vars]
        grid = (f"{m}/{g.tile_m}", *batch)
    elif shape.kind == "contraction":
        m = "·".join(f"a{v}" for v in shape.m_vars)
        n = "·".join(f"a{v}" for v in shape.n_vars)
        batch = [f"a{v}" for v in free if v not in shape.m_vars and v not in shape.n_vars]
        grid = (f"{m}/{g.tile_m}", f"{n}/{g.tile_n}", *batch)
    elif shape.kind == "row" and row.REDUCE == "":
        grid = (f"{'·'.join(names) or '1'}/{g.threads}",)
    elif shape.kind == "map":
        grid = (f"{'·'.join(names) or '1'}/{g.threads * g.elems}",)
    else:
        grid = tuple(names) or ("1",)
    if g.split > 1:
        grid = (*grid, f"split {g.split}")
    return Placement(tuple(free), grid, row.WORK, g.blocks, g.threads)


def _parts(kernel: Kernel, shape: KernelShape):
    """The statements inside the free loops, grouped into folds, epilogues and sweeps."""
    _, body = row_nest(kernel.body, shape.free_vars)
    inits, pending = [], []
    for stmt in body:
        if isinstance(stmt, Init):
            inits.append(stmt)
        elif isinstance(stmt, Loop) and stmt.reduction:
            if pending:
                yield Epilogue(tuple(pending))
                pending = []
            combine = tuple(s for s in stmt.body if isinstance(s, (Accumulate, Update)))
            accs = {s.acc for s in combine}
            mine = tuple(i for i in inits if i.acc in accs)
            inits = [i for i in inits if i.acc not in accs]
            lift = tuple(s for s in stmt.body if not isinstance(s, (Accumulate, Update)))
            yield Fold(stmt.var, stmt.extent, _twist(combine, mine), mine, lift, combine)
        elif isinstance(stmt, Loop):
            if pending:
                yield Epilogue(tuple(pending))
                pending = []
            yield Sweep(stmt.var, stmt.extent, stmt.body)
        else:
            pending.append(stmt)
    if pending:
        yield Epilogue(tuple(pending))


def _twist(combine, inits) -> str:
    if not any(isinstance(s, Update) for s in combine):
        return ""
    return "softmax" if any(i.op == "max" for i in inits) else "welford"
