"""Values that are functions of their coordinates alone: aranges, and the masks made from them.

`torch.arange(T)[:, None] >= torch.arange(T)` and `torch.tril(torch.ones(T, T))` (which torch
decomposes into such comparisons) are constants of the program, weights read from memory: a load
per element, and a mask whose shape the schedule cannot see (a causal mask's bound on the keys,
emmy.schedule.key_bounds). A gather by `arange(T)` (an embedding by positions) reads its index
tensor where a plain affine index would do.

This pass walks a Tensor IR graph once, in order, and finds two kinds of value:

- `Linear`: an integer, exactly held in the node's dtype, affine in the node's coordinates (an
  arange; a known weight whose values fit one; sums, differences and scalings of them; views);
- `Piecewise`: one scalar where a conjunction of index guards holds and another elsewhere (a
  comparison of two Linear values; a where, cast or logical op of such masks and scalars,
  evaluated on the two scalars by the interpreter's own scalar ops, so the values are exact).

It then writes each computed Piecewise node as an IndexMap of a scalar with guards and a fill
(the form sdpa's `is_causal` mask is built in), replaces each gather by a Linear index tensor with
the affine expression itself, and drops the nodes (and weight values) nothing reads any more.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import product

import numpy as np

from emmy.affine import Affine, Dim, FloorDiv, Gathered, Guard, Mod
from emmy.dtypes import DType, to_storage
from emmy.tensor_ir.interpreter import apply_scalar
from emmy.tensor_ir.nodes import (Constant, Elementwise, IndexMap, Input, Reduce, TensorGraph, TensorType, Weight,
                                  operands_of)
from emmy.tensor_ir.scalar_ops import SCALAR_OPS

_FIT_LIMIT = 1 << 22  # elements: a larger weight is not searched for an affine pattern
_MASK_FIT_LIMIT = 1 << 26  # nor a larger one for a triangle (a causal buffer of 8192 x 8192 is searched)
_EXACT_FLOAT = {DType.F64: 2 ** 53, DType.F32: 2 ** 24, DType.F16: 2 ** 11, DType.BF16: 2 ** 8}
_INT_RANGE = {DType.I64: (-(2 ** 63), 2 ** 63 - 1), DType.I32: (-(2 ** 31), 2 ** 31 - 1),
              DType.I16: (-(2 ** 15), 2 ** 15 - 1), DType.I8: (-128, 127), DType.U8: (0, 255)}
_MAX_GUARD_SETS = 3  # operands of distinct masks one Piecewise combination may join
_MAX_FLIPS = 3  # one-guard operands tried both ways round (2^3 combinations at most)


@dataclass(frozen=True)
class Linear:
    """An integer value, `expr` over the node's coordinates (no gathered reads)."""

    expr: Affine


@dataclass(frozen=True)
class Piecewise:
    """`inside` where every guard holds, else `outside` (0-d arrays in the node's storage type)."""

    guards: tuple[Guard, ...]
    inside: np.ndarray
    outside: np.ndarray
    derived: bool = True  # made from index values (False for a literal): worth writing as guards


def fold_index_values(graph: TensorGraph, weights: dict, fixed_weights: set[str]) -> tuple[TensorGraph, dict]:
    """(the graph with its index-only masks and gathers rewritten, the weight values it still reads).
    `fixed_weights`: the weights whose values are the program's constants (not changed in place),
    which may be searched for an affine pattern."""
    finder = _Finder(graph, weights, fixed_weights)
    nodes: list = []
    changed = False
    for node in graph.nodes:
        if isinstance(node, IndexMap):
            node = finder.ungathered(node)
        finder.note(node)
        replacement = finder.as_guarded_scalar(node)
        if replacement is not None:
            constant, node = replacement
            if constant is not None:
                nodes.append(constant)
        changed = changed or node is not graph.by_name[node.name]
        nodes.append(node)
    if not changed:
        return graph, weights
    read = _reachable(TensorGraph(tuple(nodes), graph.outputs))  # the masks' aranges are read no more
    kept = TensorGraph(tuple(n for n in nodes if n.name in read or isinstance(n, Input)), graph.outputs)
    return kept.validate(), {k: v for k, v in weights.items() if k in read}


def _reachable(graph: TensorGraph) -> set[str]:
    seen, stack = set(graph.outputs), list(graph.outputs)
    while stack:
        for operand in operands_of(graph.by_name[stack.pop()]):
            if operand not in seen:
                seen.add(operand)
                stack.append(operand)
    return seen


