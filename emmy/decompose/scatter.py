"""Writes into part of a tensor, as functionalized graphs spell them: `y[:, 2:8] = x` is a
slice_scatter of a copy (`y[:, 0] = 1` torch itself spells as a where), `y[mask] = 0` an index_put
by a bool mask, a KV cache's `index_copy_` an index_put by ids, a one-hot a scatter. Each is read
back as a gather: every output element is the written value where its coordinates were written (a
guard on the position, the mask, or the ids that hit it), else the old one.
"""

from __future__ import annotations

import math

from emmy.affine import Affine, Guard
from emmy.decompose.indexing import gathered_index
from emmy.decompose.reductions import fold_identity, running
from emmy.decompose.registry import Context, lowers, scalars_as_vectors
from emmy.dtypes import DType
from emmy.errors import UnsupportedOpError


@lowers("aten.copy.default")
def copy(ctx: Context, dst, src, non_blocking=False):
    """dst's shape and dtype, src's values (broadcast)."""
    out = ctx.out_type()
    return ctx.tensor(src, out.dtype, out.shape)


@lowers("aten.slice_scatter.default")
def slice_scatter(ctx: Context, x, src, dim=0, start=None, end=None, step=1):
    """x with x[.., start:end:step, ..] = src."""
    shape = ctx.b.shape(x)
    dim %= len(shape)
    index, written = slice_written(shape, dim, start, end, step, ctx.b.shape(src)[dim])
    return _written_over(ctx, x, src, index, written)


def slice_written(shape, dim: int, start, end, step, count: int) -> tuple[list, list[Guard]]:
    """Where x[.., start:end:step, ..] = src writes in a tensor of `shape` (a slice of `count` along
    `dim`): (src's index per output coordinate, the guards that hold on the written ones)."""
    start, end, step = slice(start, end, step).indices(shape[dim])
    d = Affine.dim(dim)
    written = [Guard(d, start, start + (count - 1) * step + 1)]
    if step > 1:
        written.append(Guard((d - start).mod(step, shape), None, 1))
    return [Affine.dim(k) if k != dim else (d - start).floordiv(step, shape) for k in range(len(shape))], written


@lowers("aten.diagonal_scatter.default")
def diagonal_scatter(ctx: Context, x, src, offset=0, dim1=0, dim2=1):
    """x with its diagonal of (dim1, dim2), `offset` above the main one, set to src (whose last axis
    runs along the diagonal): `A.diagonal().add_(eps)` as functionalized graphs spell it."""
    shape = ctx.out_type().shape
    rank = len(shape)
    dim1, dim2 = dim1 % rank, dim2 % rank
    others = [d for d in range(rank) if d not in (dim1, dim2)]
    along = Affine.dim(dim1) - max(-offset, 0)  # the position along the diagonal
    index = [Affine.dim(d) for d in others] + [along]
    on_diagonal = [Guard(Affine.dim(dim2) - Affine.dim(dim1), offset, offset + 1)]
    return _written_over(ctx, x, src, index, on_diagonal)


def _written_over(ctx: Context, x, src, index, written: list[Guard]) -> str:
    """x where the guards fail, src read at `index` where they hold."""
    b = ctx.b
    out = ctx.out_type()
    value = b.index_map(ctx.tensor(src, out.dtype), out.shape, index, written, 0, suffix="written")
    mask = b.index_map(b.const(True, DType.BOOL), out.shape, (), guards=written, fill=False, suffix="where_written")
    return b.elementwise("where", mask, value, ctx.tensor(x, out.dtype), dtype=out.dtype, name=ctx.name)


@lowers("aten.index_put.default")
def index_put(ctx: Context, x, indices, values, accumulate=False):
    """x[mask] = value for a bool mask over x's leading dimensions, or x[.., ids, ..] = values by
    integer tensors of ids in one or more dimensions (index_copy_, a KV cache written at positions,
    the gradient of an embedding or of x[i, j]): where ids repeat, the last write wins (as torch does
    on the CPU), or all add up with accumulate."""
    b = ctx.b
    given = [(k, t) for k, t in enumerate(indices) if t is not None]
    masks = [k for k, t in given if b.dtype(t) is DType.BOOL]
    if masks:
        if len(given) != 1:
            raise UnsupportedOpError(f"unsupported op {ctx.where}: a bool mask with other index tensors "
                                     "(emmy writes x[mask] = v with the mask alone)")
        (dim, mask), = given
        return _masked_put(ctx, x, dim, mask, values, accumulate)
    return _put_by_ids(ctx, x, given, values, accumulate)


