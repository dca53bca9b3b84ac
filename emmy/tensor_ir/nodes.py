"""Tensor IR: three primitive kinds over named, typed values.

- Elementwise: a scalar function of operands of the output's shape (rank-0
  constants broadcast implicitly: they are literals of the scalar function).
- Reduce: a monoid (sum, prod, max, min) over one axis; the axis stays with
  extent 1, and an IndexMap drops it where the program needs.
- IndexMap: a layout as a quasi-affine map from output coordinates to operand
  coordinates, with optional guards and a fill value for coordinates that
  fall outside them (concatenation, causal masks).

Nodes name their operands, and a TensorGraph holds them in topological order.
`origin` records which ATen op (and source line) produced a node; it is
provenance, not meaning, so it takes no part in equality.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from typing import Union

from emmy.affine import Affine, Guard, gathered_buffers
from emmy.dtypes import DType
from emmy.errors import TensorIRError
from emmy.tensor_ir.scalar_ops import REDUCE_OPS, SCALAR_OPS


@dataclass(frozen=True)
class TensorType:
    shape: tuple[int, ...]
    dtype: DType

    @property
    def rank(self) -> int:
        return len(self.shape)

    @property
    def numel(self) -> int:
        n = 1
        for s in self.shape:
            n *= s
        return n

    def __str__(self) -> str:
        return f"{self.dtype}[{','.join(str(s) for s in self.shape)}]"


@dataclass(frozen=True)
class Input:
    name: str
    type: TensorType
    origin: str = field(default="", compare=False)


@dataclass(frozen=True)
class Weight:
    name: str
    type: TensorType
    origin: str = field(default="", compare=False)


@dataclass(frozen=True)
class Constant:
    name: str
    type: TensorType  # always rank 0
    value: Union[float, int, bool]
    origin: str = field(default="", compare=False)


@dataclass(frozen=True)
class Elementwise:
    name: str
    type: TensorType
    op: str
    operands: tuple[str, ...]
    origin: str = field(default="", compare=False)


@dataclass(frozen=True)
class Reduce:
    name: str
    type: TensorType
    op: str
    operand: str
    axis: int  # non-negative; printed counting from the end
    origin: str = field(default="", compare=False)


@dataclass(frozen=True)
class IndexMap:
    name: str
    type: TensorType
    operand: str
    index: tuple[Affine, ...]  # one expression per operand axis, over output coordinates
    guards: tuple[Guard, ...] = ()
    fill: Union[float, int, bool, None] = None
    origin: str = field(default="", compare=False)


Node = Union[Input, Weight, Constant, Elementwise, Reduce, IndexMap]


def operands_of(node: Node) -> tuple[str, ...]:
    if isinstance(node, Elementwise):
        return node.operands
    if isinstance(node, IndexMap):  # and the index tensors it gathers by
        return (node.operand, *sorted(gathered_buffers((*node.index, *(g.expr for g in node.guards)))))
    if isinstance(node, Reduce):
        return (node.operand,)
    return ()



@dataclass(frozen=True)
class TensorGraph:
    nodes: tuple[Node, ...]
    outputs: tuple[str, ...]

    @cached_property
    def by_name(self) -> dict[str, Node]:
        return {n.name: n for n in self.nodes}

    def __getitem__(self, name: str) -> Node:
        return self.by_name[name]

    @property
    def inputs(self) -> tuple[Input, ...]:
        return tuple(n for n in self.nodes if isinstance(n, Input))

    @property
    def weights(self) -> tuple[Weight, ...]:
        return tuple(n for n in self.nodes if isinstance(n, Weight))

    @cached_property
    def index_tensors(self) -> tuple[str, ...]:
        """Computed values (not inputs or weights) that IndexMaps gather by: kernels read them from
        memory inside index expressions, so extraction keeps each in a buffer of its own."""
        leaves = {n.name for n in self.nodes if isinstance(n, (Input, Weight))}
        found: set[str] = set()
        for n in self.nodes:
            if isinstance(n, IndexMap):
                found |= gathered_buffers((*n.index, *(g.expr for g in n.guards)))
        return tuple(sorted(found - leaves))

    @cached_property
    def use_counts(self) -> dict[str, int]:
        counts = {n.name: 0 for n in self.nodes}
        for n in self.nodes:
            for o in operands_of(n):
                counts[o] += 1
        for o in self.outputs:
            counts[o] += 1
        return counts

    def validate(self) -> "TensorGraph":
        """Check shapes, dtypes and ordering; raise TensorIRError on the first fault."""
        seen: dict[str, Node] = {}
        for node in self.nodes:
            if node.name in seen:
                raise TensorIRError(f"{node.name}: defined twice")
            for o in operands_of(node):
                if o not in seen:
                    raise TensorIRError(f"{node.name}: operand {o} is not defined before use")
            _check_node(node, seen)
            seen[node.name] = node
        for o in self.outputs:
            if o not in seen:
                raise TensorIRError(f"output {o} is not defined")
        return self


def _check_node(node: Node, seen: dict[str, Node]) -> None:
    t = node.type
    if isinstance(node, Constant) and t.rank != 0:
        raise TensorIRError(f"{node.name}: constants are rank 0")
    if isinstance(node, Elementwise):
        op = SCALAR_OPS.get(node.op)
        if op is None:
            raise TensorIRError(f"{node.name}: unknown scalar op {node.op}")
        if len(node.operands) != op.arity:
            raise TensorIRError(f"{node.name}: {node.op} takes {op.arity} operands")
        for o in node.operands:
            ot = seen[o].type
            if ot.shape != t.shape and not (isinstance(seen[o], Constant)):
                raise TensorIRError(f"{node.name}: operand {o} has shape {ot.shape}, not {t.shape}")
        if op.kind in ("compare", "logic") and t.dtype is not DType.BOOL:
            raise TensorIRError(f"{node.name}: {node.op} yields bool")
        if op.kind == "arith":
            for o in node.operands:
                if seen[o].type.dtype is not t.dtype:
                    raise TensorIRError(f"{node.name}: operand {o} is {seen[o].type.dtype}, not {t.dtype}")
    if isinstance(node, Reduce):
        if node.op not in REDUCE_OPS:
            raise TensorIRError(f"{node.name}: unknown reduction {node.op}")
        src = seen[node.operand].type
        if not 0 <= node.axis < src.rank:
            raise TensorIRError(f"{node.name}: axis {node.axis} out of range")
        want = src.shape[: node.axis] + (1,) + src.shape[node.axis + 1 :]
        if t.shape != want or t.dtype is not src.dtype:
            raise TensorIRError(f"{node.name}: reduce of {src} over {node.axis} is not {t}")
    if isinstance(node, IndexMap):
        src = seen[node.operand].type
        if len(node.index) != src.rank:
            raise TensorIRError(f"{node.name}: {len(node.index)} index expressions for rank {src.rank}")
        if t.dtype is not src.dtype:
            raise TensorIRError(f"{node.name}: index maps keep the dtype")
        if node.guards and node.fill is None:
            raise TensorIRError(f"{node.name}: a guarded index map needs a fill value")
        for axis, expr in enumerate(node.index):
            if any(d >= t.rank for d in expr.dims()):
                raise TensorIRError(f"{node.name}: index uses a coordinate beyond rank {t.rank}")
            if not node.guards:
                lo, hi = expr.bounds(t.shape)
                if t.numel and (lo < 0 or hi >= src.shape[axis]):
                    raise TensorIRError(
                        f"{node.name}: index {expr} ranges over [{lo}, {hi}], outside axis {axis} of {src}"
                    )