class _Finder:
    """The Linear and Piecewise values of the nodes seen so far."""

    def __init__(self, graph: TensorGraph, weights: dict, fixed_weights: set[str]):
        self.graph = graph
        self.weights = weights
        self.fixed = fixed_weights
        self.values: dict[str, Linear | Piecewise | None] = {}
        self.types: dict[str, TensorType] = {}
        self.constants: dict[tuple, str] = {}  # (dtype, value bytes) -> a Constant node of it
        self.names = set(graph.by_name)

    # -- values -----------------------------------------------------------
    def note(self, node) -> None:
        self.types[node.name] = node.type
        if isinstance(node, Constant):
            self.constants.setdefault(_key(node.type.dtype, _scalar(node.value, node.type.dtype)), node.name)
        if not isinstance(node, Weight):
            self.values[node.name] = self._value(node)

    def value(self, name: str):
        if name not in self.values:  # a weight, fitted on first use
            node = self.graph.by_name[name]
            self.values[name] = (self._fitted(node) or self._fitted_mask(node)) if isinstance(node, Weight) else None
        return self.values[name]

    def _value(self, node):
        dtype = node.type.dtype
        if isinstance(node, Constant):
            scalar = _scalar(node.value, dtype)
            return Piecewise((), scalar, scalar, derived=False)
        if isinstance(node, Weight):
            return None  # fitted when a node asks for its value (most weights are not index values)
        if isinstance(node, IndexMap):
            return self._mapped(node)
        if isinstance(node, Elementwise):
            return self._combined(node) or self._linear_op(node)
        if isinstance(node, Reduce):
            return self._reduced(node)
        return None

    def _known(self, node: Weight, limit: int = _FIT_LIMIT) -> np.ndarray | None:
        values = self.weights.get(node.name)
        if node.name not in self.fixed or values is None or not node.type.shape:
            return None
        values = np.asarray(values)
        return values if 0 < values.size <= limit else None

    def _fitted(self, node: Weight) -> Linear | None:
        """A known weight whose values are c + sum_k a_k * d_k, some a_k not 0 (an arange)."""
        values = self._known(node)
        if values is None or node.type.dtype is DType.BOOL:
            return None
        head = values.reshape(-1)[:64]  # a trained weight fails here, before a pass over all of it
        if node.type.dtype.is_float and not (np.all(np.isfinite(head)) and np.all(head == np.round(head))):
            return None
        if node.type.dtype.is_float and not (np.all(np.isfinite(values)) and np.all(values == np.round(values))):
            return None
        ints = values.astype(np.int64)
        origin = int(ints.reshape(-1)[0])
        expected = np.full(ints.shape, origin, dtype=np.int64)
        expr = Affine.constant(origin)
        for axis, n in enumerate(ints.shape):
            if n < 2:
                continue
            step = int(ints[(0,) * axis + (1,) + (0,) * (ints.ndim - axis - 1)]) - origin
            shape = [1] * ints.ndim
            shape[axis] = n
            expected = expected + step * np.arange(n, dtype=np.int64).reshape(shape)
            expr = expr + Affine.dim(axis) * step
        if expr.is_constant:
            return None  # a weight of one value (a fresh norm's scale) is a weight, not an arange
        return Linear(expr) if np.array_equal(expected, ints) else None

    def _fitted_mask(self, node: Weight) -> Piecewise | None:
        """A known weight of two values split by a diagonal of its last two axes, the same for
        every leading index (a causal buffer: torch.tril(torch.ones(T, T)), minGPT's `bias`).
        Checked through each row's count of inside values: no temporary larger than a bool per
        element."""
        values = self._known(node, _MASK_FIT_LIMIT)
        if values is None or values.ndim < 2 or len(np.unique(values.reshape(-1)[:256])) > 2:
            return None  # (a trained weight has more than two values among its first few)
        rows, cols = values.shape[-2:]
        plane = values.reshape(-1, rows, cols)[0]
        inside = plane[0, 0]
        is_inside = plane == inside
        if is_inside.all() or not np.all(values == plane):
            return None
        outside = plane[~is_inside][0]
        if not np.all(is_inside | (plane == outside)):
            return None
        offset = Affine.dim(values.ndim - 1) - Affine.dim(values.ndim - 2)  # column - row
        k = _triangle_offset(is_inside, lower=True)
        if k is not None:
            guard = Guard(offset, hi=k + 1)  # column - row <= k
        else:
            k = _triangle_offset(is_inside, lower=False)
            if k is None:
                return None
            guard = Guard(offset, lo=k)  # column - row >= k
        dtype = node.type.dtype
        return Piecewise((guard,), _scalar(inside, dtype), _scalar(outside, dtype))

    def _mapped(self, node: IndexMap):
        value = self.value(node.operand)
        if value is None or _has_gathers((*node.index, *(g.expr for g in node.guards))):
            return None
        shape = node.type.shape
        if isinstance(value, Linear):
            if node.guards:
                return None
            return Linear(value.expr.substitute(node.index, shape))
        guards = tuple(Guard(g.expr.substitute(node.index, shape), g.lo, g.hi) for g in value.guards)
        if not node.guards:
            return _piecewise(guards, value.inside, value.outside, shape, value.derived)
        fill = _scalar(node.fill, node.type.dtype)
        if value.guards and not _same(value.outside, fill):
            return None  # three regions
        return _piecewise(guards + node.guards, value.inside, fill, shape)

    def _combined(self, node: Elementwise) -> Piecewise | None:
        """The op on Piecewise (or constant) operands, evaluated on each region's scalars: a
        Piecewise when every region but the one where all masks hold gives one value. A mask of
        one one-sided guard may be read the other way round (`a | b` of two comparisons is the
        negation of a conjunction), so each such operand is tried both ways."""
        operands = [self._as_piecewise(o) for o in node.operands]
        if any(v is None for v in operands):
            return None
        flippable = [k for k, v in enumerate(operands) if _negated(v) is not None]
        for flips in product((False, True), repeat=min(len(flippable), _MAX_FLIPS)):
            tried = list(operands)
            for k, flip in zip(flippable, flips):
                tried[k] = _negated(tried[k]) if flip else tried[k]
            found = self._regions(node, tried)
            if found is not None:
                return found
        return None

    def _regions(self, node: Elementwise, operands: list[Piecewise]) -> Piecewise | None:
        masks: list[tuple[Guard, ...]] = []
        for v in operands:
            if v.guards and v.guards not in masks:
                masks.append(v.guards)
        if len(masks) > _MAX_GUARD_SETS:
            return None
        results = {}
        for holds in product((True, False), repeat=len(masks)):
            region = dict(zip(masks, holds))
            args = [v.inside if not v.guards or region[v.guards] else v.outside for v in operands]
            results[holds] = apply_scalar(node.op, node.type.dtype, [np.asarray(a) for a in args])
        inside = results[(True,) * len(masks)]
        rest = [r for holds, r in results.items() if not all(holds)]
        if any(not _same(r, rest[0]) for r in rest):
            return None
        guards = tuple(g for mask in masks for g in mask)
        derived = any(v.derived for v in operands)
        return _piecewise(guards, inside, rest[0] if rest else inside, node.type.shape, derived)

    def _reduced(self, node: Reduce) -> Piecewise | None:
        """A max (min) over an axis of a mask whose inside value is the larger (smaller): the inside
        value where some coordinate on the axis satisfies every guard, the outside one elsewhere.
        The guards on the axis must bound it with coefficient 1 or -1: then a coordinate exists
        exactly where each lower bound is at most each upper bound (Fourier-Motzkin)."""
        value = self._as_piecewise(node.operand)
        if value is None or node.op not in ("max", "min"):
            return None
        pick = "maximum" if node.op == "max" else "minimum"
        dtype = node.type.dtype
        if not _same(apply_scalar(pick, dtype, [value.inside, value.outside]), value.inside):
            value = _negated(value)  # the outside value wins where any coordinate fails: a for-all,
            if value is None:  # an exists for the negated mask when there is one
                return None
        extent = self.types[node.operand].shape[node.axis]
        if extent == 0:
            return None  # the reduction's identity, not either value
        axis = Dim(node.axis)
        lowers, uppers, others = [Affine.constant(0)], [Affine.constant(extent - 1)], []
        for g in value.guards:
            c = dict(g.expr.terms).get(axis, 0)
            rest = g.expr - Affine.dim(node.axis) * c
            if node.axis in rest.dims():
                return None  # the axis inside a division or a gather
            if c == 0:
                others.append(g)
            elif c in (1, -1):  # lo <= c*k + rest < hi
                low = None if g.lo is None else (Affine.constant(g.lo) - rest) * c
                high = None if g.hi is None else (Affine.constant(g.hi - 1) - rest) * c
                low, high = (low, high) if c == 1 else (high, low)
                lowers += [low] if low is not None else []
                uppers += [high] if high is not None else []
            else:
                return None
        exists = [Guard(u - lo, lo=0) for lo in lowers for u in uppers]
        return _piecewise(tuple(others) + tuple(exists), value.inside, value.outside, node.type.shape, value.derived)

    def _as_piecewise(self, name: str) -> Piecewise | None:
        """A node's value as a Piecewise (a constant Linear value as one of no guards), or None."""
        value = self.value(name)
        if isinstance(value, Linear) and value.expr.is_constant:
            scalar = _scalar(value.expr.const, self.types[name].dtype)
            return Piecewise((), scalar, scalar)  # derived: an arange's value
        return value if isinstance(value, Piecewise) else None

    def _linear(self, name: str) -> Affine | None:
        value = self.value(name)
        if isinstance(value, Linear):
            return value.expr
        if isinstance(value, Piecewise) and not value.guards:
            number = value.inside.item()
            if not isinstance(number, bool) and float(number).is_integer():
                return Affine.constant(int(number))
        return None

    def _linear_op(self, node: Elementwise):
        """Integer arithmetic, casts and comparisons of Linear values."""
        args = [self._linear(o) for o in node.operands]
        if any(a is None for a in args):
            return None
        op, shape, dtype = node.op, node.type.shape, node.type.dtype
        if SCALAR_OPS[op].kind == "compare" and len(args) == 2:
            found = _compared(op, args[0] - args[1])
            return found and _piecewise(found.guards, found.inside, found.outside, shape)
        if op == "add":
            expr = args[0] + args[1]
        elif op == "subtract":
            expr = args[0] - args[1]
        elif op == "negative":
            expr = -args[0]
        elif op == "multiply" and (args[0].is_constant or args[1].is_constant):
            a, b = args if args[1].is_constant else args[::-1]
            expr = a * b.const
        elif op in ("floor_divide", "remainder") and not dtype.is_float and args[1].is_constant and args[1].const > 0:
            q = args[1].const
            expr = args[0].floordiv(q, shape) if op == "floor_divide" else args[0].mod(q, shape)
        elif op == "cast":
            expr = args[0]
        else:
            return None
        return Linear(expr) if _held_exactly(expr, shape, dtype) else None

    # -- rewrites ---------------------------------------------------------
    def as_guarded_scalar(self, node):
        """(a new Constant or None, the IndexMap of a scalar that computes `node`) for a computed
        node of Piecewise value; None for the rest (and for that form itself)."""
        value = self.values.get(node.name)
        if not isinstance(value, Piecewise) or not value.derived or isinstance(node, (Constant, Weight, Input)):
            return None
        if (isinstance(node, IndexMap) and not node.index and isinstance(self.graph.by_name.get(node.operand), Constant)
                and node.guards == value.guards):
            return None  # already the form
        dtype, guards, inside = node.type.dtype, value.guards, value.inside
        fill = value.outside.item() if guards else None
        key = _key(dtype, inside)
        constant = None
        if key not in self.constants:
            name = _free(f"{node.name}_inside", self.names)
            constant = Constant(name, TensorType((), dtype), inside.item(), node.origin)
            self.constants[key] = name
            self.types[name] = constant.type
        mapped = IndexMap(node.name, node.type, self.constants[key], (), guards, fill, node.origin)
        return constant, mapped

    def ungathered(self, node: IndexMap) -> IndexMap:
        """`node` with each gather by a Linear index tensor (values within the indexed axis)
        replaced by the tensor's affine expression."""
        exprs = (*node.index, *(g.expr for g in node.guards))
        if not _has_gathers(exprs):
            return node
        shape = node.type.shape
        new = [self._without_gathers(e, shape) for e in exprs]
        if all(a is b for a, b in zip(new, exprs)):
            return node
        k = len(node.index)
        guards = tuple(Guard(e, g.lo, g.hi) for e, g in zip(new[k:], node.guards))
        return IndexMap(node.name, node.type, node.operand, tuple(new[:k]), guards, node.fill, node.origin)

    def _without_gathers(self, expr: Affine, shape) -> Affine:
        if not _has_gathers((expr,)):
            return expr
        coeffs: dict = {}
        total = Affine.constant(expr.const)
        changed = False
        for atom, c in expr.terms:
            replaced = self._atom_value(atom, shape)
            if replaced is None:
                coeffs[atom] = coeffs.get(atom, 0) + c
            else:
                changed = True
                total = total + replaced * c
        if not changed:
            return expr
        return total + Affine._build(coeffs, 0)

    def _atom_value(self, atom, shape) -> Affine | None:
        """A gathered atom's affine value, or an atom holding one rebuilt; None when unchanged."""
        if isinstance(atom, (FloorDiv, Mod)):
            inner = self._without_gathers(atom.expr, shape)
            if inner is atom.expr:
                return None
            return inner.floordiv(atom.divisor, shape) if isinstance(atom, FloorDiv) else inner.mod(atom.divisor, shape)
        if not isinstance(atom, Gathered):
            return None
        index = tuple(self._without_gathers(e, shape) for e in atom.index)
        value = self.value(atom.buffer)
        if isinstance(value, Linear) and not _has_gathers(index):
            lo, hi = value.expr.bounds(atom.shape)
            if 0 <= lo and hi < atom.extent and (atom.ignore is None or not lo <= atom.ignore <= hi):
                return value.expr.substitute(index, shape)
        if all(a is b for a, b in zip(index, atom.index)):
            return None
        return Affine(((atom.moved(index), 1),), 0)