def _put_by_ids(ctx: Context, x, given: list, values, accumulate: bool) -> str:
    """x[.., i, j, ..] = values by integer ids in the dimensions `given` names, as torch indexes: the
    ids broadcast to one index shape, which stands in place of adjacent indexed dimensions and
    first where they are apart. Written as one axis: x viewed with its indexed dimensions moved
    together and merged, each id checked against its own extent, the ids combined row-major."""
    b = ctx.b
    out = ctx.out_type()
    shape, rank = out.shape, len(out.shape)
    dims = [k for k, _ in given]
    adjacent = dims == list(range(dims[0], dims[-1] + 1))
    order = list(range(rank)) if adjacent else dims + [d for d in range(rank) if d not in dims]
    start = dims[0] if adjacent else 0
    moved_shape = tuple(shape[d] for d in order)
    block = moved_shape[start:start + len(dims)]
    lead, trail = moved_shape[:start], moved_shape[start + len(dims):]
    index_shape = _broadcast_shape([b.shape(t) for _, t in given], ctx.where)
    count = max(math.prod(index_shape), 1)
    merged = (*lead, math.prod(block), *trail)
    full = (*merged, count)
    k = Affine.dim(len(merged))
    linear, stride = None, 1
    for extent, (_, ids) in reversed(list(zip(block, given))):
        flat = b.reshape(ctx.tensor(ids, DType.I64, index_shape), (count,), suffix="flat_ids")
        wrapped = b.elementwise("remainder", _checked(ctx, flat, [k], extent, full, wrap=True), extent,
                                dtype=DType.I64, suffix="wrapped")  # -1: the last
        term = wrapped if stride == 1 else b.elementwise("multiply", wrapped, stride, dtype=DType.I64, suffix="strided")
        linear = term if linear is None else b.elementwise("add", linear, term, dtype=DType.I64, suffix="linear_ids")
        stride *= extent
    written = b.reshape(ctx.tensor(values, out.dtype, (*lead, *index_shape, *trail)), (*lead, count, *trail))
    at = [Affine.dim(a) for a in range(len(lead))] + [k] + [Affine.dim(a) for a in range(len(lead) + 1, len(merged))]
    values_full = b.index_map(written, full, at, suffix="values")
    moved = b.reshape(b.permute(ctx.tensor(x, out.dtype), order), merged)
    if merged == shape:  # one 1-D tensor of ids: the write is x's own
        return _scattered(ctx, moved, start, linear, values_full, accumulate)
    result = b.reshape(_scattered(ctx, moved, start, linear, values_full, accumulate, shape=merged), moved_shape)
    return b.permute(result, [order.index(d) for d in range(rank)], name=ctx.name)


def _broadcast_shape(shapes: list, where: str) -> tuple[int, ...]:
    rank = max(len(s) for s in shapes)
    padded = [(1,) * (rank - len(s)) + tuple(s) for s in shapes]
    result = []
    for extents in zip(*padded):
        wide = {e for e in extents if e != 1}
        if len(wide) > 1:
            raise UnsupportedOpError(f"unsupported op {where}: index tensors of shapes "
                                     f"{[list(s) for s in shapes]} do not broadcast together")
        result.append(wide.pop() if wide else 1)
    return tuple(result)


