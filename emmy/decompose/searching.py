"""Searches of sorted boundaries: bucketize and searchsorted, as counts; histc and histogram, counts
(or weights) per bin.

torch binary-searches each value; emmy counts the boundaries the value passes, a fold over the
boundaries (O(values x boundaries) work, every count independent), which gives the same index for
sorted boundaries: with right=False (side "left") the number of boundaries b with not b >= x, with
right=True the number with not b > x. Written with `not`, a NaN value passes every boundary and
lands after the last, as torch's search puts it.
"""

from __future__ import annotations

from emmy.affine import Affine
from emmy.decompose.indexing import gathered_index
from emmy.decompose.registry import Context, lowers
from emmy.dtypes import DType, to_torch
from emmy.errors import UnsupportedOpError


def _count_passed(ctx: Context, values: str, boundaries: str, right: bool, name: str | None) -> str:
    """out[..., i] = the boundaries (along the last axis of `boundaries`, whose other axes broadcast
    against `values`' leading ones) that values[..., i] passes."""
    b = ctx.b
    out = ctx.out_type()
    dtype = ctx.promoted(*ctx.node.args[:2])  # the type torch compares the two in
    count = b.shape(boundaries)[-1]
    shape = (*b.shape(values), count)
    lead = b.shape(boundaries)[:-1]  # per row of values, or (1-D) one sequence for every value
    along = b.reshape(boundaries, (*lead, 1, count), suffix="boundaries") if lead else boundaries
    stands = ctx.tensor(along, dtype, shape)
    value = ctx.tensor(b.reshape(values, (*b.shape(values), 1), suffix="value"), dtype, shape)
    blocks = b.elementwise("greater" if right else "greater_equal", stands, value, dtype=DType.BOOL, suffix="blocks")
    passed = b.cast(b.elementwise("logical_not", blocks, dtype=DType.BOOL, suffix="passed"), out.dtype)
    return b.reduce_axes("sum", passed, [len(shape) - 1], False, name=name)


@lowers("aten.bucketize.Tensor")
def bucketize(ctx: Context, x, boundaries, *, out_int32=False, right=False):
    if len(ctx.b.shape(boundaries)) != 1:
        raise UnsupportedOpError(f"unsupported op {ctx.where}: boundaries must be one-dimensional, as torch requires")
    if ctx.b.shape(x):
        return _count_passed(ctx, x, boundaries, bool(right), ctx.name)
    one = _count_passed(ctx, ctx.b.reshape(x, (1,)), boundaries, bool(right), None)  # a rank-0 value
    return ctx.b.reshape(one, (), name=ctx.name)


@lowers("aten.searchsorted.Tensor")
def searchsorted(ctx: Context, sorted_sequence, values, *, out_int32=False, right=False, side=None, sorter=None):
    right = side == "right" if side is not None else bool(right)
    sequence_shape, value_shape = ctx.b.shape(sorted_sequence), ctx.b.shape(values)
    if sorter is not None:  # the sequence read in sorter's order is the sorted one
        at = [Affine.dim(k) for k in range(len(sequence_shape))]
        order = gathered_index(ctx, sorter, at, sequence_shape[-1], sequence_shape, "searchsorted sorter")
        sorted_sequence = ctx.b.index_map(sorted_sequence, sequence_shape, [*at[:-1], order], suffix="sorted")
    if len(sequence_shape) > 1 and sequence_shape[:-1] != value_shape[:-1]:
        raise UnsupportedOpError(f"unsupported op {ctx.where}: a sorted sequence of shape {list(sequence_shape)} "
                                 f"for values of shape {list(value_shape)} (their leading axes must match)")
    return _count_passed(ctx, values, sorted_sequence, right, ctx.name)


