"""The provisional cost of Loop IR: bytes moved plus operations, per kernel.

Without a target: time = bytes / bandwidth + operations / rate + launch
overhead per kernel. Every statement, loads included, is counted with the
number of times its loop nest runs it, so a value recomputed inside a loop
it does not depend on costs what it should; a load's first touch of each
element is DRAM traffic (`bytes_read`) and the rest are re-reads with the
footprint that decides, per target, which cache serves them (`rereads`,
priced by emmy/schedule/cost_model.py).
"""

from __future__ import annotations

from dataclasses import dataclass

from emmy.affine import FloorDiv, Gathered, Mod, gathered_reads
from emmy.dtypes import DType
from emmy.loop_ir.nodes import (Accumulate, Assign, Init, Kernel, Load, Loop, Masked, Op, Store, Update,
                                parallel_loops)
from emmy.schedule.held import held_loads, invariant_loads

BANDWIDTH = 2.0e12  # bytes/s: an HBM-class GPU (order of magnitude; replaced per target later)
OP_RATE = 2.0e13  # scalar ops/s
LAUNCH = 3.0e-6  # s per kernel
EXPENSIVE = {"exp": 4, "log": 4, "sqrt": 4, "rsqrt": 4, "sigmoid": 4, "tanh": 4, "erf": 4, "divide": 4, "power": 8,
             "cos": 4, "sin": 4, "log1p": 4, "expm1": 4,
             "floor_divide": 12, "trunc_divide": 4, "remainder": 8, "fmod": 8,
             "log2": 2, "log10": 4, "exp2": 2, "tan": 8, "atan": 8, "asin": 8, "acos": 8, "sinh": 8, "cosh": 8,
             "asinh": 8, "acosh": 8, "atanh": 8, "erfc": 8, "lgamma": 16, "atan2": 12, "hypot": 8,
             "erfinv": 12, "i0": 16, "i1": 16, "digamma": 24, "i0e": 20, "i1e": 20, "erfcx": 16, "ndtri": 16,
             "bessel_j0": 24, "bessel_j1": 24, "bessel_y0": 24, "bessel_y1": 24, "zeta": 64, "gcd": 64}
SPECIAL_FUNCTIONS = set(EXPENSIVE)  # the SFU's work
# A double-precision function is a sequence on the FP64 pipes (no SFU instruction takes doubles):
# about this many of them, FMA-equivalents, as CUDA's exp(double) compiles (estimate, until measured)
F64_FUNCTION_OPS = 20
# Functions computed on the FMA pipes: instructions each (emmy::rescale_exp: 24 in its SASS for sm_90,
# eleven of them FFMAs, beside its loads and stores)
FMA_PIPE_FUNCTIONS = {"rescale_exp": 24}
# Integer instructions of an index's floor division or modulo by a constant, as nvcc compiles them
# (a high multiply and a shift; a modulo adds a multiply-subtract): reshapes and transposes of
# non-power-of-two extents put them on every element.
INDEX_DIVIDE_OPS = 2
INDEX_MODULO_OPS = 3


@dataclass(frozen=True)
class KernelCost:
    bytes_read: float  # distinct bytes each buffer gives the kernel (its first touch, from DRAM)
    bytes_written: float
    ops: float  # weighted: a special function counts EXPENSIVE[op]
    arith_ops: float = 0.0  # instructions on the FMA pipes (adds, multiplies, compares, selects, folds; a
    # multiply whose product a sum accumulates and that add are one FMA)
    special_ops: float = 0.0  # unweighted, on the special-function units
    # Every read beyond the first touch, as (bytes, footprint bytes): a row reading its elements
    # again (a sweep after a fold: footprint one row), or rows reading the same elements (a
    # weight every row reads: footprint the elements read). Where they are served from (L1, L2
    # or DRAM) depends on whether the footprint fits, which the cost model knows per target.
    # Each is (bytes, footprint bytes, whether the footprint is one row's: then every row in flight
    # holds its own, and the cost model multiplies it by the rows a schedule runs at once).
    rereads: tuple[tuple[float, float, bool], ...] = ()
    # What the Loop IR's loads become in an emitted kernel depends on the schedule (the cost
    # model's requested_bytes), so they are kept per buffer (BufferLoads): as often as the Loop IR
    # runs them, how much of that at the level of a row, and what a map's threads load.
    buffers: tuple["BufferLoads", ...] = ()
    accumulators: int = 0  # the folds' accumulators (what a split row leaves in its workspace per slice)
    index_ops: float = 0.0  # integer instructions of the loads' and stores' floor divisions and modulos
    # The entries of `rereads` a row held in registers (STAGE=regs) does not make: its sweep's loads
    # of what its fold loaded (emmy.schedule.held), by position in `rereads`.
    held_rereads: tuple[int, ...] = ()
    held_sources: int = 0  # the fold loads whose elements a held row keeps (a register array each)
    fold_read: float = 0.0  # the part of bytes_read first read inside a fold (a grid-synced row's first phase)
    # The operands a row's sweep reads alike every row (emmy.schedule.held.invariant_loads), in that
    # order: (buffer, bytes as often as the Loop IR loads them, the position in `rereads` of the
    # other rows' reads of them, or -1). STAGE=regs/w<N> keeps the first N in shared memory.
    weights: tuple[tuple[str, float, int], ...] = ()
    # f64 arithmetic, on the FP64 pipes (their rate is a fraction of the fp32 one, per target): not in
    # arith_ops or special_ops; a function counts F64_FUNCTION_OPS
    f64_ops: float = 0.0

    @property
    def reread_bytes(self) -> float:
        return sum(b for b, _, _ in self.rereads)

    @property
    def time(self) -> float:
        return (self.bytes_read + self.bytes_written + self.reread_bytes) / BANDWIDTH + self.ops / OP_RATE + LAUNCH