def _masked_put(ctx: Context, x, dim: int, mask, values, accumulate: bool) -> str:
    """x[.., mask, ..] = values, the mask over x's dimensions from `dim` on: values the same for
    every hit (one value, a row) are a where; values with one entry per hit along the mask's axis
    (as many as the mask holds) go to the hits in order, the order x[.., mask, ..] reads them."""
    b = ctx.b
    out = ctx.out_type()
    mask_shape = b.shape(mask)
    after = len(out.shape) - dim - len(mask_shape)
    padded = b.reshape(mask, (*([1] * dim), *mask_shape, *([1] * after)), suffix="mask")
    where = ctx.tensor(padded, DType.BOOL, out.shape)
    old = ctx.tensor(x, out.dtype)
    lead, per_hit = out.shape[:dim], out.shape[len(out.shape) - after:] if after else ()
    value_shape = b.shape(values)
    if _broadcasts(value_shape, (*lead, 1, *per_hit)):  # the same for every hit: a where
        padded = (1,) * (len(lead) + 1 + len(per_hit) - len(value_shape)) + value_shape
        aligned = (*padded[:dim], *([1] * len(mask_shape)), *padded[dim + 1:])
        value = ctx.tensor(b.reshape(values, aligned), out.dtype, out.shape)
        if accumulate:
            value = b.elementwise("add", old, value, suffix="accumulated")
        return b.elementwise("where", where, value, old, dtype=out.dtype, name=ctx.name)
    if len(value_shape) != len(lead) + 1 + len(per_hit) or \
            not _broadcasts(value_shape, (*lead, value_shape[dim], *per_hit)):
        raise UnsupportedOpError(f"unsupported op {ctx.where}: x[mask] = values of shape {list(value_shape)} "
                                 f"(emmy writes values that are the same for every hit, or that have one entry "
                                 f"per hit along the mask's axis)")
    selected = ctx.tensor(values, out.dtype, (*lead, value_shape[dim], *per_hit))  # in the hits' order
    return _in_mask_order(ctx, x, where, selected, accumulate)


def _broadcasts(shape, onto) -> bool:
    """Whether a tensor of `shape` broadcasts to `onto` (no more axes, each 1 or equal)."""
    return len(shape) <= len(onto) and all(s in (1, t) for s, t in zip(reversed(shape), reversed(onto)))


@lowers("aten.scatter.value", "aten.scatter_add.default", "aten.scatter.src")
@scalars_as_vectors
def scatter(ctx: Context, x, dim, index, src):
    """Along `dim`, index[.., k, ..] = j writes src[.., k, ..] (or the one value) to out[.., j, ..]:
    added (scatter_add), else the last write wins."""
    dim %= len(ctx.out_type().shape)
    ids_full, values_full = _writes(ctx, dim, index, src)
    return _scattered(ctx, x, dim, ids_full, values_full, "scatter_add" in str(ctx.node.target))


def _writes(ctx: Context, dim: int, index, src) -> tuple[str, str]:
    """(ids, values) of a scatter along `dim` over the output's shape plus the writes' axis k:
    entry k of each row targets ids[.., k] and writes values[.., k]. Index may be shorter than the
    output in its other dimensions (torch's rule): rows past its end write nothing (id -1)."""
    b = ctx.b
    out = ctx.out_type()
    shape = out.shape
    rank = len(shape)
    index_shape = b.shape(index)
    if len(index_shape) != rank or any(n > s for a, (n, s) in enumerate(zip(index_shape, shape)) if a != dim):
        raise UnsupportedOpError(f"unsupported op {ctx.where}: index of shape {list(index_shape)} over "
                                 f"{list(shape)}: torch scatters by an index no longer than the output in its "
                                 "other dimensions")
    region = tuple(shape[a] if a == dim else index_shape[a] for a in range(rank))
    written = (*region, index_shape[dim])
    k = Affine.dim(rank)
    at = [Affine.dim(a) if a != dim else k for a in range(rank)]
    ids = _checked(ctx, index, at, shape[dim], written, wrap=False)
    if isinstance(src, str):  # src has x's rank, at least index's extents: read where index is
        values = b.index_map(ctx.tensor(src, out.dtype), written, at, suffix="values")
    else:
        values = b.fill(src, written, out.dtype)
    if region == shape:
        return ids, values
    full = (*shape, index_shape[dim])
    inside = [Guard(Affine.dim(a), 0, region[a]) for a in range(rank) if region[a] < shape[a]]
    same = [Affine.dim(a) for a in range(rank + 1)]
    return (b.index_map(ids, full, same, inside, fill=-1, suffix="ids_padded"),
            b.index_map(values, full, same, inside, fill=0, suffix="values_padded"))


_REDUCED = {"sum": ("sum", "add"), "prod": ("prod", "multiply"), "amax": ("max", "maximum"),
            "amin": ("min", "minimum")}  # scatter_reduce's name -> (the fold, how it meets x)


