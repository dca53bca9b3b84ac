"""Loop IR + the schedule space -> Tile IR: each kernel gets its cheapest offered row."""

from __future__ import annotations

import dataclasses

from emmy.errors import EmmyError
from emmy.loop_ir.nodes import (Accumulate, Assign, Init, Kernel, Loop, LoopProgram, Update, buffer_types, renamed,
                                row_nest, statements, values_read)
from emmy.loop_ir.signature import signature
from emmy.schedule.choose import no_row_message
from emmy.schedule.geometry import Geometry, geometry
from emmy.schedule.knobs import Schedule
from emmy.schedule.pricing import KernelPricer
from emmy.schedule.shape import KernelShape, kernel_shape
from emmy.schedule.space import legal_rows
from emmy.tile_ir.nodes import Epilogue, Fold, Placement, Sweep, TileKernel, TileProgram


def build_tile_program(loops: LoopProgram, pricer: KernelPricer, chosen: dict | None = None) -> TileProgram:
    """Each kernel with the cheapest row `pricer` offers it (the extraction's pricer: rows found, checked
    and ranked once). `chosen`: kernel name -> the row to use instead (it must be offered)."""
    target, pins = pricer.target, pricer.pins
    kernels = []
    types = buffer_types(loops)
    for kernel in loops.kernels:
        shape = kernel_shape(kernel)
        ranked = pricer.ranked(kernel, types)
        if not ranked:
            if not pins.pinned():  # every kernel has a legal schedule; none means a rule is wrong
                raise RuntimeError(f"no legal schedule for kernel {kernel.name} ({shape.describe()}) "
                                   f"on {target.name}, with nothing pinned")
            (unpinned,) = legal_rows([shape], target, Schedule(), pricer.schedule_rules)

            def legal_alone(knob: str, value: str, shape=shape) -> bool:
                return bool(legal_rows([shape], target, Schedule(**{knob: value}), pricer.schedule_rules)[0])

            raise EmmyError(no_row_message(shape, pins, unpinned, target, legal_alone))
        best = ranked[0]
        if chosen and kernel.name in chosen:
            best = next((b for b in ranked if b.row == chosen[kernel.name]), None)
            if best is None:
                raise EmmyError(f"row {chosen[kernel.name]} is not offered for kernel {kernel.name} "
                                f"({shape.describe()}) on {target.name}; `emmy schedules` lists the rows")
        g = geometry(shape, best.row)
        kernels.append(TileKernel(kernel, shape, best.row, g, _placement(shape, best.row, g),
                                  tuple(_parts(kernel, shape)), len(ranked), best.total_s, best,
                                  signature(kernel, types)))
    return TileProgram(tuple(kernels), loops)


def tile_kernel(kernel: Kernel, shape: KernelShape, row: Schedule, parts: tuple | None = None) -> TileKernel:
    """The Tile IR kernel a row makes of a Loop IR kernel (unpriced); `parts`, when given, its fold
    tree (the same for every row of the kernel)."""
    g = geometry(shape, row)
    parts = tuple(_parts(kernel, shape)) if parts is None else parts
    return TileKernel(kernel, shape, row, g, _placement(shape, row, g), parts, 0, 0.0)


def fold_tree(kernel: Kernel, shape: KernelShape) -> tuple:
    """The statements inside the kernel's free loops, grouped into folds, epilogues and sweeps."""
    return tuple(_parts(kernel, shape))


def _placement(shape: KernelShape, row: Schedule, g: Geometry) -> Placement:
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
    elif shape.kind == "row" and row.reduce.serial:
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
    if shape.kind == "contraction":
        body = _fold_reads_inside(body)
    elif shape.kind == "attention" and not _dot_reads_row_values(body):
        body = _row_values_after_fold(_fold_reads_inside(body))
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


def _first_fold(body: tuple) -> int | None:
    """The position of the body's first reduction loop (its fold), or None."""
    return next((k for k, s in enumerate(body) if isinstance(s, Loop) and s.reduction), None)


def _fold_reads_inside(body: tuple) -> tuple:
    """A contraction's or attention's body with the statements before its fold that the fold reads
    (a triangular mask's row and column positions, ALiBi's slope of the head) computed inside the
    fold as well: a contraction lowers its fold from the operand panels alone, a flash kernel from
    its walk over the keys. A statement also used after the fold stays before it; the
    fold's copy is renamed; so does one a statement left before the fold reads (a residual sum
    computed before a contraction that reads the same bias: timm's ResMLP)."""
    at = _first_fold(body)
    if at is None:
        return body
    fold = body[at]
    before = {s.name: s for s in body[:at] if isinstance(s, Assign)}
    needed, todo = set(), [n for s in fold.body for n in values_read(s) if n in before]
    while todo:
        name = todo.pop()
        if name not in needed:
            needed.add(name)
            todo += [n for n in values_read(before[name]) if n in before]
    if not needed:
        return body
    # what stays before the fold: every needed statement read outside the fold (after it, or by a
    # statement before it that the fold does not need), and what those read in turn
    outside = [s for s in statements(body[:at]) if not (isinstance(s, Assign) and s.name in needed)]
    outside += list(statements(body[at + 1:]))
    kept, todo = set(), [n for s in outside for n in values_read(s) if n in needed]
    while todo:
        name = todo.pop()
        if name not in kept:
            kept.add(name)
            todo += [n for n in values_read(before[name]) if n in needed]
    names = {n: f"{n}_f" if n in kept else n for n in needed}
    copies = tuple(renamed(before[n], names) for n in before if n in needed)  # in their order
    inner = copies + tuple(renamed(s, names) for s in fold.body)
    head = tuple(s for s in body[:at] if not (isinstance(s, Assign) and s.name in needed and s.name not in kept))
    return (*head, dataclasses.replace(fold, body=inner), *body[at + 1:])


def _dot_reads_row_values(body: tuple) -> bool:
    """Whether an attention's q.k dot reads, itself or through the fold's statements, a row value
    the Loop IR computed before the fold (rotary angles of the query's position, GPT-NeoX's
    partial rotary): the flash templates hold the dot's key-independent part (q) in registers
    before they walk the keys, ahead of any statement of the fold, so such a kernel keeps the
    form the templates refuse."""
    at = _first_fold(body)
    if at is None:
        return False
    before = {s.name for s in body[:at] if isinstance(s, Assign)}
    fold = body[at]
    lift = {s.name: s for s in fold.body if isinstance(s, Assign)}
    todo = [n for loop in fold.body if isinstance(loop, Loop) for s in statements(loop.body) for n in values_read(s)]
    seen: set[str] = set()
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        if name in before:
            return True
        if name in lift:
            todo += values_read(lift[name])
    return False


def _row_values_after_fold(body: tuple) -> tuple:
    """An attention body with the row's values computed before its fold (the fold reads none of
    them once _fold_reads_inside has run: a padding mask's row test, read by the epilogue) moved
    to just after it: a flash kernel runs its fold first and then each output's epilogue."""
    at = _first_fold(body)
    if at is None:
        return body
    early = tuple(s for s in body[:at] if isinstance(s, Assign))
    if not early:
        return body
    rest = tuple(s for s in body[:at] if not isinstance(s, Assign))
    return (*rest, body[at], *early, *body[at + 1:])


def _twist(combine, inits) -> str:
    if not any(isinstance(s, Update) for s in combine):
        return ""
    return "softmax" if any(i.op == "max" for i in inits) else "welford"