@dataclass(frozen=True)
class BufferLoads:
    """A buffer's loads in one kernel, in bytes. `loop`: every load as often as the Loop IR runs it
    (a load under guards only where they hold); `row`: the part at the level of a row (inside only
    the free loops: a value the row's epilogue reads, which every thread of a cooperating block
    loads); `element`: each load statement once per output element (what a map's threads load, as
    each recomputes what the Loop IR hoisted). `index`: the buffer is read inside index
    expressions (embedding ids), where a compiler may keep a value in a register across a loop
    that does not change it, so fewer loads may be issued. `row_after`: the row-level bytes
    loaded after a fold (a split row's finishing kernel loads them, its folding blocks do not)."""
    buffer: str
    loop: float
    row: float
    element: float
    index: bool = False
    row_after: float = 0.0  # the part of `row` after the row's fold (its epilogue's loads)
    held: float = 0.0  # the part of `loop` a row held in registers (STAGE=regs) does not load again


def kernel_cost(kernel: Kernel, buffer_sizes: dict[str, tuple[int, int]]) -> KernelCost:
    """buffer_sizes: name -> (elements, bytes per element). Every statement is counted as many times
    as its loops run it; so is every load: the first read of each element is DRAM traffic, the rest
    are re-reads with the footprint that decides which cache serves them."""
    deps = _dependencies(kernel.body)
    ops = arith = special = wide = 0.0
    wide_accs = {s.acc for s in _statements(kernel.body) if isinstance(s, Init) and s.dtype is DType.F64}
    rows_vars = {var for var, _ in parallel_loops(kernel.body)}
    loads: dict[str, list[tuple]] = {}  # buffer -> (reads, distinct, per row, rows, held, inside a fold, name)
    per_buffer: dict[str, list[float]] = {}  # buffer -> [loop, row, load statements, index, row after a fold, held]
    held = held_loads(kernel.body)
    vector_state = _keeps_vector_state(kernel)
    rows_total = _product(extent for _, extent in parallel_loops(kernel.body))

    def trips(stmt_deps: set, loops: list[Loop], shared: bool) -> float:
        # Inside a twisted fold (flash attention's), a value need not be recomputed across a
        # free loop of at most VECTOR_STATE elements it does not depend on: the schedule keeps
        # that loop's state as a vector of accumulators (z over the head dimension).
        total = 1.0
        for loop in loops:
            if loop.var in stmt_deps or not (shared and vector_state) or loop.reduction or \
                    loop.extent > VECTOR_STATE:
                total *= loop.extent
        return total

    def note_load(buffer: str, n: float, loops: list[Loop], index: bool, after_fold: bool, kept: bool) -> None:
        size = buffer_sizes[buffer][1]
        entry = per_buffer.setdefault(buffer, [0.0, 0.0, 0.0, 0.0, 0.0, 0.0])
        if all(l.var in rows_vars for l in loops):  # every row loads it, even where the Loop IR hoisted it
            entry[0] += rows_total * size
            entry[1] += rows_total * size
            entry[4] += rows_total * size if after_fold else 0.0
        else:
            entry[0] += n * size
            entry[5] += n * size if kept else 0.0
        entry[2] += 1
        entry[3] = max(entry[3], float(index))

    index_ops = 0.0

    def note_index(index) -> None:
        # a division or modulo runs once per iteration of the loops down to the innermost one
        # its operand walks: one that depends on outer loops only is hoisted out of the inner ones
        nonlocal index_ops
        for atom, weight in _divisions(index):
            walked = atom.expr.dims()
            depth = max((i + 1 for i, l in enumerate(loops_now) if l.var in walked), default=0)
            index_ops += weight * _product(l.extent for l in loops_now[:depth])

    loops_now: list[Loop] = []

    def walk(body, loops: list[Loop], shared: bool = False, after_fold: bool = False) -> None:
        nonlocal ops, arith, special, wide, loops_now
        loops_now = loops
        for stmt in body:
            if isinstance(stmt, Loop):
                twisted = stmt.reduction and any(isinstance(s, Update) for s in stmt.body)
                walk(stmt.body, loops + [stmt], shared or twisted, after_fold)
                loops_now = loops
                after_fold = after_fold or stmt.reduction
            elif isinstance(stmt, Store):
                note_index(stmt.index)
            elif isinstance(stmt, Assign):
                n = trips(deps.get(stmt.name, set()), loops, shared)
                if isinstance(stmt.expr, Load):
                    index = set().union(*(e.dims() for e in stmt.expr.index)) if stmt.expr.index else set()
                    numel = buffer_sizes[stmt.expr.buffer][0]
                    rows = _product(l.extent for l in loops if l.var in rows_vars)
                    per_row = _product(l.extent for l in loops if l.var in index and l.var not in rows_vars)
                    distinct = min(numel, _product(l.extent for l in loops if l.var in index))
                    n *= _guard_share(stmt.expr.guards, loops)
                    kept = stmt.name in held
                    loads.setdefault(stmt.expr.buffer, []).append((n, min(distinct, n), min(per_row, numel), rows,
                                                                   kept, any(l.reduction for l in loops), stmt.name))
                    note_load(stmt.expr.buffer, n, loops, False, after_fold, kept)
                    note_index(stmt.expr.index)
                    for gathered in gathered_reads(stmt.expr.index):  # each read of an index value
                        note_load(gathered, n, loops, True, after_fold, False)
                elif isinstance(stmt.expr, Op):
                    ops += n * EXPENSIVE.get(stmt.expr.op, FMA_PIPE_FUNCTIONS.get(stmt.expr.op, 1))
                    if stmt.dtype is DType.F64 and stmt.expr.op != "cast":
                        wide += n * (F64_FUNCTION_OPS if stmt.expr.op in SPECIAL_FUNCTIONS else 1)
                    elif stmt.expr.op in SPECIAL_FUNCTIONS:
                        special += n
                    elif stmt.expr.op != "cast":
                        arith += n * FMA_PIPE_FUNCTIONS.get(stmt.expr.op, 1)
                elif isinstance(stmt.expr, Masked):
                    ops += n
                    arith += n
            elif isinstance(stmt, (Accumulate, Update)):
                n = trips(deps.get(stmt.acc, set()), loops, shared)
                ops += n
                # a sum of products is one FMA per term (nvcc contracts the multiply into the add)
                fused = isinstance(stmt, Accumulate) and stmt.op in ("add", "sum") and stmt.value in products
                if isinstance(stmt, Accumulate) and not fused:
                    if stmt.acc in wide_accs:
                        wide += n
                    else:
                        arith += n

    products = {s.name for s in _statements(kernel.body)
                if isinstance(s, Assign) and isinstance(s.expr, Op) and s.expr.op == "multiply"}
    walk(kernel.body, [])
    read, fold_read, rereads, held_rereads = 0.0, 0.0, [], []
    across_of: dict[str, tuple[str, float, int]] = {}  # load name -> (buffer, its bytes, its across re-read)
    for buffer, reads in loads.items():
        size = buffer_sizes[buffer][1]
        first = max(range(len(reads)), key=lambda i: reads[i][1])
        read += reads[first][1] * size
        fold_read += reads[first][1] * size if reads[first][5] else 0.0
        for i, (n, distinct, per_row, rows, kept, _, name) in enumerate(reads):
            # a row's own reads beyond its distinct elements; then other rows' reads of the same
            # elements; a load other than the buffer's first reads what the first one brought
            inner = max(0.0, n - rows * per_row)
            across = max(0.0, rows * per_row - distinct)
            again = distinct if i != first else 0.0
            if inner + again > 0:
                if kept and i != first:  # the sweep's second read of the fold's elements
                    held_rereads.append(len(rereads))
                rereads.append(((inner + again) * size, per_row * size, True))
            across_of[name] = (buffer, n * size, len(rereads) if across > 0 else -1)
            if across > 0:
                rereads.append((across * size, distinct * size, False))
    written = sum(t.numel * t.dtype.itemsize for _, t in kernel.outputs)
    buffers = tuple(BufferLoads(b, loop, row, rows_total * count * buffer_sizes[b][1], bool(index), after, kept)
                    for b, (loop, row, count, index, after, kept) in per_buffer.items())
    accumulators = sum(1 for s in _statements(kernel.body) if isinstance(s, Init))
    return KernelCost(read, written, ops, arith, special, tuple(rereads), buffers, accumulators, index_ops,
                      tuple(held_rereads), len(set(held.values())), fold_read,
                      tuple(across_of[name] for name in invariant_loads(kernel.body) if name in across_of),
                      f64_ops=wide)