@lowers("aten.scatter_reduce.two")
@scalars_as_vectors
def scatter_reduce(ctx: Context, x, dim, index, src, reduce, include_self=True):
    """Each output position folds the values written to it (sum, prod, amax, amin or mean), with
    its old value when include_self; a position nothing writes keeps its old value."""
    dim %= len(ctx.out_type().shape)
    ids_full, values_full = _writes(ctx, dim, index, src)
    return _folded_writes(ctx, x, dim, ids_full, values_full, reduce, include_self)


@lowers("aten.scatter.reduce", "aten.scatter.value_reduce")
@scalars_as_vectors
def scatter_with_reduce(ctx: Context, x, dim, index, src, reduce):
    """The older scatter(dim, index, src, reduce="add" | "multiply"): scatter_reduce with the old
    values folded in."""
    folds = {"add": "sum", "multiply": "prod"}
    if reduce not in folds:
        raise UnsupportedOpError(f"unsupported op {ctx.where}: reduce={reduce!r} (torch's are 'add', 'multiply')")
    dim %= len(ctx.out_type().shape)
    ids_full, values_full = _writes(ctx, dim, index, src)
    return _folded_writes(ctx, x, dim, ids_full, values_full, folds[reduce], True)


@lowers("aten.index_reduce.default")
@scalars_as_vectors
def index_reduce(ctx: Context, x, dim, index, source, reduce, include_self=True):
    """x.index_reduce(dim, index, source, reduce): source's slice k along `dim` folded into x's
    slice index[k] (prod, mean, amax, amin), as scatter_reduce by the index spread over source."""
    b = ctx.b
    out = ctx.out_type()
    rank = len(out.shape)
    dim %= rank
    count = b.shape(index)[0] if b.shape(index) else 1
    full = (*out.shape, count)
    at = [Affine.dim(a) if a != dim else Affine.dim(rank) for a in range(rank)]
    ids_full = _checked(ctx, index, [Affine.dim(rank)] if b.shape(index) else [], out.shape[dim], full, wrap=False)
    values_full = b.index_map(ctx.tensor(source, out.dtype), full, at, suffix="values")
    return _folded_writes(ctx, x, dim, ids_full, values_full, reduce, include_self)


def _folded_writes(ctx: Context, x, dim: int, ids_full: str, values_full: str, reduce: str, include_self) -> str:
    """x with each position along `dim` folding the writes that hit it by `reduce` (entry k of the
    last axis of `ids_full` and `values_full` targets ids_full[.., k]); untouched ones unchanged."""
    b = ctx.b
    out = ctx.out_type()
    rank = len(out.shape)
    full = b.shape(ids_full)
    here = b.index_map(ctx.constant(_arange(out.shape[dim]), DType.I64), full, [Affine.dim(dim)], suffix="positions")
    hits = b.elementwise("equal", ids_full, here, suffix="hits")
    old = ctx.tensor(x, out.dtype)
    count = b.reduce_axes("sum", b.cast(hits, DType.I64), [rank], False, suffix="writes")
    fold, meet = _REDUCED.get(reduce, ("sum", "add"))
    folded = b.reduce_axes(fold, b.elementwise("where", hits, values_full, fold_identity(fold, out.dtype), dtype=out.dtype),
                           [rank], False, suffix=reduce)
    if reduce == "mean":
        total = b.elementwise("add", old, folded) if include_self else folded
        many = b.elementwise("add", count, 1) if include_self else b.elementwise("maximum", count, 1)
        divide = "divide" if out.dtype.is_float else "floor_divide"
        folded = b.elementwise(divide, total, b.cast(many, out.dtype), suffix="mean")
        written = folded
    elif reduce in _REDUCED:
        written = b.elementwise(meet, old, folded) if include_self else folded
    else:
        raise UnsupportedOpError(f"unsupported op {ctx.where}: reduce={reduce!r} "
                                 "(torch's are 'sum', 'prod', 'mean', 'amax', 'amin')")
    return b.elementwise("where", b.elementwise("greater", count, 0), written, old, dtype=out.dtype, name=ctx.name)


