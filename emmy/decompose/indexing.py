"""Reads by index tensors: embedding, index_select, gather and advanced indexing (`x[ids]`).

Each is one IndexMap whose index on the gathered axis is a Gathered atom: the value of the index
tensor at an affine position. The atom names the tensor that holds the values, followed back
through views, slices and integer casts: a program input or weight (token ids, targets), a constant
(positions made by arange), or a value the program computes (an argmax, a clamp of ids, a floor of
coordinates), which extraction then keeps in memory for the kernels that index by it
(`TensorGraph.index_tensors`).
"""

from __future__ import annotations

import operator

from emmy.affine import Affine, Gathered, Guard, gathered_buffers
from emmy.decompose.registry import Context, lowers, scalars_as_vectors
from emmy.dtypes import DType
from emmy.errors import UnsupportedOpError
from emmy.tensor_ir.nodes import Constant, Elementwise, IndexMap, Input, Weight


def gathered_index(ctx: Context, indices: str, at: list[Affine], extent: int, out_shape, what: str,
              wrap: bool = False) -> Affine:
    """The Gathered atom reading `indices` at `at` (over the output's coordinates), followed back
    through views, slices and integer casts of it to the input or weight that holds the values."""
    b = ctx.b
    name, at = indices, list(at)
    ignore = fallback = None
    while True:
        node = b.by_name.get(name)
        skipped = _ignoring(b, node) if ignore is None else None
        if skipped is not None:
            name, ignore, fallback = skipped
        elif isinstance(node, IndexMap) and not node.guards and not gathered_buffers(node.index):
            at = [e.substitute(at, out_shape) for e in node.index]
            name = node.operand
        elif isinstance(node, Elementwise) and node.op == "cast" and not node.type.dtype.is_float \
                and not b.type(node.operands[0]).dtype.is_float and b.type(node.operands[0]).dtype is not DType.BOOL:
            name = node.operands[0]  # an integer widening or narrowing of ids: the values are the same
        else:
            constant = ctx.folded(name) if not isinstance(node, (Input, Weight)) else None
            if constant is None:
                break
            name = constant  # computed from constants alone: gathered by as a constant of the program
    if node.type.dtype.is_float or node.type.dtype is DType.BOOL:
        raise UnsupportedOpError(f"unsupported op {ctx.where}: {what} of dtype {node.type.dtype}; "
                                 "index tensors are integers (a bool mask selects a data-dependent count)")
    atom = Gathered(name, tuple(at), node.type.shape, int(extent), wrap,
                    None if ignore is None else int(ignore), 0 if fallback is None else int(fallback))
    return Affine(((atom, 1),), 0)


def _constant(b, name: str):
    """The value of a rank-0 constant, seen through broadcasts; else None."""
    node = b.by_name.get(name)
    while isinstance(node, IndexMap) and not node.guards:
        node = b.by_name.get(node.operand)
    return node.value if isinstance(node, Constant) else None


def _ignoring(b, node):
    """`where(t != k, t, f)` (or `where(t == k, f, t)`): (t, k, f), an index that reads as f where it
    equals k (cross entropy's ignore_index); else None."""
    if not (isinstance(node, Elementwise) and node.op == "where"):
        return None
    cond, a, other = node.operands
    test = b.by_name.get(cond)
    if not isinstance(test, Elementwise) or test.op not in ("not_equal", "equal"):
        return None
    kept, fallback = (a, other) if test.op == "not_equal" else (other, a)
    key = test.operands[1] if test.operands[0] == kept else test.operands[0] if test.operands[1] == kept else None
    ignore, value = (_constant(b, key) if key else None), _constant(b, fallback)
    return None if ignore is None or value is None else (kept, ignore, value)


