"""Reductions: sum, mean, amax/amin, max/min with their indices, argmax/argmin, prod, var/std,
vector norms, and the scans cumsum/cumprod.

Half-precision inputs accumulate in float32 and round once at the end.
"""

from __future__ import annotations

import numpy as np

from emmy.affine import Affine, Gathered, Guard
from emmy.decompose.registry import Context, lowers
from emmy.dtypes import DType
from emmy.tensor_ir.scalar_ops import REDUCE_OPS


def _axes(ctx: Context, x: str, dims) -> list[int]:
    rank = len(ctx.b.shape(x))
    if dims is None or (isinstance(dims, (list, tuple)) and len(dims) == 0):
        return list(range(rank))
    if isinstance(dims, int):
        dims = [dims]
    return [d % rank for d in dims] if rank else []


def _count(ctx: Context, x: str, axes: list[int]) -> int:
    n = 1
    for a in axes:
        n *= ctx.b.shape(x)[a]
    return n


def _reduce(ctx: Context, op: str, x: str, dims, keepdim: bool) -> str:
    out = ctx.out_type()
    acc = out.dtype.accumulator if op in ("sum", "prod") else ctx.b.dtype(x)
    xf = ctx.tensor(x, acc)
    axes = _axes(ctx, x, dims)
    final = acc is out.dtype
    result = ctx.b.reduce_axes(op, xf, axes, keepdim, name=ctx.name if final else None)
    return ctx.b.cast(result, out.dtype)


@lowers("aten.sum.dim_IntList", "aten.sum.default")
def sum_(ctx: Context, x, dims=None, keepdim=False, dtype=None):
    return _reduce(ctx, "sum", x, dims, keepdim)


@lowers("aten.prod.dim_int", "aten.prod.default")
def prod(ctx: Context, x, dim=None, keepdim=False, dtype=None):
    return _reduce(ctx, "prod", x, dim, keepdim)


@lowers("aten.amax.default", "aten.max.default")
def amax(ctx: Context, x, dims=None, keepdim=False):
    return _reduce(ctx, "max", x, dims, keepdim)


@lowers("aten.amin.default", "aten.min.default")
def amin(ctx: Context, x, dims=None, keepdim=False):
    return _reduce(ctx, "min", x, dims, keepdim)


@lowers("aten.any.default", "aten.any.dim", "aten.any.dims", "aten.all.default", "aten.all.dim", "aten.all.dims")
def any_all(ctx: Context, x, dims=None, keepdim=False):
    """Whether any (all) element is nonzero (NaN is): a max (min) fold of the truth values as int32."""
    op = "max" if ".any." in str(ctx.node.target) else "min"
    truth = ctx.b.cast(ctx.tensor(x, DType.BOOL), DType.I32)
    folded = ctx.b.reduce_axes(op, truth, _axes(ctx, x, dims), keepdim)
    return ctx.b.cast(folded, ctx.out_type().dtype)


@lowers("aten.max.dim", "aten.min.dim")
def max_dim(ctx: Context, x, dim, keepdim=False):
    op = "max" if ".max." in str(ctx.node.target) else "min"
    out = ctx.out_type(0)
    rank = len(ctx.b.shape(x))
    if rank == 0:  # a 0-d tensor is its own extreme, at position 0
        return (ctx.tensor(x), ctx.b.fill(0, (), DType.I64))
    if keepdim:
        kept = values = ctx.b.reduce_axes(op, x, [dim], True, name=ctx.name)
    else:
        kept = ctx.b.reduce_axes(op, x, [dim], True)
        values = ctx.b.keep_axes(kept, [k for k in range(rank) if k != dim % rank], name=ctx.name)
    assert ctx.b.shape(values) == out.shape
    if _keyed(ctx, x, dim % rank):
        return (values, _first_extreme(ctx, x, dim % rank, op, keepdim, suffix="indices"))
    return (values, _position_of(ctx, x, dim % rank, kept, keepdim, suffix="indices"))


def _keyed(ctx: Context, x: str, axis: int) -> bool:
    """Whether an arg-reduction over `axis` folds (value, position) keys in one pass: values that
    are exactly f32s (the key holds their f32 bits; f64 values would tie where they differ),
    positions that fit the key's 32 low bits."""
    return ctx.b.dtype(x).fits_f32 and ctx.b.shape(x)[axis] < 2 ** 32


