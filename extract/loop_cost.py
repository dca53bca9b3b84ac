"""The provisional cost of Loop IR: bytes moved plus operations, per kernel.

This is the simple model the fusion choice needs before the analytic,
per-target model exists: time = bytes / bandwidth + operations / rate +
launch overhead per kernel. Bytes are what each kernel reads (an element
read many times is counted once, as a cache would) and writes; operations
are counted with the number of times their loop nest runs them, so a value
recomputed inside a loop it does not depend on costs what it should.
"""

from __future__ import annotations

from dataclasses import dataclass

from emmy.loop_ir.nodes import Accumulate, Assign, Init, Kernel, Load, Loop, Masked, Op, Update

BANDWIDTH = 2.0e12  # bytes/s: an HBM-class GPU (order of magnitude; replaced per target later)
OP_RATE = 2.0e13  # scalar ops/s
LAUNCH = 3.0e-6  # s per kernel
EXPENSIVE = {"exp": 4, "log": 4, "sqrt": 4, "rsqrt": 4, "sigmoid": 4, "tanh": 4, "erf": 4, "divide": 4, "power": 8}
SPECIAL_FUNCTIONS = {"exp", "log", "sqrt", "rsqrt", "sigmoid", "tanh", "erf", "divide", "power"}  # the SFU's work


@dataclass(frozen=True)
class KernelCost:
    bytes_read: float
    bytes_written: float
    ops: float  # weighted: a special function counts EXPENSIVE[op]
    arith_ops: float = 0.0  # unweighted, on the FMA pipes (adds, multiplies, compares, selects, folds)
    special_ops: float = 0.0  # unweighted, on the special-function units

    @property
    def time(self) -> float:
        return (self.bytes_read + self.bytes_written) / BANDWIDTH + self.ops / OP_RATE + LAUNCH


def kernel_cost(kernel: Kernel, buffer_sizes: dict[str, tuple[int, int]]) -> KernelCost:
    """buffer_sizes: name -> (elements, bytes per element)."""
    deps = _dependencies(kernel.body)
    reads: dict[str, float] = {}
    ops = arith = special = 0.0

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
                    numel, size = buffer_sizes[stmt.expr.buffer]
                    reads[stmt.expr.buffer] = reads.get(stmt.expr.buffer, 0.0) + min(n, numel) * size
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
                arith += n if isinstance(stmt, Accumulate) else 0

    walk(kernel.body, [])
    # A buffer's elements are fetched at most once each, however many loads read them.
    read = sum(min(v, buffer_sizes[b][0] * buffer_sizes[b][1]) for b, v in reads.items())
    written = kernel.type.numel * kernel.type.dtype.itemsize
    return KernelCost(read, written, ops, arith, special)


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