@lowers("aten.embedding.default")
def embedding(ctx: Context, weight, indices, padding_idx=-1, scale_grad_by_freq=False, sparse=False):
    """out[i..., d] = weight[ids[i...], d]."""
    ids_shape = ctx.b.shape(indices)
    rows, width = ctx.b.shape(weight)
    k = len(ids_shape)
    out = (*ids_shape, width)
    index = [gathered_index(ctx, indices, [Affine.dim(i) for i in range(k)], rows, out, "embedding ids"), Affine.dim(k)]
    return ctx.b.index_map(weight, out, index, name=ctx.name)


@lowers("aten.index_select.default")
@scalars_as_vectors
def index_select(ctx: Context, x, dim, indices):
    """out[.., j, ..] = x[.., ids[j], ..] along `dim`."""
    ids_shape = ctx.b.shape(indices)
    (count,) = ids_shape or (1,)
    shape = ctx.b.shape(x)
    dim %= max(len(shape), 1)
    out = (*shape[:dim], count, *shape[dim + 1:])
    picked = gathered_index(ctx, indices, [Affine.dim(dim)] if ids_shape else [], shape[dim], out, "index_select indices")
    index = [picked if k == dim else Affine.dim(k) for k in range(len(shape))]
    return ctx.b.index_map(x, out, index, name=ctx.name)


@lowers("aten.gather.default")
@scalars_as_vectors
def gather(ctx: Context, x, dim, indices, sparse_grad=False):
    """out[i] = x[i with axis `dim` replaced by ids[i]]; out has the shape of ids."""
    ids_shape = ctx.b.shape(indices)
    shape = ctx.b.shape(x)
    dim %= max(len(shape), 1)
    at = [Affine.dim(k) for k in range(len(ids_shape))]
    picked = gathered_index(ctx, indices, at, shape[dim], ids_shape, "gather indices")
    index = [picked if k == dim else Affine.dim(k) for k in range(len(shape))]
    return ctx.b.index_map(x, ids_shape, index, name=ctx.name)


@lowers("aten.index.Tensor")
def index(ctx: Context, x, indices):
    """x[..., ids, ...] (advanced indexing): the index tensors broadcast together to one shape, whose
    axes take the indexed axes' place when those are adjacent, else lead the result (NumPy's and
    torch's rule); axes not indexed are sliced whole; negative ids count from the end."""
    import numpy as np

    given = [(k, t) for k, t in enumerate(indices) if t is not None]
    if not given:
        return ctx.tensor(x)
    shape = ctx.b.shape(x)
    axes = [k for k, _ in given]
    try:
        common = tuple(np.broadcast_shapes(*(ctx.b.shape(t) for _, t in given)))
    except ValueError as err:
        raise UnsupportedOpError(f"unsupported op {ctx.where}: index tensors of shapes "
                                 f"{[ctx.b.shape(t) for _, t in given]} do not broadcast together") from err
    rest = [k for k in range(len(shape)) if k not in axes]
    if axes == list(range(axes[0], axes[-1] + 1)):  # adjacent: the ids' axes sit where the indexed ones were
        first = axes[0]
        out = (*shape[:first], *common, *shape[axes[-1] + 1:])
        place = {k: (k if k < first else k - len(axes) + len(common)) for k in rest}
    else:
        first = 0
        out = (*common, *(shape[k] for k in rest))
        place = {k: len(common) + n for n, k in enumerate(rest)}
    picked = {}
    for k, ids in given:
        ids_shape = ctx.b.shape(ids)
        lead = first + len(common) - len(ids_shape)  # an index tensor aligns with the common shape's end
        at = [Affine.dim(lead + j) if n != 1 else Affine.constant(0) for j, n in enumerate(ids_shape)]
        picked[k] = gathered_index(ctx, ids, at, shape[k], out, "indices", wrap=True)
    index = [picked[k] if k in picked else Affine.dim(place[k]) for k in range(len(shape))]
    return ctx.b.index_map(x, out, index, name=ctx.name)