@lowers("aten.put.default")
def put(ctx: Context, x, index, source, accumulate=False):
    """x.put(index, source): x read flat, x_flat[index[k]] = source[k] (negative indices count from
    the end; repeats: the last write wins, or all add up with accumulate), in x's shape again."""
    b = ctx.b
    out = ctx.out_type()
    n, m = max(b.type(x).numel, 1), max(b.type(index).numel, 1)
    full = (n, m)
    flat_ids = b.reshape(index, (m,), suffix="flat_ids")
    ids_full = _checked(ctx, flat_ids, [Affine.dim(1)], n, full, wrap=True)
    ids_full = b.elementwise("remainder", ids_full, n, dtype=DType.I64, suffix="wrapped")
    values_full = b.index_map(b.reshape(ctx.tensor(source, out.dtype), (m,)), full, [Affine.dim(1)], suffix="values")
    flat = _scattered(ctx, b.reshape(x, (n,)), 0, ids_full, values_full, bool(accumulate), shape=(n,))
    return b.reshape(flat, out.shape, name=ctx.name)


def _checked(ctx: Context, ids: str, at: list[Affine], extent: int, full, wrap: bool) -> str:
    """ids read at `at` over `full`, as int64, each also read as an index into an axis of `extent`
    (a table of zeros added to it): an id outside the axis is then reported as a gather's is
    (IndexOutOfRangeError, naming the ids' tensor), not silently written nowhere. `wrap`: negative
    ids count from the end (index_put's Python indexing; scatter takes none)."""
    import numpy as np

    b = ctx.b
    values = b.index_map(ctx.tensor(ids, DType.I64), full, at, suffix="ids")
    probe = b.index_map(ctx.constant(np.zeros(extent, dtype=np.int64), DType.I64), full,
                        [gathered_index(ctx, ids, at, extent, full, "written ids", wrap=wrap)], suffix="checked")
    return b.elementwise("add", values, probe, dtype=DType.I64)


def _scattered(ctx: Context, x, dim: int, ids_full: str, values_full: str, adding: bool, shape=None) -> str:
    """x with writes read back as gathers over the writes' axis k (the last of `ids_full`'s and
    `values_full`'s): entry k targets position ids_full[.., k] along `dim`. `shape`: x's, where it
    is not the op's result's (put writes its result read flat)."""
    b = ctx.b
    out = ctx.out_type()
    shape = out.shape if shape is None else tuple(shape)
    name = ctx.name if shape == out.shape else None
    rank = len(shape)
    full = b.shape(ids_full)
    here = b.index_map(ctx.constant(_arange(shape[dim]), DType.I64), full, [Affine.dim(dim)], suffix="positions")
    hits = b.elementwise("equal", ids_full, here, dtype=DType.BOOL, suffix="hits")
    old = ctx.tensor(x, out.dtype)
    if adding:
        added = b.reduce_axes("sum", b.elementwise("where", hits, values_full, 0, dtype=out.dtype), [rank], False)
        return b.elementwise("add", old, added, name=name)
    # the last write to each position: the largest k that hits it (-1: none), and its value
    order = b.index_map(ctx.constant(_arange(full[-1]), DType.I64), full, [Affine.dim(rank)], suffix="order")
    last = b.reduce_axes("max", b.elementwise("where", hits, order, -1, dtype=DType.I64), [rank], True)
    chosen = b.elementwise("equal", order, ctx.tensor(last, DType.I64, full), dtype=DType.BOOL, suffix="chosen")
    value = b.reduce_axes("sum", b.elementwise("where", chosen, values_full, 0, dtype=out.dtype), [rank], False)
    hit = b.elementwise("greater_equal", b.reshape(last, shape), 0, dtype=DType.BOOL, suffix="hit")
    return b.elementwise("where", hit, value, old, dtype=out.dtype, name=name)


def _arange(n: int):
    import numpy as np

    return np.arange(n)


@lowers("aten.masked_scatter.default")
def masked_scatter(ctx: Context, x, mask, source):
    """x with the elements where `mask` holds (broadcast to x) replaced by source's elements in
    order (a multimodal model's image features put at its image tokens)."""
    out = ctx.out_type()
    return _in_mask_order(ctx, x, ctx.tensor(mask, DType.BOOL, out.shape), source, accumulate=False)


