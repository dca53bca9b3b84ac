"""Loop IR: each kernel as a loop nest.

Loop variables are numbered per kernel (`a0`, `a1`, ...), index expressions
are Affine over them (d<i> stands for a<i>), and values are SSA names
assigned in one canonical order, so equal terms print identically.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Union

from emmy.affine import Affine, Guard, gathered_buffers
from emmy.dtypes import DType
from emmy.tensor_ir.nodes import TensorType


@dataclass(frozen=True)
class Lit:
    value: object
    dtype: DType


Operand = Union[str, Lit]  # an SSA name or a literal


@dataclass(frozen=True)
class Load:
    """buffer[index]; with `guards`, only where every guard holds (the element reads as 0 elsewhere
    and memory is not touched): a load under a padding, mask or concatenation's guard would read
    outside its buffer where the guard fails."""
    buffer: str
    index: tuple[Affine, ...]
    guards: tuple[Guard, ...] = ()


@dataclass(frozen=True)
class Op:
    op: str  # a scalar op of tensor_ir.scalar_ops
    args: tuple[Operand, ...]


@dataclass(frozen=True)
class Masked:
    """`value` where every guard holds, else `fill` (padding, masks, concatenation)."""

    guards: tuple[Guard, ...]
    value: Operand
    fill: object


@dataclass(frozen=True)
class Assign:
    name: str
    dtype: DType
    expr: Union[Load, Op, Masked]


@dataclass(frozen=True)
class Init:
    acc: str
    op: str  # the reduction monoid: sum, prod, max, min
    dtype: DType


@dataclass(frozen=True)
class Accumulate:
    acc: str
    op: str
    value: Operand


@dataclass(frozen=True)
class Update:
    """acc := value, in loop order: the step of a fold whose state is not a monoid
    accumulator (the online softmax's running max and rescaled sum)."""

    acc: str
    value: Operand


@dataclass(frozen=True)
class Store:
    buffer: str
    index: tuple[Affine, ...]
    value: Operand


@dataclass(frozen=True)
class Loop:
    var: int
    extent: int
    body: tuple["Stmt", ...]
    reduction: bool = False


Stmt = Union[Assign, Init, Accumulate, Update, Store, Loop]


@dataclass(frozen=True)
class Kernel:
    name: str
    output: str
    type: TensorType
    body: tuple[Stmt, ...]
    # sibling folds merged into this kernel (emmy.loop_ir.siblings) store these outputs too
    more_outputs: tuple[tuple[str, TensorType], ...] = ()

    @property
    def outputs(self) -> tuple[tuple[str, TensorType], ...]:
        """(buffer, type) of every output the kernel stores, `output` first."""
        return ((self.output, self.type), *self.more_outputs)


@dataclass(frozen=True)
class LoopProgram:
    kernels: tuple[Kernel, ...]
    inputs: tuple[tuple[str, TensorType], ...]
    weights: tuple[tuple[str, TensorType], ...]
    outputs: tuple[str, ...]  # buffer names, in the program's output order


def buffer_types(loops: LoopProgram) -> dict:
    """Every buffer of the program (inputs, weights, kernel outputs) -> TensorType."""
    return dict(loops.inputs) | dict(loops.weights) | {name: t for k in loops.kernels for name, t in k.outputs}


def parallel_loops(body: tuple) -> list[tuple[int, int]]:
    """(var, extent) of the free loops that own output elements (or rows): those not inside a
    reduction loop and not beside one. A free loop beside a fold (a sweep over the row the fold
    read) runs inside its row, whatever it holds."""
    found: list[tuple[int, int]] = []
    stack = [body]
    while stack:
        stmts = stack.pop()
        beside_fold = any(isinstance(s, Loop) and s.reduction for s in stmts)
        for stmt in stmts:
            if isinstance(stmt, Loop) and not stmt.reduction and not beside_fold:
                found.append((stmt.var, stmt.extent))
                stack.append(stmt.body)
    return found


def fresh_name(base: str, taken: set[str]) -> str:
    """`base`, or `base_1`, `base_2`, ..., the first that `taken` does not hold (the caller adds it)."""
    name, k = base, 1
    while name in taken:
        name, k = f"{base}_{k}", k + 1
    return name


def free_nest(body: tuple) -> tuple[tuple[tuple[int, int], ...], tuple]:
    """(var, extent) of the free loops each the only statement of the one around it, outermost
    first, and the statements inside the innermost."""
    free = []
    while len(body) == 1 and isinstance(body[0], Loop) and not body[0].reduction:
        free.append((body[0].var, body[0].extent))
        body = body[0].body
    return tuple(free), body


def substituted(stmts: tuple, dims: list, extents: list[int], loop_vars: dict[int, int] | None = None) -> tuple:
    """`stmts` with every index and guard's coordinates replaced by `dims` (`extents` bound them),
    and the loops in `loop_vars` (old variable -> new) renumbered."""
    loop_vars = loop_vars or {}

    def index(exprs):
        return tuple(e.substitute(dims, extents) for e in exprs)

    def guards(gs):
        return tuple(Guard(g.expr.substitute(dims, extents), g.lo, g.hi) for g in gs)

    out = []
    for stmt in stmts:
        if isinstance(stmt, Loop):
            stmt = Loop(loop_vars.get(stmt.var, stmt.var), stmt.extent,
                        substituted(stmt.body, dims, extents, loop_vars), stmt.reduction)
        elif isinstance(stmt, Assign) and isinstance(stmt.expr, Load):
            stmt = Assign(stmt.name, stmt.dtype, Load(stmt.expr.buffer, index(stmt.expr.index), guards(stmt.expr.guards)))
        elif isinstance(stmt, Assign) and isinstance(stmt.expr, Masked):
            stmt = Assign(stmt.name, stmt.dtype, Masked(guards(stmt.expr.guards), stmt.expr.value, stmt.expr.fill))
        elif isinstance(stmt, Store):
            stmt = Store(stmt.buffer, index(stmt.index), stmt.value)
        out.append(stmt)
    return tuple(out)


def row_nest(body: tuple, free) -> tuple[list[tuple[int, int]], tuple]:
    """The chain of free loops (variables in `free`) that places a kernel's rows, outermost first,
    and the statements one row runs. Statements the Loop IR hoisted above an inner free loop (a
    value of the outer row only) are carried into that loop: each row recomputes them, so every
    free loop is a row index and none runs rows one after another inside a thread."""
    loops, carried = [], []
    while True:
        *before, last = body if body else (None,)
        if not (isinstance(last, Loop) and not last.reduction and last.var in free
                and all(isinstance(s, Assign) for s in before)):
            return loops, tuple(carried) + tuple(body)
        loops.append((last.var, last.extent))
        carried += before
        body = last.body


def statements(body):
    """Every statement of `body`, loops searched, in program order (a loop before its body)."""
    todo = list(reversed(body))
    while todo:
        stmt = todo.pop()
        yield stmt
        if isinstance(stmt, Loop):
            todo.extend(reversed(stmt.body))


def kernel_index_tensors(kernel: Kernel) -> set[str]:
    """The index tensors a kernel reads inside its index expressions (gathers by ids)."""
    return index_tensors(kernel.body)


def index_tensors(body) -> set[str]:
    """The index tensors statements (loops searched) read inside their index expressions."""
    exprs = []
    todo = list(body)
    while todo:
        stmt = todo.pop()
        if isinstance(stmt, Loop):
            todo.extend(stmt.body)
        elif isinstance(stmt, Assign) and isinstance(stmt.expr, Load):
            exprs += [*stmt.expr.index, *(g.expr for g in stmt.expr.guards)]
        elif isinstance(stmt, Assign) and isinstance(stmt.expr, Masked):
            exprs += [g.expr for g in stmt.expr.guards]
        elif isinstance(stmt, Store):
            exprs += list(stmt.index)
    return gathered_buffers(exprs)


def renamed(stmt, rename: dict[str, str]):
    """`stmt` with the values and accumulators in `rename` (old -> new) renamed where it defines or
    reads them (nested loops too)."""
    def value(v):
        return rename.get(v, v) if isinstance(v, str) else v

    if isinstance(stmt, Assign):
        expr = stmt.expr
        if isinstance(expr, Op):
            expr = dataclasses.replace(expr, args=tuple(value(x) for x in expr.args))
        elif isinstance(expr, Masked):
            expr = dataclasses.replace(expr, value=value(expr.value))
        return dataclasses.replace(stmt, name=rename.get(stmt.name, stmt.name), expr=expr)
    if isinstance(stmt, Init):
        return dataclasses.replace(stmt, acc=rename.get(stmt.acc, stmt.acc))
    if isinstance(stmt, (Accumulate, Update)):
        return dataclasses.replace(stmt, acc=rename.get(stmt.acc, stmt.acc), value=value(stmt.value))
    if isinstance(stmt, Store):
        return dataclasses.replace(stmt, value=value(stmt.value))
    if isinstance(stmt, Loop):
        return dataclasses.replace(stmt, body=tuple(renamed(s, rename) for s in stmt.body))
    raise TypeError(f"no renaming for {type(stmt).__name__}")


def values_read(stmt) -> set[str]:
    """The values (and accumulators) a statement reads by name: an op's operands, a masked value,
    what a fold step or a store takes."""
    if isinstance(stmt, (Accumulate, Update, Store)):
        values = (stmt.value,)
    elif isinstance(stmt, Assign) and isinstance(stmt.expr, Op):
        values = stmt.expr.args
    elif isinstance(stmt, Assign) and isinstance(stmt.expr, Masked):
        values = (stmt.expr.value,)
    else:
        values = ()
    return {v for v in values if isinstance(v, str)}