@lowers("aten._embedding_bag_forward_only.default", "aten._embedding_bag.default")
def embedding_bag(ctx: Context, weight, indices, offsets, scale_grad_by_freq=False, mode=0, sparse=False,
                  per_sample_weights=None, include_last_offset=False, padding_idx=-1):
    """out[b] = the sum, mean or max of weight[ids[n]] over bag b's entries n, offsets[b] <= n <
    offsets[b + 1] (the last bag to the end): a (bags x entries) mask read from the offsets, so
    bags may be any size (a 2-D input's are equal; its offsets are an arange). Empty bags give 0,
    as torch's do; entries equal to padding_idx are left out. Only the result is computed: a graph
    reading the bag bookkeeping torch also returns is refused."""
    import numpy as np

    b = ctx.b
    readers = list(ctx.node.users)
    if any(user.target is not operator.getitem or user.args[1] != 0 for user in readers):
        raise UnsupportedOpError(f"unsupported op {ctx.where}: the program reads embedding_bag's bag bookkeeping "
                                 "(offset2bag, bag sizes, max indices); emmy computes its result only")
    out = ctx.out_type(0)
    (count,) = b.shape(indices)
    rows_count, width = b.shape(weight)
    bags = b.shape(offsets)[0] - (1 if include_last_offset else 0)
    acc = out.dtype.accumulator
    n = Affine.dim(1)
    rows = b.index_map(weight, (count, width), [gathered_index(ctx, indices, [Affine.dim(0)], rows_count, (count, width),
                                                          "embedding_bag ids"), Affine.dim(1)], suffix="rows")
    rows = ctx.tensor(rows, acc)
    if per_sample_weights is not None:
        scale = b.index_map(ctx.tensor(per_sample_weights, acc), (count, width), [Affine.dim(0)], suffix="scale")
        rows = b.elementwise("multiply", rows, scale, suffix="weighted")
    edges = ctx.tensor(offsets, DType.I64)
    start = b.index_map(edges, (bags, count), [Affine.dim(0)], suffix="starts")
    after = Affine.dim(0) + 1
    end = b.index_map(edges, (bags, count), [after], guards=[Guard(after, None, b.shape(offsets)[0])], fill=count,
                      suffix="ends")
    position = b.index_map(ctx.constant(np.arange(count), DType.I64), (bags, count), [n], suffix="entries")
    inside = b.elementwise("logical_and", b.elementwise("greater_equal", position, start, dtype=DType.BOOL),
                           b.elementwise("less", position, end, dtype=DType.BOOL), dtype=DType.BOOL, suffix="in_bag")
    if padding_idx is not None and padding_idx >= 0:
        ids = b.index_map(ctx.tensor(indices, DType.I64), (bags, count), [n], suffix="ids")
        kept = b.elementwise("not_equal", ids, int(padding_idx), dtype=DType.BOOL, suffix="kept")
        inside = b.elementwise("logical_and", inside, kept, dtype=DType.BOOL, suffix="counted")
    full = (bags, count, width)
    mask = b.index_map(inside, full, [Affine.dim(0), Affine.dim(1)], suffix="mask")
    values = b.index_map(rows, full, [Affine.dim(1), Affine.dim(2)], suffix="values")
    sizes = b.reduce_axes("sum", b.cast(inside, acc), [1], True)  # (bags, 1)
    if mode == 2:
        folded = b.reduce_axes("max", b.elementwise("where", mask, values, float("-inf"), dtype=acc), [1], False)
        empty = b.elementwise("equal", ctx.tensor(sizes, acc, (bags, width)), 0.0, dtype=DType.BOOL, suffix="empty")
        result = b.elementwise("where", empty, 0.0, folded, dtype=acc, suffix="max")
    else:
        result = b.reduce_axes("sum", b.elementwise("where", mask, values, 0.0, dtype=acc), [1], False)
        if mode == 1:
            divisor = b.elementwise("maximum", ctx.tensor(sizes, acc, (bags, width)), 1.0, suffix="bag_size")
            result = b.elementwise("divide", result, divisor, suffix="mean")
    first = b.cast(result, out.dtype)
    return (first, None, None, None)