@lowers("aten.histc.default")
def histc(ctx: Context, x, bins=100, min=0, max=0):
    """Counts of x's elements in `bins` equal bins over [min, max] (the data's own extremes where
    min == max, widened by 1 each way where those are equal too), as torch's CPU kernel bins them:
    (x - min) * bins / (max - min) truncated, max itself in the last bin, elements outside not
    counted. A count for every bin and element: O(bins x elements) work."""
    import numpy as np

    b = ctx.b
    out = ctx.out_type()
    dtype = out.dtype
    count = b.type(x).numel
    flat = b.reshape(ctx.tensor(x, dtype), (count,), suffix="flat")
    if min == max:
        lowest = b.reduce("min", flat, 0, suffix="lowest")
        highest = b.reduce("max", flat, 0, suffix="highest")
        same = b.elementwise("equal", lowest, highest, dtype=DType.BOOL, suffix="same")
        lo = b.elementwise("where", same, b.elementwise("subtract", lowest, 1.0), lowest, dtype=dtype, suffix="lo")
        hi = b.elementwise("where", same, b.elementwise("add", highest, 1.0), highest, dtype=dtype, suffix="hi")
        lo, hi = ctx.tensor(lo, dtype, (count,)), ctx.tensor(hi, dtype, (count,))
    else:
        lo, hi = float(min), float(max)
    scaled = b.elementwise("multiply", b.elementwise("subtract", flat, lo, dtype=dtype), float(bins), dtype=dtype)
    width = b.elementwise("subtract", hi, lo, dtype=dtype) if isinstance(lo, str) else hi - lo
    position = b.cast(b.elementwise("divide", scaled, width, dtype=dtype, suffix="position"), DType.I64)
    position = b.elementwise("minimum", position, bins - 1, dtype=DType.I64, suffix="bin")  # max: the last bin
    inside = b.elementwise("logical_and", b.elementwise("greater_equal", flat, lo, dtype=DType.BOOL),
                           b.elementwise("less_equal", flat, hi, dtype=DType.BOOL), dtype=DType.BOOL, suffix="inside")
    grid = (int(bins), count)
    here = b.index_map(ctx.constant(np.arange(bins), DType.I64), grid, [Affine.dim(0)], suffix="bins")
    hits = b.elementwise("logical_and", b.elementwise("equal", ctx.tensor(position, DType.I64, grid), here,
                                                      dtype=DType.BOOL),
                         ctx.tensor(inside, DType.BOOL, grid), dtype=DType.BOOL, suffix="hits")
    counts = b.reduce_axes("sum", b.cast(hits, DType.I64), [1], False, suffix="counts")
    return b.cast(counts, dtype)