def _in_mask_order(ctx: Context, x, hits_full: str, source, accumulate: bool) -> str:
    """x where `hits_full` holds replaced by (or, accumulating, added to) source's elements in
    order: the k-th hit, counted along x read flat, takes source's k-th element. A source with
    fewer elements than hits is reported as a gather's bad index is."""
    b = ctx.b
    out = ctx.out_type()
    count = max(b.type(x).numel, 1)
    hits = b.reshape(hits_full, (count,), suffix="hits")
    before = running(ctx, "sum", b.cast(hits, DType.I64), 0)  # hits up to and including each element
    slot = b.elementwise("where", hits, b.elementwise("subtract", before, 1, dtype=DType.I64), 0, dtype=DType.I64,
                         suffix="slot")
    flat_source = b.reshape(source, (max(b.type(source).numel, 1),), suffix="source")
    picked = b.index_map(ctx.tensor(flat_source, out.dtype), (count,),
                         [gathered_index(ctx, slot, [Affine.dim(0)], b.shape(flat_source)[0], (count,),
                                         "masked_scatter positions")], suffix="picked")
    old = b.reshape(ctx.tensor(x, out.dtype), (count,))
    if accumulate:
        picked = b.elementwise("add", old, picked, suffix="accumulated")
    flat = b.elementwise("where", hits, picked, old, dtype=out.dtype)
    return b.reshape(flat, out.shape, name=ctx.name)


def _refuse_unless_row_major(ctx: Context) -> None:
    """as_strided reads its first argument's storage: emmy holds a tensor as its elements in
    row-major order, so a tensor laid out otherwise (a view of a view's storage) is refused."""
    val = ctx.node.args[0].meta.get("val")
    if val is None or not val.is_contiguous() or val.storage_offset() != 0:
        raise UnsupportedOpError(f"unsupported op {ctx.where}: as_strided of a tensor that is not laid out "
                                 "row-major from its storage's start")


def _strided_positions(size, stride, storage_offset):
    """The flat positions an as_strided view reads, in the view's order."""
    import numpy as np

    extents = tuple(int(s) for s in size)
    grid = np.indices(extents, dtype=np.int64).reshape(len(extents), math.prod(extents))  # a 0-d view: one
    steps = np.asarray([int(s) for s in stride], dtype=np.int64).reshape(-1, 1)  # position, the offset
    return int(storage_offset or 0) + (grid * steps).sum(0)


@lowers("aten.as_strided.default", "aten.as_strided_copy.default")
def as_strided(ctx: Context, x, size, stride, storage_offset=None):
    """A strided view of x's elements read flat (fill_diagonal_ views the diagonal as stride n + 1):
    one index map, offset + sum(i_k * stride_k)."""
    b = ctx.b
    _refuse_unless_row_major(ctx)
    flat = b.reshape(x, (max(b.type(x).numel, 1),), suffix="flat")
    at = Affine.constant(int(storage_offset or 0))
    for k, step in enumerate(stride):
        at = at + Affine.dim(k) * int(step)
    return b.index_map(flat, tuple(int(s) for s in size), [at], name=ctx.name)


@lowers("aten.as_strided_scatter.default")
def as_strided_scatter(ctx: Context, x, src, size, stride, storage_offset=None):
    """x with the elements of its as_strided view replaced by src's: each flat position of x reads
    src at the view index that lands on it (a constant table), or keeps its value. Overlapping
    views (two view elements on one position) are refused."""
    import numpy as np

    b = ctx.b
    out = ctx.out_type()
    _refuse_unless_row_major(ctx)
    positions = _strided_positions(size, stride, storage_offset)
    n = max(b.type(x).numel, 1)
    if len(np.unique(positions)) != len(positions):
        raise UnsupportedOpError(f"unsupported op {ctx.where}: an as_strided view whose elements overlap")
    source = np.full(n, -1, dtype=np.int64)
    source[positions] = np.arange(len(positions))
    table = ctx.constant(np.maximum(source, 0), DType.I64)
    written = ctx.constant(source >= 0, DType.BOOL)
    flat_src = b.reshape(ctx.tensor(src, out.dtype), (max(len(positions), 1),), suffix="flat_src")
    picked = b.index_map(flat_src, (n,), [gathered_index(ctx, table, [Affine.dim(0)], len(positions), (n,),
                                                         "as_strided positions")], suffix="picked")
    flat = b.elementwise("where", written, picked, b.reshape(ctx.tensor(x, out.dtype), (n,)), dtype=out.dtype)
    return b.reshape(flat, out.shape, name=ctx.name)
