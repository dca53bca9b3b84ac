"""The provisional cost of Loop IR: bytes moved plus operations, per kernel.

Without a target: time = bytes / bandwidth + operations / rate + launch
overhead per kernel. Every statement, loads included, is counted with the
number of times its loop nest runs it, so a value recomputed inside a loop
it does not depend on costs what it should; a load's first touch of each
element is DRAM traffic (`bytes_read`) and the rest are re-reads with the
footprint that decides, per target, which cache serves them (`rereads`,
priced by extract/cost_model.py).
"""

from __future__ import annotations

from dataclasses import dataclass

from emmy.loop_ir.nodes import Accumulate, Assign, Init, Kernel, Load, Loop, Masked, Op, Update, parallel_loops

BANDWIDTH = 2.0e12  # bytes/s: an HBM-class GPU (order of magnitude; replaced per target later)
OP_RATE = 2.0e13  # scalar ops/s
LAUNCH = 3.0e-6  # s per kernel
EXPENSIVE = {"exp": 4, "log": 4, "sqrt": 4, "rsqrt": 4, "sigmoid": 4, "tanh": 4, "erf": 4, "divide": 4, "power": 8,
             "cos": 4, "sin": 4, "log1p": 4, "expm1": 4}
SPECIAL_FUNCTIONS = set(EXPENSIVE)  # the SFU's work


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

    @property
    def reread_bytes(self) -> float:
        return sum(b for b, _, _ in self.rereads)

    @property
    def time(self) -> float:
        return (self.bytes_read + self.bytes_written + self.reread_bytes) / BANDWIDTH + self.ops / OP_RATE + LAUNCH


def kernel_cost(kernel: Kernel, buffer_sizes: dict[str, tuple[int, int]]) -> KernelCost:
    """buffer_sizes: name -> (elements, bytes per element). Every statement is counted as many times
    as its loops run it; so is every load: the first read of each element is DRAM traffic, the rest
    are re-reads with the footprint that decides which cache serves them."""
    deps = _dependencies(kernel.body)
    ops = arith = special = 0.0
    rows_vars = {var for var, _ in parallel_loops(kernel.body)}
    loads: dict[str, list[tuple[float, float, float, float]]] = {}  # buffer -> (reads, distinct, per row, rows)

    def trips(stmt_deps: set, loops: list[Loop], shared: bool) -> float:
        # Inside a twisted fold (flash attention's), a value need not be recomputed across a
        # free loop of at most VECTOR_STATE elements it does not depend on: the schedule keeps
        # that loop's state as a vector of accumulators (z over the head dimension).
        total = 1.0
        for loop in loops:
            if loop.var in stmt_deps or not shared or loop.reduction or loop.extent > VECTOR_STATE:
                total *= loop.extent
        return total

    def walk(body, loops: list[Loop], shared: bool = False) -> None:
        nonlocal ops, arith, special
        for stmt in body:
            if isinstance(stmt, Loop):
                twisted = stmt.reduction and any(isinstance(s, Update) for s in stmt.body)
                walk(stmt.body, loops + [stmt], shared or twisted)
            elif isinstance(stmt, Assign):
                n = trips(deps.get(stmt.name, set()), loops, shared)
                if isinstance(stmt.expr, Load):
                    index = set().union(*(e.dims() for e in stmt.expr.index)) if stmt.expr.index else set()
                    numel = buffer_sizes[stmt.expr.buffer][0]
                    rows = _product(l.extent for l in loops if l.var in rows_vars)
                    per_row = _product(l.extent for l in loops if l.var in index and l.var not in rows_vars)
                    distinct = min(numel, _product(l.extent for l in loops if l.var in index))
                    loads.setdefault(stmt.expr.buffer, []).append((n, distinct, min(per_row, numel), rows))
                elif isinstance(stmt.expr, Op):
                    ops += n * EXPENSIVE.get(stmt.expr.op, 1)
                    if stmt.expr.op in SPECIAL_FUNCTIONS:
                        special += n
                    elif stmt.expr.op != "cast":
                        arith += n
                elif isinstance(stmt.expr, Masked):
                    ops += n
                    arith += n
            elif isinstance(stmt, (Accumulate, Update)):
                n = trips(deps.get(stmt.acc, set()), loops, shared)
                ops += n
                # a sum of products is one FMA per term (nvcc contracts the multiply into the add)
                fused = isinstance(stmt, Accumulate) and stmt.op in ("add", "sum") and stmt.value in products
                arith += n if isinstance(stmt, Accumulate) and not fused else 0

    products = {s.name for s in _statements(kernel.body)
                if isinstance(s, Assign) and isinstance(s.expr, Op) and s.expr.op == "multiply"}
    walk(kernel.body, [])
    read, rereads = 0.0, []
    for buffer, reads in loads.items():
        size = buffer_sizes[buffer][1]
        first = max(range(len(reads)), key=lambda i: reads[i][1])
        read += reads[first][1] * size
        for i, (n, distinct, per_row, rows) in enumerate(reads):
            # a row's own reads beyond its distinct elements; then other rows' reads of the same
            # elements; a load other than the buffer's first reads what the first one brought
            inner = max(0.0, n - rows * per_row)
            across = max(0.0, rows * per_row - distinct)
            again = distinct if i != first else 0.0
            if inner + again > 0:
                rereads.append(((inner + again) * size, per_row * size, True))
            if across > 0:
                rereads.append((across * size, distinct * size, False))
    written = kernel.type.numel * kernel.type.dtype.itemsize
    return KernelCost(read, written, ops, arith, special, tuple(rereads))


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
    sizes |= {k.output: (k.type.numel, k.type.dtype.itemsize) for k in program.kernels}
    return sizes
