"""Orderings: sort, topk, kthvalue, median and nanmedian, as ranks.

torch sorts each row; emmy counts, for each element, the elements that come before it in the order
(its rank: O(n^2) comparisons per row of n, every count independent and the comparisons fused into
the fold), then finds the element of each wanted rank (a second fold over the row) and reads its
value there. The order is stable, as torch's sort on the CPU is: equal values keep their positions'
order, so ties in topk, kthvalue and median resolve to the earliest position (torch leaves which of
equal values it returns unspecified there). NaN sorts after every number (before, descending) and
NaNs are equal to each other, as in torch.
"""

from __future__ import annotations

import numpy as np

from emmy.affine import Affine, Gathered, Guard
from emmy.decompose.registry import Context, lowers
from emmy.dtypes import DType


def _comparable(ctx: Context, x: str) -> str:
    """x in a type the comparisons take: bools compare as 0 and 1."""
    return ctx.b.cast(x, DType.I32) if ctx.b.dtype(x) is DType.BOOL else x


def _precedes(ctx: Context, a: str, b_: str, descending: bool) -> str:
    """Whether a comes strictly before b_ in the order (a bool tensor)."""
    b = ctx.b
    before = b.elementwise("greater" if descending else "less", a, b_)
    if not b.dtype(a).is_float:
        return before
    # NaN is the greatest value: last ascending, first descending
    nan_first, number = (a, b_) if descending else (b_, a)
    nan_wins = b.elementwise("logical_and", b.elementwise("isnan", nan_first),
                             b.elementwise("logical_not", b.elementwise("isnan", number)))
    return b.elementwise("logical_or", before, nan_wins)


def _ties(ctx: Context, a: str, b_: str) -> str:
    """Whether a and b_ hold equal values (two NaNs tie)."""
    b = ctx.b
    same = b.elementwise("equal", a, b_)
    if not b.dtype(a).is_float:
        return same
    both_nan = b.elementwise("logical_and", b.elementwise("isnan", a),
                             b.elementwise("isnan", b_))
    return b.elementwise("logical_or", same, both_nan)


def _along(ctx: Context, shape, axis: int, extent: int) -> str:
    """Positions 0..extent-1 along `axis` of a tensor of `shape`, as int64."""
    return ctx.b.index_map(ctx.constant(np.arange(extent), DType.I64), shape, [Affine.dim(axis)], suffix="positions")


def ranks(ctx: Context, x: str, axis: int, descending: bool) -> str:
    """Each element's place (int64, from 0) in the stable order of its row along `axis`: the
    elements that precede it, plus the equal ones at earlier positions."""
    b = ctx.b
    x = _comparable(ctx, x)
    shape = b.shape(x)
    rank, n = len(shape), shape[axis]
    pairs = (*shape, n)  # [.., i, .., j]: element i against element j of its row
    other = b.index_map(x, pairs, [Affine.dim(rank) if k == axis else Affine.dim(k) for k in range(rank)],
                        suffix="other")
    this = b.index_map(x, pairs, [Affine.dim(k) for k in range(rank)], suffix="this")
    earlier = b.elementwise("less", _along(ctx, pairs, rank, n), _along(ctx, pairs, axis, n))
    counted = b.elementwise("logical_or", _precedes(ctx, other, this, descending),
                            b.elementwise("logical_and", _ties(ctx, other, this), earlier))
    return b.reduce_axes("sum", b.cast(counted, DType.I64), [rank], False, suffix="rank")