def _piecewise(guards, inside, outside, shape, derived: bool = True) -> Piecewise:
    """A Piecewise with the guards that always hold over `shape` left out; a constant where one
    never does."""
    if any(g.never(shape) for g in guards):
        return Piecewise((), outside, outside, derived)
    kept = []
    for g in guards:
        if not g.always(shape) and g not in kept:
            kept.append(g)
    return Piecewise(tuple(kept), inside, outside if kept else inside, derived)


def _negated(value: Piecewise) -> Piecewise | None:
    """The same values with the mask read the other way round: (not g, outside, inside)."""
    if len(value.guards) != 1:
        return None
    flipped = value.guards[0].negated()
    return None if flipped is None else Piecewise((flipped,), value.outside, value.inside, value.derived)


def _triangle_offset(is_inside: np.ndarray, lower: bool) -> int | None:
    """k where `is_inside` is column - row <= k (`lower`) or column - row >= k, else None: each
    row a prefix (suffix) whose length moves with the row as the diagonal does."""
    rows, cols = is_inside.shape
    counts = is_inside.sum(axis=1)
    row, column = np.arange(rows), np.arange(cols)
    edge = column[None, :] < counts[:, None] if lower else column[None, :] >= (cols - counts)[:, None]
    if not np.array_equal(is_inside, edge):
        return None
    partial = np.flatnonzero((counts > 0) & (counts < cols))
    full = np.flatnonzero(counts == cols)
    if partial.size:  # row i holds columns up to i + k (from i + k on)
        k = int(counts[partial[0]] - partial[0] - 1) if lower else int(cols - counts[partial[0]] - partial[0])
    elif full.size:  # whole rows only: the first (last) full one fixes k
        k = int(cols - 1 - full[0]) if lower else int(-full[-1])
    else:
        return None
    expected = np.clip(row + k + 1, 0, cols) if lower else np.clip(cols - row - k, 0, cols)
    return k if np.array_equal(counts, expected) else None