def _positions_along(ctx: Context, shape, axis: int) -> str:
    """Each element's position along `axis`, as int64 (arg-reductions' candidates)."""
    positions = ctx.constant(np.arange(shape[axis]), DType.I64)
    return ctx.b.index_map(positions, shape, [Affine.dim(axis)], suffix="positions")


def _first_extreme(ctx: Context, x: str, axis: int, op: str, keepdim: bool, suffix: str) -> str:
    """The first position along `axis` of x's maximum (op "max") or minimum ("min"), NaN the extreme
    wherever one occurs as in torch: one max (min) fold of int64 keys packing each value with its
    position (tensor_ir.scalar_ops), the position unpacked from the winner."""
    b = ctx.b
    along = _positions_along(ctx, b.shape(x), axis)
    keys = b.elementwise(f"{op}_key", x, along, dtype=DType.I64, suffix="key")
    best = b.reduce_axes(op, keys, [axis], keepdim, suffix="best")
    return b.elementwise(f"{op}_key_position", best, dtype=DType.I64, suffix=suffix)


def _position_of(ctx: Context, x: str, axis: int, extreme: str, keepdim: bool, suffix: str) -> str:
    """The first position along `axis` where x equals its (kept) extreme, as torch's indices: a NaN
    is the extreme wherever one occurs, as torch's max and argmax propagate it."""
    b = ctx.b
    shape = b.shape(x)
    n = shape[axis]
    hit = b.elementwise("equal", x, b.broadcast_to(extreme, shape), dtype=DType.BOOL)
    if b.dtype(x).is_float:
        hit = b.elementwise("logical_or", hit, b.elementwise("isnan", x, dtype=DType.BOOL), dtype=DType.BOOL)
    along = _positions_along(ctx, shape, axis)
    candidates = b.elementwise("where", hit, along, b.fill(n, shape, DType.I64), dtype=DType.I64)
    first = b.reduce_axes("min", candidates, [axis], keepdim, suffix=suffix)
    return first


def mean_of(ctx: Context, xf: str, axes: list[int], keepdim: bool, name: str | None = None) -> str:
    total = ctx.b.reduce_axes("sum", xf, axes, keepdim, suffix="sum")
    return ctx.b.elementwise("divide", total, float(_count(ctx, xf, axes)), suffix="mean", name=name)


@lowers("aten.mean.dim", "aten.mean.default")
def mean(ctx: Context, x, dims=None, keepdim=False, dtype=None):
    out = ctx.out_type()
    acc = out.dtype.accumulator
    xf = ctx.tensor(x, acc)
    result = mean_of(ctx, xf, _axes(ctx, x, dims), keepdim, name=ctx.name if acc is out.dtype else None)
    return ctx.b.cast(result, out.dtype)


def variance_of(ctx: Context, xf: str, axes: list[int], correction: float, keepdim: bool,
                name: str | None = None) -> str:
    """sum((x - mean)^2) / (N - correction), keeping the reduced axes when asked. Adjacent axes
    (LayerNorm over (C, H, W)) are read as one merged axis throughout, so the centred squares
    are one fold over one axis, which the twist rules can fold with the mean in one pass (Welford)."""
    b = ctx.b
    shape = b.shape(xf)
    run = sorted({a % len(shape) for a in axes}) if shape else []
    if len(run) > 1 and run == list(range(run[0], run[-1] + 1)):
        lo, hi = run[0], run[-1] + 1
        merged = b.reshape(xf, (*shape[:lo], int(np.prod(shape[lo:hi])), *shape[hi:]), suffix="merged")
        v = variance_of(ctx, merged, [lo], correction, keepdim=True)
        kept = (*shape[:lo], *[1] * (hi - lo) * keepdim, *shape[hi:])
        return b.reshape(v, kept, suffix="var", name=name)
    m = mean_of(ctx, xf, axes, keepdim=True)
    centred = b.elementwise("subtract", xf, b.broadcast_to(m, b.shape(xf)), suffix="centred")
    squares = b.elementwise("multiply", centred, centred, suffix="sq")
    total = b.reduce_axes("sum", squares, axes, keepdim, suffix="sqsum")
    return b.elementwise("divide", total, float(_count(ctx, xf, axes)) - correction, suffix="var", name=name)