@lowers("aten.histogram.bin_ct", "aten.histogram.bins_tensor")
def histogram(ctx: Context, x, bins=100, *, range=None, weight=None, density=False):
    """(hist, bin_edges) as torch.histogram: x read flat; `bins` equal bins over `range` (the data's
    extremes without one, widened by 0.5 each way where those are equal) with edges as torch's
    linspace computes them, or the given edges. An element's bin is the number of inner edges at or
    below it (what torch's search finds; the last edge belongs to the last bin), elements outside
    the edges are not counted; each adds its weight (else 1); density divides by the total times
    the bin's width. O(bins x elements) work."""
    import numpy as np
    import torch

    b = ctx.b
    hist_type, edges_type = ctx.out_type(0), ctx.out_type(1)
    dtype = hist_type.dtype
    count = b.type(x).numel
    flat = b.reshape(ctx.tensor(x, dtype), (count,), suffix="flat")
    if isinstance(bins, str):  # the edges themselves
        edges = ctx.tensor(bins, dtype)
    elif range is not None:
        values = torch.linspace(float(range[0]), float(range[1]), int(bins) + 1, dtype=to_torch(dtype))
        edges = ctx.constant(values.double().numpy(), dtype)
    else:
        edges = _data_edges(ctx, flat, int(bins), dtype)
    inner = edges_type.shape[0] - 2  # the edges between bins
    grid = (count, inner)
    passed = b.elementwise("logical_not", b.elementwise(
        "greater", b.index_map(edges, grid, [Affine.dim(1) + 1], suffix="inner"),
        ctx.tensor(b.reshape(flat, (count, 1)), dtype, grid), dtype=DType.BOOL), dtype=DType.BOOL, suffix="passed")
    position = b.reduce_axes("sum", b.cast(passed, DType.I64), [1], False, suffix="bin") if inner else \
        ctx.tensor(ctx.constant(np.zeros((1,)), DType.I64), shape=(count,))
    first = b.index_map(edges, (count,), [Affine.constant(0)], suffix="first")
    last = b.index_map(edges, (count,), [Affine.constant(inner + 1)], suffix="last")
    inside = b.elementwise("logical_and", b.elementwise("greater_equal", flat, first, dtype=DType.BOOL),
                           b.elementwise("less_equal", flat, last, dtype=DType.BOOL), dtype=DType.BOOL, suffix="inside")
    table = (inner + 1, count)
    here = b.index_map(ctx.constant(np.arange(inner + 1), DType.I64), table, [Affine.dim(0)], suffix="bins")
    hits = b.elementwise("logical_and", b.elementwise("equal", ctx.tensor(position, DType.I64, table), here,
                                                      dtype=DType.BOOL),
                         ctx.tensor(inside, DType.BOOL, table), dtype=DType.BOOL, suffix="hits")
    each = 1.0 if weight is None else ctx.tensor(b.reshape(ctx.tensor(weight, dtype), (count,)), dtype, table)
    zero = ctx.tensor(ctx.constant(np.zeros(()), dtype), shape=table)
    hist = b.reduce_axes("sum", b.elementwise("where", hits, each, zero, dtype=dtype), [1], False, suffix="hist")
    if density:
        total = ctx.tensor(b.reduce("sum", hist, 0, suffix="total"), dtype, (inner + 1,))
        widths = b.elementwise("subtract", b.index_map(edges, (inner + 1,), [Affine.dim(0) + 1]),
                               b.index_map(edges, (inner + 1,), [Affine.dim(0)]), dtype=dtype, suffix="widths")
        hist = b.elementwise("divide", hist, b.elementwise("multiply", total, widths, dtype=dtype), dtype=dtype)
    return hist, ctx.tensor(edges, edges_type.dtype)


def _data_edges(ctx: Context, flat: str, bins: int, dtype: DType) -> str:
    """torch.linspace(min, max, bins + 1) over the data's extremes (each moved 0.5 out where they
    are equal), computed as torch's CPU linspace does: the first half of the edges as min + step * k,
    the rest as max - step * (bins - k), with step = (max - min) / bins."""
    import numpy as np

    b = ctx.b
    shape = (bins + 1,)
    lowest = b.reduce("min", flat, 0, suffix="lowest")
    highest = b.reduce("max", flat, 0, suffix="highest")
    same = b.elementwise("equal", lowest, highest, dtype=DType.BOOL, suffix="same")
    lo = b.elementwise("where", same, b.elementwise("subtract", lowest, 0.5), lowest, dtype=dtype, suffix="lo")
    hi = b.elementwise("where", same, b.elementwise("add", highest, 0.5), highest, dtype=dtype, suffix="hi")
    step = ctx.tensor(b.elementwise("divide", b.elementwise("subtract", hi, lo, dtype=dtype), float(bins),
                                    dtype=dtype, suffix="step"), dtype, shape)
    lo, hi = ctx.tensor(lo, dtype, shape), ctx.tensor(hi, dtype, shape)
    k = np.arange(bins + 1)
    up = b.elementwise("add", lo, b.elementwise("multiply", step, ctx.constant(k, dtype), dtype=dtype), dtype=dtype)
    down = b.elementwise("subtract", hi, b.elementwise("multiply", step, ctx.constant(bins - k, dtype), dtype=dtype),
                         dtype=dtype)
    return b.elementwise("where", ctx.constant(k < (bins + 1) // 2, DType.BOOL), up, down, dtype=dtype, suffix="edges")