def _compared(op: str, diff: Affine) -> Piecewise | None:
    """The mask `a op b` of integers a, b with a - b = diff."""
    true, false = np.asarray(True), np.asarray(False)
    if op == "less":
        return Piecewise((Guard(diff, hi=0),), true, false)
    if op == "less_equal":
        return Piecewise((Guard(diff, hi=1),), true, false)
    if op == "greater":
        return Piecewise((Guard(-diff, hi=0),), true, false)
    if op == "greater_equal":
        return Piecewise((Guard(-diff, hi=1),), true, false)
    if op == "equal":
        return Piecewise((Guard(diff, lo=0, hi=1),), true, false)
    if op == "not_equal":
        return Piecewise((Guard(diff, lo=0, hi=1),), false, true)
    return None


def _held_exactly(expr: Affine, shape, dtype: DType) -> bool:
    """Whether every value of `expr` over `shape` is an integer `dtype` holds exactly."""
    if dtype is DType.BOOL or _has_gathers((expr,)):
        return False
    lo, hi = expr.bounds(shape)
    if dtype.is_float:
        return -_EXACT_FLOAT[dtype] <= lo and hi <= _EXACT_FLOAT[dtype]
    low, high = _INT_RANGE[dtype]
    return low <= lo and hi <= high


def _has_gathers(exprs) -> bool:
    return any(_gathers_in(atom) for e in exprs for atom, _ in e.terms)


def _gathers_in(atom) -> bool:
    if isinstance(atom, Gathered):
        return True
    if isinstance(atom, (FloorDiv, Mod)):
        return _has_gathers((atom.expr,))
    return False


def _scalar(value, dtype: DType) -> np.ndarray:
    return to_storage(np.asarray(value), dtype)


def _same(a: np.ndarray, b: np.ndarray) -> bool:
    return a.dtype == b.dtype and a.tobytes() == b.tobytes()


def _key(dtype: DType, value: np.ndarray) -> tuple:
    return dtype, value.dtype.str, value.tobytes()


def _free(stem: str, names: set[str]) -> str:
    name, k = stem, 1
    while name in names:
        name, k = f"{stem}_{k}", k + 1
    names.add(name)
    return name