@lowers("aten.var.correction", "aten.std.correction", "aten.var.dim", "aten.std.dim")
def var(ctx: Context, x, dims=None, unbiased_or_none=None, correction=None, keepdim=False):
    if isinstance(unbiased_or_none, bool):  # var.dim(x, dims, unbiased, keepdim)
        correction = 1 if unbiased_or_none else 0
    if correction is None:
        correction = 1
    out = ctx.out_type()
    acc = out.dtype.accumulator
    xf = ctx.tensor(x, acc)
    is_std = ".std." in str(ctx.node.target)
    v = variance_of(ctx, xf, _axes(ctx, x, dims), float(correction), keepdim,
                    name=ctx.name if (acc is out.dtype and not is_std) else None)
    if is_std:
        v = ctx.b.elementwise("sqrt", v, name=ctx.name if acc is out.dtype else None)
    return ctx.b.cast(v, out.dtype)


@lowers("aten.var_mean.correction")
def var_mean(ctx: Context, x, dims=None, *, correction=None, keepdim=False):
    """(variance, mean) as torch.var_mean (torch.std_mean arrives as var_mean and a sqrt): the
    variance's fold computes the same sum of x the mean is."""
    if correction is None:
        correction = 1
    var_type, mean_type = ctx.out_type(0), ctx.out_type(1)
    xf = ctx.tensor(x, var_type.dtype.accumulator)
    axes = _axes(ctx, x, dims)
    v = variance_of(ctx, xf, axes, float(correction), keepdim)
    m = mean_of(ctx, xf, axes, keepdim)
    return ctx.b.cast(v, var_type.dtype), ctx.b.cast(m, mean_type.dtype)


@lowers("aten.argmax.default", "aten.argmin.default")
def argmax(ctx: Context, x, dim=None, keepdim=False):
    """Index of the first maximum (minimum), as one fold of (value, position) keys for floats. With
    no `dim` the tensor is read flat, as torch does."""
    op = "max" if "argmax" in str(ctx.node.target) else "min"
    out = ctx.out_type()
    if dim is None or not ctx.b.shape(x):  # a 0-d tensor's only element is at 0, along any dim
        x = ctx.b.reshape(x, [max(ctx.b.type(x).numel, 1)])
        dim, keepdim = 0, False
    axis = dim % max(len(ctx.b.shape(x)), 1)
    if _keyed(ctx, x, axis):
        found = _first_extreme(ctx, x, axis, op, keepdim, suffix="index")
    else:  # integers: the extreme, then the least position holding it (two folds)
        extreme = ctx.b.reduce_axes(op, x, [axis], True)
        found = _position_of(ctx, x, axis, extreme, keepdim, suffix="index")
    return ctx.b.index_map(found, out.shape, [Affine.dim(k) for k in range(len(out.shape))], name=ctx.name)


@lowers("aten.cumsum.default", "aten.cumprod.default")
def scan(ctx: Context, x, dim, dtype=None):
    """out[..i..] = the sum (product) of x[..j..] for j <= i. A short axis reads x through a
    triangular index map (a new axis j guarded by j <= i, filled with the identity) and folds it; a
    long one is a blocked two-pass scan (`_blocked_scan`), O(n*sqrt(n)) work instead of O(n^2)."""
    op = "sum" if "cumsum" in str(ctx.node.target) else "prod"
    out = ctx.out_type()
    acc = out.dtype.accumulator
    xf = ctx.tensor(x, acc)
    shape = ctx.b.shape(xf)
    if not shape:  # a rank-0 scan is the value itself
        return ctx.b.cast(xf, out.dtype)
    axis = dim % len(shape)
    name = ctx.name if acc is out.dtype else None
    return ctx.b.cast(running(ctx, op, xf, axis, name), out.dtype)


