"""The reference semantics of Tensor IR, in numpy.

Every later stage is checked against this. Values are numpy arrays in each
dtype's storage type (bf16 as float32 rounded to bf16). Elementwise ops on
half types compute in float32 and round once per op, as PyTorch does; sums
accumulate in float64 before rounding to the node's type, so the reference
is at least as accurate as any kernel it judges.

Two evaluation shortcuts keep large workloads affordable, and both restate the
plain rules: an index map affine in the coordinates (a permute, broadcast,
slice, flip, diagonal or convolution window) is a strided numpy view, of its
operand padded with the fill where guards bound it; and a product whose one use
is a sum (through index maps that merge its axes, its half factors unwidened)
is an einsum of its factors, never materialized.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

import numpy as np

from emmy.dtypes import DType, to_storage
from emmy.tensor_ir.nodes import Constant, Elementwise, IndexMap, Input, Reduce, TensorGraph, Weight, operands_of
from emmy.tensor_ir.scalar_ops import SCALAR_OPS


MATERIALIZED_LIMIT = 2 ** 26  # elements of one value the interpreter holds (float64: 512 MB)


def too_big_to_interpret(graph: TensorGraph) -> bool:
    """Whether evaluating `graph` would materialize a value over MATERIALIZED_LIMIT elements that no
    shortcut avoids: a guarded index map (a padded convolution window at full size; strided views
    take no guards). Callers then check the same program at a small shape."""
    return any(isinstance(n, IndexMap) and n.guards and n.type.numel > MATERIALIZED_LIMIT for n in graph.nodes)


def evaluate(graph: TensorGraph, inputs: Mapping[str, np.ndarray], weights: Mapping[str, np.ndarray] | None = None,
             *, use_shortcuts: bool = True) -> list[np.ndarray]:
    """Evaluate `graph`; returns one array per output, in order."""
    weights = weights or {}
    values: dict[str, np.ndarray] = {}
    factors: dict[str, tuple[np.ndarray, np.ndarray]] = {}  # a product a sum takes later: its two factors
    deferred = _deferred_products(graph) if use_shortcuts else _Deferred(set(), set(), set())
    for node in graph.nodes:
        if isinstance(node, Input):
            values[node.name] = _leaf(node, inputs)
        elif isinstance(node, Weight):
            values[node.name] = _leaf(node, weights)
        elif isinstance(node, Constant):
            values[node.name] = np.asarray(node.value, dtype=node.type.dtype.numpy)
        elif node.name in deferred.widenings:  # exact, and the sum computes in float64 anyway
            values[node.name] = values[node.operands[0]]
        elif node.name in deferred.products:
            shape = node.type.shape
            factors[node.name] = tuple(np.broadcast_to(values[o], shape) for o in node.operands)
        elif isinstance(node, Elementwise):
            values[node.name] = _elementwise(node, [values[o] for o in node.operands])
        elif isinstance(node, Reduce):
            if node.operand in factors:
                a, b = factors.pop(node.operand)
                values[node.name] = _sum_of_product(a, b, node.axis, node.type.dtype)
            else:
                values[node.name] = _reduce(node, values[node.operand])
        elif isinstance(node, IndexMap) and node.name in deferred.moved:
            # an index map of a product is the product of the maps of its factors (no guard, no fill)
            factors[node.name] = tuple(index_map(node, f, tables=values) for f in factors.pop(node.operand))
        elif isinstance(node, IndexMap):
            values[node.name] = index_map(node, values[node.operand], use_views=use_shortcuts, tables=values)
        else:  # pragma: no cover - the node kinds are closed
            raise TypeError(f"unknown node {node!r}")
    return [np.array(values[o]) for o in graph.outputs]


@dataclass(frozen=True)
class _Deferred:
    """Products a sum computes as an einsum of their factors, never materialized: the multiplies,
    the unguarded index maps carrying them to the sum (a merge of window axes), and the half-to-f32
    widenings of their factors (kept in half: the einsum reads them exactly)."""
    products: set[str]
    moved: set[str]
    widenings: set[str]


def _deferred_products(graph: TensorGraph) -> _Deferred:
    uses = graph.use_counts
    consumer: dict[str, object] = {}
    for node in graph.nodes:
        for operand in operands_of(node):
            consumer[operand] = node

    def only_use(name: str):
        return consumer.get(name) if uses[name] == 1 and name not in graph.outputs else None

    products, moved, widenings = set(), set(), set()
    for node in graph.nodes:
        if not (isinstance(node, Elementwise) and node.op == "multiply" and node.type.dtype.is_float):
            continue
        if any(isinstance(graph[o], Constant) for o in node.operands):
            continue
        path, carried, user = [], node.name, only_use(node.name)
        while isinstance(user, IndexMap) and not user.guards and user.operand == carried:
            path.append(user.name)
            carried, user = user.name, only_use(user.name)
        if not (isinstance(user, Reduce) and user.op == "sum"):
            continue
        products.add(node.name)
        moved.update(path)
        for operand in node.operands:
            source = graph[operand]
            if isinstance(source, Elementwise) and source.op == "cast" and only_use(operand) is node \
                    and node.type.dtype is DType.F32 and graph[source.operands[0]].type.dtype.is_half:
                widenings.add(operand)
    return _Deferred(products, moved, widenings)


def _leaf(node, table) -> np.ndarray:
    if node.name not in table:
        raise KeyError(f"no value given for {type(node).__name__.lower()} {node.name}")
    value = np.asarray(table[node.name])
    if value.shape != node.type.shape:
        raise ValueError(f"{node.name}: expected shape {node.type.shape}, got {value.shape}")
    return to_storage(value, node.type.dtype)


def _compute(value: np.ndarray, dtype: DType) -> np.ndarray:
    """Half-precision values widen to float32 for arithmetic."""
    if dtype.is_half:
        return np.asarray(value, dtype=np.float32)
    return value


def _elementwise(node: Elementwise, args: list[np.ndarray]) -> np.ndarray:
    return np.broadcast_to(apply_scalar(node.op, node.type.dtype, args), node.type.shape)


def apply_scalar(op_name: str, out: DType, args: list[np.ndarray]) -> np.ndarray:
    """One scalar op on (broadcastable) arrays, computed and rounded as the reference does."""
    op = SCALAR_OPS[op_name]
    if op.kind == "cast":
        (x,) = args
        if out is DType.BOOL:
            return np.asarray(x != 0)
        if out.is_float:  # one rounding, from the source straight to the type (int64 -> f64 exact to 2^53)
            return to_storage(np.asarray(x, dtype=np.float64 if out is DType.F64 else np.float32), out)
        return _float_to_int(x, out)
    if op.kind == "arith":
        args = [_compute(a, out) for a in args]
    elif op.kind == "compare":
        args = [np.asarray(a, dtype=np.float32) if a.dtype == np.float16 else a for a in args]
    with np.errstate(all="ignore"):  # inf - inf and friends are meant: they give NaN as on a GPU
        return to_storage(op.apply(*args), out)


def _float_to_int(x: np.ndarray, dtype: DType) -> np.ndarray:
    if np.issubdtype(x.dtype, np.floating):
        x = np.trunc(x)  # C-style conversion, as torch casts
    with np.errstate(invalid="ignore"):  # NaN and out-of-range values have no integer: as in torch, no warning
        return x.astype(dtype.numpy)


def _reduce(node: Reduce, x: np.ndarray) -> np.ndarray:
    return reduce_axis(node.op, x, node.axis, node.type.dtype)


def reduce_axis(op: str, x: np.ndarray, axis: int, dtype: DType) -> np.ndarray:
    """A monoid over one axis, kept with extent 1; sums and products accumulate in 64 bits."""
    with np.errstate(all="ignore"):  # NaN and inf propagate as they would on the GPU
        return _reduce_axis(op, x, axis, dtype)


def _reduce_axis(op: str, x: np.ndarray, axis: int, dtype: DType) -> np.ndarray:
    if op == "sum":
        acc = np.float64 if dtype.is_float else np.int64
        result = np.sum(x, axis=axis, keepdims=True, dtype=acc)
    elif op == "prod":
        acc = np.float64 if dtype.is_float else np.int64
        result = np.prod(x, axis=axis, keepdims=True, dtype=acc)
    elif op == "max":
        result = np.max(x, axis=axis, keepdims=True)
    else:
        result = np.min(x, axis=axis, keepdims=True)
    return to_storage(result, dtype)


def _sum_of_product(a: np.ndarray, b: np.ndarray, axis: int, dtype: DType) -> np.ndarray:
    letters = "abcdefghijklmnopqrstuvwxyz"[: a.ndim]
    out = letters[:axis] + letters[axis + 1 :]
    result = np.einsum(f"{letters},{letters}->{out}", a, b, dtype=np.float64, casting="safe")
    return to_storage(np.expand_dims(result, axis), dtype)


def index_map(node: IndexMap, x: np.ndarray, *, use_views: bool = True, tables: dict | None = None) -> np.ndarray:
    shape = node.type.shape
    if use_views:
        view = _strided_view(node, x, tables)
        if view is not None:
            return view
    coords = np.indices(shape, sparse=True) if shape else ()
    index = []
    valid = _guards_hold(node, coords, tables)
    for expr in node.index:
        position = np.broadcast_to(np.asarray(expr.evaluate(coords, tables), dtype=np.int64), shape)
        if node.guards:
            # Out-of-range coordinates read element 0 and are replaced by the fill below.
            position = np.where(valid, position, 0)
        index.append(position)
    gathered = x[tuple(index)] if index else np.broadcast_to(x, shape)
    if node.guards:
        gathered = np.where(valid, gathered, np.asarray(node.fill, dtype=x.dtype))
    return np.array(gathered, order="C")


def _guards_hold(node: IndexMap, coords, tables) -> np.ndarray:
    valid = np.ones(node.type.shape, dtype=bool)
    for guard in node.guards:
        valid = valid & guard.holds(coords, tables)
    return valid


_PADDING_LIMIT = 4  # a guarded map is read from its operand padded with the fill up to this many times its size


def _strided_view(node: IndexMap, x: np.ndarray, tables) -> np.ndarray | None:
    """The map as a strided view of `x`, when every index is affine in the coordinates alone
    (`step*d_i + ...`, no division, remainder or table): element d of the result is at byte offset
    sum_k d_k * (sum over operand axes of the axis's stride times d_k's step) from the element the
    zero coordinate reads, so one set of strides says every read, repeats and overlaps included
    (a window, a diagonal, a broadcast). A guarded map (a padded window) reads `x` padded with its
    fill wide enough that every position it names exists, then keeps the fill where a guard fails.
    None where the map is not affine, reads outside `x` unguarded, or would pad too much."""
    shape = node.type.shape
    if any(type(atom).__name__ != "Dim" for expr in node.index for atom, _ in expr.terms):
        return None
    if 0 in shape:
        return np.empty(shape, dtype=x.dtype)
    bounds = [expr.bounds(shape) for expr in node.index]
    before = [max(0, -lo) for lo, _ in bounds]
    after = [max(0, hi - (size - 1)) for (_, hi), size in zip(bounds, x.shape)]
    if any(before) or any(after):
        padded_size = int(np.prod([s + b + a for s, b, a in zip(x.shape, before, after)]))
        if not node.guards or padded_size > _PADDING_LIMIT * max(x.size, 1) + 1024:
            return None
        x = np.pad(x, list(zip(before, after)), constant_values=np.asarray(node.fill, dtype=x.dtype))
    origin = x[tuple(slice(expr.const + b, expr.const + b + 1) for expr, b in zip(node.index, before))] \
        if node.index else x[...]
    strides = [0] * len(shape)
    for expr, stride in zip(node.index, x.strides):
        for atom, step in expr.terms:
            strides[atom.index] += step * stride
    view = np.lib.stride_tricks.as_strided(origin, shape=shape, strides=strides, writeable=False)
    if node.guards:
        coords = np.indices(shape, sparse=True) if shape else ()
        return np.where(_guards_hold(node, coords, tables), view, np.asarray(node.fill, dtype=x.dtype))
    return view
