"""The reference semantics of Tensor IR, in numpy.

Every later stage is checked against this. Values are numpy arrays in each
dtype's storage type (bf16 as float32 rounded to bf16). Elementwise ops on
half types compute in float32 and round once per op, as PyTorch does; sums
accumulate in float64 before rounding to the node's type, so the reference
is at least as accurate as any kernel it judges.

Two evaluation shortcuts keep large workloads affordable, and both are exact
restatements of the plain rules: index maps that only permute, broadcast,
offset or stride become numpy views, and the sum of a product whose product
has no other use is an einsum over those views.
"""

from __future__ import annotations

from typing import Mapping

import numpy as np

from emmy.dtypes import DType, to_storage
from emmy.tensor_ir.nodes import Constant, Elementwise, IndexMap, Input, Reduce, TensorGraph, Weight
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
    deferred: set[str] = set()
    uses = graph.use_counts
    for node in graph.nodes:
        if isinstance(node, Input):
            values[node.name] = _leaf(node, inputs)
        elif isinstance(node, Weight):
            values[node.name] = _leaf(node, weights)
        elif isinstance(node, Constant):
            values[node.name] = np.asarray(node.value, dtype=node.type.dtype.numpy)
        elif isinstance(node, Elementwise):
            if use_shortcuts and node.op == "multiply" and _feeds_only_a_sum(graph, node.name, uses):
                deferred.add(node.name)  # computed inside the consuming sum
                continue
            values[node.name] = _elementwise(node, [values[o] for o in node.operands])
        elif isinstance(node, Reduce):
            if node.operand in deferred:
                product = graph[node.operand]
                a, b = (values[o] for o in product.operands)
                values[node.name] = _sum_of_product(a, b, node.axis, node.type.dtype)
            else:
                values[node.name] = _reduce(node, values[node.operand])
        elif isinstance(node, IndexMap):
            values[node.name] = index_map(node, values[node.operand], use_views=use_shortcuts, tables=values)
        else:  # pragma: no cover - the node kinds are closed
            raise TypeError(f"unknown node {node!r}")
    return [np.array(values[o]) for o in graph.outputs]


def _leaf(node, table) -> np.ndarray:
    if node.name not in table:
        raise KeyError(f"no value given for {type(node).__name__.lower()} {node.name}")
    value = np.asarray(table[node.name])
    if value.shape != node.type.shape:
        raise ValueError(f"{node.name}: expected shape {node.type.shape}, got {value.shape}")
    return to_storage(value, node.type.dtype)


def _feeds_only_a_sum(graph: TensorGraph, name: str, uses: dict[str, int]) -> bool:
    if uses[name] != 1 or name in graph.outputs:
        return False
    node = graph[name]
    if any(isinstance(graph[o], Constant) for o in node.operands):
        return False
    for consumer in graph.nodes:
        if isinstance(consumer, Reduce) and consumer.operand == name:
            return consumer.op == "sum" and node.type.dtype.is_float
    return False


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
    if use_views and not node.guards:
        view = _as_view(node, x)
        if view is not None:
            return view
    coords = np.indices(shape, sparse=True) if shape else ()
    index = []
    valid = np.ones(shape, dtype=bool)
    for guard in node.guards:
        valid = valid & guard.holds(coords, tables)
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


def _as_view(node: IndexMap, x: np.ndarray) -> np.ndarray | None:
    """A strided view when every index is a constant or `step*d_i + offset` on distinct d_i."""
    shape = node.type.shape
    picks: list[object] = []
    out_axes: list[int] = []
    for expr in node.index:
        if expr.is_constant:
            picks.append(expr.const)
            continue
        if len(expr.terms) != 1:
            return None
        atom, step = expr.terms[0]
        dim = getattr(atom, "index", None)
        if type(atom).__name__ != "Dim" or step <= 0 or dim in out_axes:
            return None
        start = expr.const
        picks.append(slice(start, start + step * (shape[dim] - 1) + 1, step))
        out_axes.append(dim)
    view = x[tuple(picks)] if picks else x
    order = sorted(range(len(out_axes)), key=lambda k: out_axes[k])
    view = np.transpose(view, order)
    present = sorted(out_axes)
    expanded = view.reshape([shape[d] if d in present else 1 for d in range(len(shape))])
    return np.broadcast_to(expanded, shape)