def running(ctx: Context, op: str, x: str, axis: int, name: str | None = None) -> str:
    """The running sum, product, maximum or minimum of x along `axis` (x's dtype)."""
    shape = ctx.b.shape(x)
    if shape[axis] >= BLOCKED_SCAN_FROM:
        return _blocked_scan(ctx, op, x, axis, name)
    rank = len(shape)
    index = [Affine.dim(rank) if k == axis else Affine.dim(k) for k in range(rank)]
    upto = Guard(Affine.dim(rank) - Affine.dim(axis), hi=1)  # j - i < 1
    tri = ctx.b.index_map(x, (*shape, shape[axis]), index, guards=[upto], fill=fold_identity(op, ctx.b.dtype(x)),
                          suffix="prefix")
    return ctx.b.reduce_axes(op, tri, [rank], False, name=name)


@lowers("aten.logcumsumexp.default")
def logcumsumexp(ctx: Context, x, dim):
    """out[..i..] = log(sum over j <= i of exp(x[..j..])), shifted by the running maximum m_i so
    no exp overflows: m_i + log(sum exp(x_j - m_i)), a triangular fold per element (O(n^2) per
    row). Where m_i is infinite the shift is 0, so -inf rows stay -inf and +inf gives +inf."""
    b = ctx.b
    out = ctx.out_type()
    xf = ctx.tensor(x, out.dtype.accumulator)
    shape = b.shape(xf)
    if not shape:
        return b.cast(xf, out.dtype)
    axis, rank = dim % len(shape), len(shape)
    most = running(ctx, "max", xf, axis)
    shift = b.elementwise("where", b.elementwise("isinf", most), 0.0, most, suffix="shift")
    index = [Affine.dim(rank) if k == axis else Affine.dim(k) for k in range(rank)]
    upto = Guard(Affine.dim(rank) - Affine.dim(axis), hi=1)  # j - i < 1
    earlier = b.index_map(xf, (*shape, shape[axis]), index, guards=[upto], fill=-np.inf, suffix="prefix")
    shifted = b.elementwise("subtract", earlier, b.index_map(shift, b.shape(earlier), [Affine.dim(k) for k in range(rank)]))
    total = b.reduce_axes("sum", b.elementwise("exp", shifted), [rank], False, suffix="sumexp")
    return b.cast(b.elementwise("add", shift, b.elementwise("log", total)), out.dtype)


@lowers("aten.cummax.default", "aten.cummin.default")
def running_extreme(ctx: Context, x, dim):
    """(values, indices) of torch.cummax (cummin): the extreme so far and the last position holding
    it (torch breaks ties, NaNs too, towards the later element; a NaN is the extreme from where it
    occurs). Floats: one running max (min) of int64 keys packing each value with its position
    counted from the end (so the later of equal values wins), the values read back at the
    positions. Integers: the running extreme, then the last position up to i holding it (an
    O(n^2) fold per row)."""
    b = ctx.b
    op = "max" if "cummax" in str(ctx.node.target) else "min"
    shape = b.shape(x)
    if not shape:
        return x, b.fill(0, (), DType.I64)
    axis = dim % len(shape)
    n = shape[axis]
    if _keyed(ctx, x, axis):
        from_end = b.index_map(ctx.constant(np.arange(n)[::-1].copy(), DType.I64), shape, [Affine.dim(axis)],
                               suffix="from_end")
        keys = b.elementwise(f"{op}_key", x, from_end, dtype=DType.I64, suffix="key")
        best = b.elementwise(f"{op}_key_position", running(ctx, op, keys, axis), dtype=DType.I64, suffix="best")
        indices = b.elementwise("subtract", n - 1, best, dtype=DType.I64, suffix="indices")
        gathered = Affine(((Gathered(indices, tuple(Affine.dim(k) for k in range(len(shape))), shape, n), 1),), 0)
        at = [gathered if k == axis else Affine.dim(k) for k in range(len(shape))]
        return b.index_map(x, shape, at, suffix="values"), indices
    values = running(ctx, op, x, axis, name=None)
    rank = len(shape)
    index = [Affine.dim(rank) if k == axis else Affine.dim(k) for k in range(rank)]
    upto = Guard(Affine.dim(rank) - Affine.dim(axis), hi=1)
    earlier = b.index_map(x, (*shape, n), index, guards=[upto], fill=0, suffix="earlier")  # x[.., j, ..], j <= i
    held = b.index_map(values, (*shape, n), [Affine.dim(k) for k in range(rank)], suffix="held")
    # j where j <= i, else -1 (so a j past i never wins, whatever its x)
    positions = b.index_map(ctx.constant(np.arange(n), DType.I64), (*shape, n), [Affine.dim(rank)], guards=[upto],
                            fill=-1, suffix="j")
    hit = b.elementwise("equal", earlier, held, dtype=DType.BOOL)
    last = b.reduce_axes("max", b.elementwise("where", hit, positions, -1, dtype=DType.I64), [rank], False)
    return values, last