def positions_of_places(ctx: Context, rank_of: str, places: str, axis: int) -> str:
    """indices[.., k, ..] = the position along `axis` whose rank (`rank_of`, rows of n) equals
    places[.., k, ..] (int64, of the result's shape; every place in 0..n-1, so exactly one
    position holds it)."""
    b = ctx.b
    shape = b.shape(places)
    rank, n = len(shape), b.shape(rank_of)[axis]
    pairs = (*shape, n)  # [.., k, .., i]: place k against element i of its row
    held = b.index_map(rank_of, pairs, [Affine.dim(rank) if k == axis else Affine.dim(k) for k in range(rank)],
                       suffix="held")
    wanted = b.index_map(places, pairs, [Affine.dim(k) for k in range(rank)], suffix="wanted")
    hit = b.elementwise("equal", held, wanted)
    at = b.elementwise("where", hit, _along(ctx, pairs, rank, n), 0, dtype=DType.I64)
    return b.reduce_axes("sum", at, [rank], False, suffix="indices")


def read_at(ctx: Context, x: str, axis: int, indices: str) -> str:
    """out[.., k, ..] = x[.., indices[.., k, ..], ..] (indices of the result's shape, in range)."""
    shape = ctx.b.shape(indices)
    gathered = Affine(((Gathered(indices, tuple(Affine.dim(k) for k in range(len(shape))), shape,
                                 ctx.b.shape(x)[axis]), 1),), 0)
    return ctx.b.index_map(x, shape, [gathered if k == axis else Affine.dim(k) for k in range(len(shape))],
                           suffix="values")


def _ordered(ctx: Context, x: str, dim: int, descending: bool, count: int):
    """(values, indices) of the first `count` elements of each row along `dim` in the order."""
    b = ctx.b
    shape = b.shape(x)
    if not shape:  # a rank-0 tensor is its own order
        return x, b.fill(0, (), DType.I64)
    axis = dim % len(shape)
    out_shape = (*shape[:axis], count, *shape[axis + 1:])
    indices = positions_of_places(ctx, ranks(ctx, x, axis, descending), _along(ctx, out_shape, axis, count), axis)
    return read_at(ctx, x, axis, indices), indices


@lowers("aten.sort.default", "aten.sort.stable")
def sort(ctx: Context, x, *args, stable=None, dim=-1, descending=False):
    if args:  # sort.default(x, dim, descending)
        dim, descending = (*args, descending)[:2]
    shape = ctx.b.shape(x)
    return _ordered(ctx, x, dim, bool(descending), shape[dim % len(shape)] if shape else 1)


@lowers("aten.topk.default")
def topk(ctx: Context, x, k, dim=-1, largest=True, sorted=True):
    """The k largest (smallest) along `dim`, in order (an unsorted topk may return them in any
    order; this one always sorts them). The k largest of a long float row (a vocabulary's top 50)
    are k folds of the row (`_largest_by_passes`), not a rank per element."""
    shape = ctx.b.shape(x)
    if largest and shape and ctx.b.dtype(x).fits_f32 and int(k) <= PASSES_UP_TO \
            and shape[dim % len(shape)] > RANKS_UP_TO:
        return _largest_by_passes(ctx, x, dim % len(shape), int(k))
    return _ordered(ctx, x, dim, bool(largest), int(k))


RANKS_UP_TO = 64  # rows of up to this many elements are ranked (n^2 comparisons) ...
PASSES_UP_TO = 64  # ... longer ones give their k largest, for k up to this, by k folds (n*k)


def _largest_by_passes(ctx: Context, x: str, axis: int, k: int):
    """(values, indices) of the k largest along `axis` of a float tensor: pass t folds the row's
    (value, position) keys (tensor_ir.scalar_ops' max_key: NaN the greatest, the earlier of equal
    values first, as the stable order) below the key pass t - 1 found, keeping the greatest."""
    b = ctx.b
    shape = b.shape(x)
    rank = len(shape)
    keys = b.elementwise("max_key", b.cast(x, DType.F32), _along(ctx, shape, axis, shape[axis]), dtype=DType.I64,
                         suffix="key")
    out_shape = (*shape[:axis], k, *shape[axis + 1:])
    indices = None
    found = None
    for t in range(k):
        below = keys if found is None else b.elementwise(
            "where", b.elementwise("less", keys, b.broadcast_to(found, shape)), keys, -(2 ** 63), dtype=DType.I64)
        found = b.reduce_axes("max", below, [axis], True, suffix=f"top{t}")
        position = b.elementwise("max_key_position", found, dtype=DType.I64, suffix="position")
        at = [Affine.constant(0) if a == axis else Affine.dim(a) for a in range(rank)]
        column = b.index_map(position, out_shape, at, guards=(Guard(Affine.dim(axis), lo=t, hi=t + 1),), fill=0,
                             suffix="column")
        indices = column if indices is None else b.elementwise("add", indices, column, dtype=DType.I64)
    return read_at(ctx, x, axis, indices), indices