def _divisions(index) -> list:
    """(FloorDiv or Mod atom, its integer instructions) for every division in index expressions,
    nested ones and those inside a gathered coordinate's index included."""
    found = []
    pending = list(index)
    while pending:
        expr = pending.pop()
        for atom, _ in expr.terms:
            if isinstance(atom, FloorDiv):
                found.append((atom, INDEX_DIVIDE_OPS))
                pending.append(atom.expr)
            elif isinstance(atom, Mod):
                found.append((atom, INDEX_MODULO_OPS))
                pending.append(atom.expr)
            elif isinstance(atom, Gathered):
                pending.extend(atom.index)
    return found


def _keeps_vector_state(kernel: Kernel) -> bool:
    """Whether the kernel lowers as attention, whose schedule keeps a twisted fold's state over a
    short free loop as a vector of accumulators (other kernels recompute what the Loop IR says)."""
    if not any(isinstance(s, Update) for s in _statements(kernel.body)):
        return False
    from emmy.schedule.shape import kernel_shape

    return kernel_shape(kernel).kind == "attention"


def _guard_share(guards, loops: list[Loop]) -> float:
    """The share of the loops' iterations where every guard holds (a guarded load touches memory
    only there), counted exactly over the loops the guards name when they are few enough; else 1."""
    if not guards:
        return 1.0
    named = sorted(set().union(*(g.expr.dims() for g in guards)))
    if not named:  # constant guards (or data-read ones, taken to hold): everywhere or nowhere
        return float(all(bool(g.holds([])) for g in guards if not gathered_reads([g.expr])))
    extents = {l.var: l.extent for l in loops}
    if any(v not in extents for v in named) or _product(extents[v] for v in named) > 1 << 20:
        return 1.0
    import numpy as np

    grids = np.meshgrid(*[np.arange(extents[v]) for v in named], indexing="ij")
    coords = [None] * (max(named) + 1)
    for v, grid in zip(named, grids):
        coords[v] = grid
    holds = np.ones(grids[0].shape, dtype=bool)
    for guard in guards:  # a guard reading an index tensor (a data value) is taken to hold
        if not gathered_reads([guard.expr]):
            holds &= np.broadcast_to(guard.holds(coords), holds.shape)
    return float(holds.mean())