BLOCKED_SCAN_FROM = 32  # scanned extents from here on take the blocked form


def fold_identity(op: str, dtype: DType) -> float | int:
    """The fold's identity in `dtype`: 0, 1, or the least (greatest) value for a maximum (minimum)."""
    if dtype.is_float or op in ("sum", "prod"):
        return REDUCE_OPS[op] if dtype.is_float else int(REDUCE_OPS[op])
    info = np.iinfo(dtype.numpy)
    return int(info.min) if op == "max" else int(info.max)


def _blocked_scan(ctx: Context, op: str, x: str, axis: int, name: str | None) -> str:
    """A scan in chunks of B ~ sqrt(n) along `axis`: (1) each chunk's total; (2) for each chunk the
    fold of the totals before it (C^2 for C chunks); (3) each element's prefix inside its chunk
    (n*B), combined with (2) read through i // B. Each pass is an index map and a fold."""
    import math

    b = ctx.b
    shape = b.shape(x)
    rank, n = len(shape), shape[axis]
    block = math.isqrt(n - 1) + 1
    chunks = -(-n // block)
    identity = fold_identity(op, b.dtype(x))
    combine = {"sum": "add", "prod": "multiply", "max": "maximum", "min": "minimum"}[op]
    at = [Affine.dim(k) for k in range(rank)]  # output coordinates, axis replaced below
    # (1) totals[.., c] = fold over j < B of x[.., c*B + j], where c*B + j < n
    element = Affine.dim(axis) * block + Affine.dim(rank)
    chunked = b.index_map(x, (*shape[:axis], chunks, *shape[axis + 1:], block),
                          [element if k == axis else at[k] for k in range(rank)],
                          guards=[Guard(element, hi=n)], fill=identity, suffix="chunk")
    totals = b.reduce_axes(op, chunked, [rank], False, suffix="chunk_total")
    # (2) before[.., c] = fold over c' < c of totals[.., c']
    earlier = b.index_map(totals, (*shape[:axis], chunks, *shape[axis + 1:], chunks),
                          [Affine.dim(rank) if k == axis else at[k] for k in range(rank)],
                          guards=[Guard(Affine.dim(rank) - Affine.dim(axis), hi=0)], fill=identity,
                          suffix="earlier")
    before = b.reduce_axes(op, earlier, [rank], False, suffix="chunk_before")
    # (3) within[.., i] = fold over j <= i % B of x[.., (i // B)*B + j]; out = before[i // B] (+) within
    start = Affine.dim(axis).floordiv(block, (*shape, block)) * block
    inside = b.index_map(x, (*shape, block), [start + Affine.dim(rank) if k == axis else at[k] for k in range(rank)],
                         guards=[Guard(start + Affine.dim(rank) - Affine.dim(axis), hi=1)], fill=identity,
                         suffix="within")
    within = b.reduce_axes(op, inside, [rank], False, suffix="chunk_prefix")
    chunk_of = Affine.dim(axis).floordiv(block, shape)
    carried = b.index_map(before, shape, [chunk_of if k == axis else at[k] for k in range(rank)], suffix="carried")
    return b.elementwise(combine, carried, within, name=name)


@lowers("aten.linalg_vector_norm.default")
def vector_norm(ctx: Context, x, ord=2, dim=None, keepdim=False, dtype=None):
    """(sum |x|^p)^(1/p) over `dim`; max |x| for ord=inf, min |x| for -inf, the nonzero count for 0."""
    out = ctx.out_type()
    acc = out.dtype.accumulator
    magnitude = ctx.b.elementwise("abs", ctx.tensor(x, acc), suffix="abs")
    return ctx.b.cast(_norm(ctx, magnitude, ord, _axes(ctx, x, dim), keepdim, acc), out.dtype)


@lowers("aten.dist.default")
def dist(ctx: Context, x, y, p=2):
    """The p-norm of x - y over every element."""
    out = ctx.out_type()
    acc = out.dtype.accumulator
    shape = tuple(np.broadcast_shapes(ctx.b.shape(x), ctx.b.shape(y)))
    difference = ctx.b.elementwise("subtract", ctx.tensor(x, acc, shape), ctx.tensor(y, acc, shape), suffix="difference")
    magnitude = ctx.b.elementwise("abs", difference, suffix="abs")
    return ctx.b.cast(_norm(ctx, magnitude, p, list(range(len(shape))), False, acc), out.dtype)


@lowers("aten._cdist_forward.default")
def cdist(ctx: Context, x1, x2, p=2.0, compute_mode=None):
    """out[.., i, j] = ||x1[.., i, :] - x2[.., j, :]||_p, from the differences themselves (torch's
    matrix-product route for large inputs loses digits to cancellation; this one does not)."""
    out = ctx.out_type()
    acc = out.dtype.accumulator
    full = (*out.shape, ctx.b.shape(x1)[-1])
    left = ctx.b.reshape(x1, (*ctx.b.shape(x1)[:-1], 1, full[-1]), suffix="rows")
    right = ctx.b.reshape(x2, (*ctx.b.shape(x2)[:-2], 1, *ctx.b.shape(x2)[-2:]), suffix="columns")
    difference = ctx.b.elementwise("subtract", ctx.tensor(left, acc, full), ctx.tensor(right, acc, full),
                                   suffix="difference")
    magnitude = ctx.b.elementwise("abs", difference, suffix="abs")
    return ctx.b.cast(_norm(ctx, magnitude, p, [len(full) - 1], False, acc), out.dtype)


@lowers("aten._pdist_forward.default")
def pdist(ctx: Context, x, p=2.0):
    """out[k] = ||x[i] - x[j]||_p over the pairs i < j in row order (scipy's condensed form): the
    rows of each pair read through constant tables of i and j, the norm as cdist's."""
    out = ctx.out_type()
    acc = out.dtype.accumulator
    n, m = ctx.b.shape(x)
    first, second = np.triu_indices(n, 1)
    pairs = (len(first), m)

    def rows(table, suffix):
        at = Gathered(ctx.constant(table, DType.I64), (Affine.dim(0),), (len(first),), n)
        return ctx.b.index_map(ctx.tensor(x, acc), pairs, [Affine(((at, 1),), 0), Affine.dim(1)], suffix=suffix)

    difference = ctx.b.elementwise("subtract", rows(first, "first"), rows(second, "second"), suffix="difference")
    return ctx.b.cast(_norm(ctx, ctx.b.elementwise("abs", difference), p, [1], False, acc), out.dtype)


def _norm(ctx: Context, magnitude: str, ord, axes: list[int], keepdim: bool, acc: DType) -> str:
    """The `ord`-norm of |values| (`magnitude`) over `axes`, in `acc`."""
    import math

    b = ctx.b
    if ord in (math.inf, -math.inf):
        result = b.reduce_axes("max" if ord > 0 else "min", magnitude, axes, keepdim)
    elif ord == 0:
        nonzero = b.cast(b.elementwise("not_equal", magnitude, 0.0, dtype=DType.BOOL), acc)
        result = b.reduce_axes("sum", nonzero, axes, keepdim)
    elif ord == 1:
        result = b.reduce_axes("sum", magnitude, axes, keepdim)
    elif ord == 2:
        result = b.elementwise("sqrt", b.reduce_axes("sum", b.elementwise("multiply", magnitude, magnitude),
                                                     axes, keepdim))
    else:
        powered = b.elementwise("power", magnitude, float(ord))
        result = b.elementwise("power", b.reduce_axes("sum", powered, axes, keepdim), 1.0 / float(ord))
    return result