def _picked(ctx: Context, x: str, dim, place, keepdim: bool):
    """(values, indices) of the element of rank `place` (an int, or an int64 tensor of x's shape
    with `dim` kept at length 1) in each row along `dim`, ascending."""
    b = ctx.b
    shape = b.shape(x)
    if not shape:
        return x, b.fill(0, (), DType.I64)
    axis = dim % len(shape)
    kept = (*shape[:axis], 1, *shape[axis + 1:])
    if isinstance(place, int):
        place = b.fill(place, kept, DType.I64)
    indices = positions_of_places(ctx, ranks(ctx, x, axis, False), place, axis)
    values = read_at(ctx, x, axis, indices)
    if keepdim:
        return values, indices
    others = [k for k in range(len(shape)) if k != axis]
    return b.keep_axes(values, others), b.keep_axes(indices, others)


@lowers("aten.kthvalue.default")
def kthvalue(ctx: Context, x, k, dim=-1, keepdim=False):
    """The k-th smallest (from 1) along `dim`, and its position."""
    return _picked(ctx, x, dim, int(k) - 1, bool(keepdim))


def _nan_count(ctx: Context, x: str, axis: int) -> str:
    return ctx.b.reduce_axes("sum", ctx.b.cast(ctx.b.elementwise("isnan", x), DType.I64), [axis], True,
                             suffix="nans")


@lowers("aten.median.dim", "aten.nanmedian.dim")
def median_dim(ctx: Context, x, dim=-1, keepdim=False):
    """The lower median along `dim` (the element of rank (n-1)//2) and its position. median is NaN,
    at the row's first NaN, where the row holds one; nanmedian takes the median of the numbers
    (NaN where there are none)."""
    shape = ctx.b.shape(x)
    if not shape:
        return _picked(ctx, x, 0, 0, bool(keepdim))
    axis = dim % len(shape)
    return _picked(ctx, x, axis, _median_place(ctx, x, axis), bool(keepdim))


@lowers("aten.median.default", "aten.nanmedian.default")
def median_all(ctx: Context, x):
    """The lower median of every element."""
    flat = ctx.b.reshape(x, (max(ctx.b.type(x).numel, 1),))
    values, _ = _picked(ctx, flat, 0, _median_place(ctx, flat, 0), False)
    return values


def _median_place(ctx: Context, x: str, axis: int):
    """The rank of the median in each row along `axis` (an int where no NaN can move it)."""
    b = ctx.b
    n = b.shape(x)[axis]
    if not b.dtype(x).is_float:
        return (n - 1) // 2
    nans = _nan_count(ctx, x, axis)
    if "nanmedian" in str(ctx.node.target):  # the median of the n - nans numbers; rank 0 (a NaN) if none
        numbers = b.elementwise("subtract", n, nans, dtype=DType.I64)
        return b.elementwise("where", b.elementwise("greater", numbers, 0),
                             b.elementwise("floor_divide", b.elementwise("subtract", numbers, 1), 2), 0,
                             dtype=DType.I64)
    # the first NaN sits at rank n - nans
    return b.elementwise("where", b.elementwise("greater", nans, 0), b.elementwise("subtract", n, nans),
                         (n - 1) // 2, dtype=DType.I64)