def _statements(body):
    for stmt in body:
        yield stmt
        if isinstance(stmt, Loop):
            yield from _statements(stmt.body)


def _product(values) -> float:
    total = 1.0
    for v in values:
        total *= v
    return total


VECTOR_STATE = 256  # accumulators a thread block can keep per row (registers, shared memory)


def _dependencies(body) -> dict[str, set]:
    """The loop variables each SSA value and accumulator depends on, through the data flow
    (a fold's state depends on its loop and on what it folds; iterated for Update cycles)."""
    deps: dict[str, set] = {}

    def operand(value) -> set:
        return deps.get(value, set()) if isinstance(value, str) else set()

    def walk(stmts, folds: list[int]) -> bool:
        changed = False
        for stmt in stmts:
            if isinstance(stmt, Loop):
                changed |= walk(stmt.body, folds + [stmt.var] if stmt.reduction else folds)
                continue
            if isinstance(stmt, Assign):
                expr = stmt.expr
                if isinstance(expr, Load):
                    found = set().union(*(e.dims() for e in expr.index)) if expr.index else set()
                elif isinstance(expr, Op):
                    found = set().union(*(operand(a) for a in expr.args)) if expr.args else set()
                else:
                    found = operand(expr.value).union(*(g.expr.dims() for g in expr.guards))
                name = stmt.name
            elif isinstance(stmt, Init):
                found, name = set(), stmt.acc
            elif isinstance(stmt, (Accumulate, Update)):
                found, name = operand(stmt.value) | ({folds[-1]} if folds else set()), stmt.acc
            else:
                continue
            old = deps.get(name, set())
            if not found <= old:
                deps[name] = old | found
                changed = True
        return changed

    while walk(body, []):
        pass
    return deps


def buffer_sizes(program) -> dict[str, tuple[int, int]]:
    """name -> (elements, bytes per element) for every buffer of a LoopProgram."""
    sizes = {name: (t.numel, t.dtype.itemsize) for name, t in (*program.inputs, *program.weights)}
    sizes |= {name: (t.numel, t.dtype.itemsize) for k in program.kernels for name, t in k.outputs}
    return sizes
