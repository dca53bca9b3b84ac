"""Convolutions and pooling as index maps over windows, then the contraction or reduction they are.

A convolution reads its input through a window map, `x[n, g*Cig + ci, o*stride - pad + k*dilation]`
(per spatial dimension), guarded where the window leaves the input (the guard's fill is the zero
padding), into the space [N, G, Cog, *O, Cig, *K]; the weight is broadcast into the same space;
their product is summed over the trailing (Cig, *K) axes, which the builder merges into one fold.
So a convolution enters the e-graph as the same multiply and sum a matrix product is. A transposed
convolution reads `x[n, c, (o + pad - k*dilation) / stride]` where the division is exact, guarded
on it. Pooling reduces the window axes of the same map: max (fill -inf; indices as the max of
(value, input position) keys), or a sum divided by each window's divisor (a constant table
computed as torch counts it: padding in or out, ceil-mode windows cut at the padded edge, or an
override). Adaptive pooling's windows start at floor(o*I/O) and end at ceil((o+1)*I/O): a guard
on the window axis cuts each at its own end.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from emmy.affine import Affine, Guard
from emmy.decompose.registry import Context, lowers
from emmy.dtypes import DType
from emmy.errors import UnsupportedOpError


@dataclass(frozen=True)
class Window:
    """One spatial dimension of a window map: input extent, output extent, kernel, stride,
    padding (before), dilation."""

    size: int
    out: int
    kernel: int
    stride: int
    pad: int
    dilation: int = 1


def _per_dim(value, dims: int, what: str, ctx: Context) -> tuple[int, ...]:
    values = tuple(int(v) for v in (value if isinstance(value, (list, tuple)) else [value]))
    if len(values) == 1:
        values = values * dims
    if len(values) != dims:
        raise UnsupportedOpError(f"unsupported op {ctx.where}: {what} has {len(values)} values for {dims} "
                                 "spatial dimensions")
    return values


def _window_reads(windows: list[Window], first_out: int, first_tap: int) -> tuple[list[Affine], list[Guard]]:
    """Per spatial dimension, the input position `o*stride + k*dilation - pad` read for output axis
    first_out + i and tap axis first_tap + i, and the guard that keeps it inside the input."""
    at = [Affine.dim(first_out + i) * w.stride + Affine.dim(first_tap + i) * w.dilation - w.pad
          for i, w in enumerate(windows)]
    return at, [Guard(a, 0, w.size) for a, w in zip(at, windows)]


def _window_space(ctx: Context, x: str, lead: int, windows: list[Window], fill) -> str:
    """x [*lead, *I] read into the space [*lead, *O, *K]: each window element of each output position,
    `fill` where the window leaves the input."""
    b = ctx.b
    d = len(windows)
    space = (*b.shape(x)[:lead], *(w.out for w in windows), *(w.kernel for w in windows))
    at, guards = _window_reads(windows, lead, lead + d)
    return b.index_map(x, space, [Affine.dim(i) for i in range(lead)] + at, guards, fill, suffix="window")


def _out_size(size: int, kernel: int, stride: int, pad: int, dilation: int, ceil_mode: bool) -> int:
    span = size + 2 * pad - dilation * (kernel - 1) - 1
    out = (-(-span // stride) if ceil_mode else span // stride) + 1
    if ceil_mode and (out - 1) * stride >= size + pad:  # the last window must start inside the input or its left padding
        out -= 1
    return out


# -- convolution --------------------------------------------------------------------------

@lowers("aten.convolution.default")
def convolution(ctx: Context, x, weight, bias, stride, padding, dilation, transposed, output_padding, groups):
    out = ctx.out_type()
    acc = out.dtype.accumulator
    b = ctx.b
    d = len(b.shape(x)) - 2
    if d < 1 or d > 3:
        raise UnsupportedOpError(f"unsupported op {ctx.where}: a {d}-D convolution (1-D, 2-D and 3-D are taken)")
    stride, padding = _per_dim(stride, d, "stride", ctx), _per_dim(padding, d, "padding", ctx)
    dilation = _per_dim(dilation, d, "dilation", ctx)
    groups = int(groups)
    xf, wf = x, ctx.tensor(weight, acc)  # x is cast after its window map: its loads stay 16-bit where it is
    if transposed:
        product = _transposed_product(ctx, xf, wf, stride, padding, dilation, groups, out.shape)
    else:
        product = _product(ctx, xf, wf, stride, padding, dilation, groups, out.shape)
    n, cout = out.shape[:2]
    total = b.reduce_axes("sum", product, list(range(3 + d, 4 + 2 * d)), False, suffix="sum")  # [N, G, Cog, *O]
    final = acc is out.dtype and bias is None
    total = b.reshape(total, out.shape, name=ctx.name if final else None)
    if bias is not None:
        total = b.elementwise("add", total, b.index_map(ctx.tensor(bias, acc), out.shape, [Affine.dim(1)],
                                                         suffix="bias"), name=ctx.name if acc is out.dtype else None)
    return b.cast(total, out.dtype)


def _product(ctx: Context, x: str, w: str, stride, padding, dilation, groups: int, out_shape) -> str:
    """x through the window map times the weight, in [N, G, Cog, *O, Cig, *K]."""
    b = ctx.b
    n, cin, *sizes = b.shape(x)
    cout, cig, *kernel = b.shape(w)
    d = len(sizes)
    cog = cout // groups
    windows = [Window(sizes[i], out_shape[2 + i], kernel[i], stride[i], padding[i], dilation[i]) for i in range(d)]
    space = (n, groups, cog, *out_shape[2:], cig, *kernel)
    ci = Affine.dim(3 + d)
    at, guards = _window_reads(windows, 3, 4 + d)
    xs = b.index_map(x, space, [Affine.dim(0), Affine.dim(1) * cig + ci, *at], guards, 0.0, suffix="window")
    ws = b.index_map(w, space, [Affine.dim(1) * cog + Affine.dim(2), ci, *(Affine.dim(4 + d + i) for i in range(d))],
                     suffix="weights")
    return b.elementwise("multiply", b.cast(xs, b.dtype(w)), ws, suffix="prod")


def _transposed_product(ctx: Context, x: str, w: str, stride, padding, dilation, groups: int, out_shape) -> str:
    """A transposed convolution: out[n, g*Cog + co, o] = sum over (ci, k) of x[n, g*Cig + ci, i] *
    w[g*Cig + ci, co, k] where o = i*stride - pad + k*dilation, read as i = (o + pad - k*dilation) /
    stride, guarded to exact divisions inside the input."""
    b = ctx.b
    n, cin, *sizes = b.shape(x)
    _, cog, *kernel = b.shape(w)
    d = len(sizes)
    cig = cin // groups
    outs = out_shape[2:]
    space = (n, groups, cog, *outs, cig, *kernel)
    extents = list(space)
    ci = Affine.dim(3 + d)
    index = [Affine.dim(0), Affine.dim(1) * cig + ci]
    guards = []
    for i in range(d):
        reach = Affine.dim(3 + i) + padding[i] - Affine.dim(4 + d + i) * dilation[i]  # i*stride, when exact
        guards += [Guard(reach, 0, None), Guard(reach.mod(stride[i], extents), 0, 1)]
        at = reach.floordiv(stride[i], extents)
        guards.append(Guard(at, 0, sizes[i]))
        index.append(at)
    xs = b.index_map(x, space, index, guards, 0.0, suffix="window")
    ws = b.index_map(w, space, [Affine.dim(1) * cig + ci, Affine.dim(2), *(Affine.dim(4 + d + i) for i in range(d))],
                     suffix="weights")
    return b.elementwise("multiply", b.cast(xs, b.dtype(w)), ws, suffix="prod")


@lowers("aten.col2im.default")
def col2im(ctx: Context, x, output_size, kernel_size, dilation, padding, stride):
    """F.fold, the sum of sliding-window columns back into an image: out[n, c, y, x] = the sum
    over taps (i, j) of x[n, (c*kh + i)*kw + j, block], where the block whose tap (i, j) lands on
    (y, x) is ((y + pad - i*dilation) / stride, ...) when those divide exactly and lie inside the
    grid of blocks (a transposed convolution's reading)."""
    b = ctx.b
    out = ctx.out_type()
    acc = out.dtype.accumulator
    batched = len(b.shape(x)) == 3
    cols = x if batched else b.reshape(x, (1, *b.shape(x)), suffix="batched")
    n, taps, _ = b.shape(cols)
    (kh, kw), (dh, dw), (ph, pw), (sh, sw) = (_per_dim(v, 2, what, ctx) for v, what in (
        (kernel_size, "kernel_size"), (dilation, "dilation"), (padding, "padding"), (stride, "stride")))
    height, width = _per_dim(output_size, 2, "output_size", ctx)
    channels = taps // (kh * kw)
    blocks = [(size + 2 * pad - dil * (k - 1) - 1) // st + 1
              for size, pad, dil, k, st in ((height, ph, dh, kh, sh), (width, pw, dw, kw, sw))]
    space = (n, channels, height, width, kh, kw)
    extents = list(space)
    guards, at = [], []
    for axis, tap, pad, dil, st, count in ((2, 4, ph, dh, sh, blocks[0]), (3, 5, pw, dw, sw, blocks[1])):
        reach = Affine.dim(axis) + pad - Affine.dim(tap) * dil  # block * stride, when exact
        block = reach.floordiv(st, extents)
        guards += [Guard(reach, 0, None), Guard(reach.mod(st, extents), 0, 1), Guard(block, 0, count)]
        at.append(block)
    column = (Affine.dim(1) * kh + Affine.dim(4)) * kw + Affine.dim(5)
    placed = b.index_map(ctx.tensor(cols, acc), space, [Affine.dim(0), column, at[0] * blocks[1] + at[1]], guards,
                         0.0 if acc.is_float else 0, suffix="placed")
    total = b.reduce_axes("sum", placed, [4, 5], False, suffix="folded")
    result = b.cast(total, out.dtype)
    return b.reshape(result, out.shape, name=ctx.name)


# -- pooling ------------------------------------------------------------------------------

def _pool_windows(ctx: Context, x, kernel, stride, padding, dilation, ceil_mode, d: int) -> list[Window]:
    kernel = _per_dim(kernel, d, "kernel_size", ctx)
    stride = _per_dim(stride, d, "stride", ctx) if stride not in (None, [], ()) else kernel
    padding, dilation = _per_dim(padding, d, "padding", ctx), _per_dim(dilation, d, "dilation", ctx)
    sizes = ctx.b.shape(x)[-d:]
    for i in range(d):
        if padding[i] * 2 > kernel[i]:
            raise UnsupportedOpError(f"unsupported op {ctx.where}: padding {padding[i]} is more than half the "
                                     f"kernel {kernel[i]}")
    return [Window(sizes[i], _out_size(sizes[i], kernel[i], stride[i], padding[i], dilation[i], bool(ceil_mode)),
                   kernel[i], stride[i], padding[i], dilation[i]) for i in range(d)]


def _max_pool(ctx: Context, x, windows: list[Window], positions_of_window=None):
    """(values, indices) of a max over each window; indices are flat input positions, as torch's."""
    out = ctx.out_type(0)
    b = ctx.b
    d = len(windows)
    lead = len(b.shape(x)) - d
    window_axes = list(range(lead + d, lead + 2 * d))
    if not b.dtype(x).is_float:
        raise UnsupportedOpError(f"unsupported op {ctx.where}: max pooling of {b.dtype(x)} values (floats are taken)")
    low = -math.inf
    framed = _window_space(ctx, x, lead, windows, low) if positions_of_window is None else positions_of_window(x, low)
    values = b.reduce_axes("max", framed, window_axes, False, name=ctx.name)
    assert b.shape(values) == out.shape
    sizes = [w.size for w in windows]
    flat = ctx.constant(np.arange(math.prod(sizes), dtype=np.int64).reshape(sizes), DType.I64)
    spread = b.index_map(flat, b.shape(x), [Affine.dim(lead + i) for i in range(d)], suffix="positions")
    where = _window_space(ctx, spread, lead, windows, 0) if positions_of_window is None \
        else positions_of_window(spread, 0)
    if not b.dtype(x).fits_f32:  # f64: the least position holding the maximum (or a NaN), a second fold
        kept = b.reshape(values, (*b.shape(values), *[1] * d), suffix="kept")
        hit = b.elementwise("logical_or", b.elementwise("equal", framed, b.broadcast_to(kept, b.shape(framed)),
                                                        dtype=DType.BOOL),
                            b.elementwise("isnan", framed, dtype=DType.BOOL), dtype=DType.BOOL)
        candidates = b.elementwise("where", hit, where, 2 ** 62, dtype=DType.I64, suffix="candidates")
        return values, b.reduce_axes("min", candidates, window_axes, False, suffix="indices")
    # one fold of (value, position) keys: ties go to the first position, NaN wins as torch's does
    keys = b.elementwise("max_key", framed, where, dtype=DType.I64, suffix="key")
    best = b.reduce_axes("max", keys, window_axes, False, suffix="best")
    return values, b.elementwise("max_key_position", best, dtype=DType.I64, suffix="indices")


@lowers("aten.max_pool2d_with_indices.default", "aten.max_pool3d_with_indices.default")
def max_pool(ctx: Context, x, kernel_size, stride=(), padding=0, dilation=1, ceil_mode=False):
    d = 3 if "3d" in str(ctx.node.target) else 2
    return _max_pool(ctx, x, _pool_windows(ctx, x, kernel_size, stride, padding, dilation, ceil_mode, d))


@lowers("aten.avg_pool2d.default", "aten.avg_pool3d.default")
def avg_pool(ctx: Context, x, kernel_size, stride=(), padding=0, ceil_mode=False, count_include_pad=True,
             divisor_override=None):
    d = 3 if "3d" in str(ctx.node.target) else 2
    windows = _pool_windows(ctx, x, kernel_size, stride, padding, 1, ceil_mode, d)
    if divisor_override is not None and int(divisor_override) <= 0:
        raise UnsupportedOpError(f"unsupported op {ctx.where}: divisor_override must be positive, "
                                 f"got {divisor_override}")
    counts = np.ones([w.out for w in windows], dtype=np.float64)
    for i, w in enumerate(windows):
        start = np.arange(w.out) * w.stride - w.pad
        end = np.minimum(start + w.kernel, w.size + w.pad)  # a ceil-mode window stops at the padded edge
        span = end - start if count_include_pad else np.minimum(end, w.size) - np.maximum(start, 0)
        counts = counts * span.reshape([-1 if j == i else 1 for j in range(d)])
    if divisor_override is not None:
        counts = np.full(counts.shape, float(divisor_override))
    return _window_mean(ctx, x, windows, counts, lambda space: _window_space(ctx, space, len(ctx.b.shape(x)) - d,
                                                                             windows, 0.0))


def _window_mean(ctx: Context, x, windows: list[Window], counts: np.ndarray, framed) -> str:
    out = ctx.out_type()
    acc = out.dtype.accumulator
    b = ctx.b
    d = len(windows)
    lead = len(b.shape(x)) - d
    total = b.reduce_axes("sum", framed(ctx.tensor(x, acc)), list(range(lead + d, lead + 2 * d)), False, suffix="sum")
    divisor = b.index_map(ctx.constant(counts, acc), out.shape, [Affine.dim(lead + i) for i in range(d)],
                          suffix="divisor")
    mean = b.elementwise("divide", total, divisor, name=ctx.name if acc is out.dtype else None)
    return b.cast(mean, out.dtype)


def _adaptive_windows(ctx: Context, x, output_size, d: int):
    """Per spatial dimension: (input extent, output extent, the longest window)."""
    sizes = ctx.b.shape(x)[-d:]
    outs = [int(o) if o is not None else s for o, s in zip(_per_dim(output_size, d, "output_size", ctx), sizes)]
    spans = []
    for size, n_out in zip(sizes, outs):
        o = np.arange(n_out)
        spans.append(((o * size) // n_out, -((-(o + 1) * size) // n_out)))  # [start, end) of each window
    return sizes, outs, spans


def _adaptive_space(ctx: Context, x, d: int, sizes, outs, spans, fill) -> str:
    """x [*lead, *I] into [*lead, *O, *Kmax]: window element k of output o reads start(o) + k while
    start(o) + k < end(o)."""
    b = ctx.b
    lead = len(b.shape(x)) - d
    kmax = [int(np.max(end - start)) for start, end in spans]
    space = (*b.shape(x)[:lead], *outs, *kmax)
    extents = list(space)
    index, guards = [Affine.dim(i) for i in range(lead)], []
    for i, (size, n_out) in enumerate(zip(sizes, outs)):
        o, k = Affine.dim(lead + i), Affine.dim(lead + d + i)
        start = (o * size).floordiv(n_out, extents)
        end = (o * size + size + n_out - 1).floordiv(n_out, extents)
        index.append(start + k)
        guards.append(Guard(start + k - end, None, 0))
    return b.index_map(x, space, index, guards, fill, suffix="window")


@lowers("aten._adaptive_avg_pool2d.default", "aten._adaptive_avg_pool3d.default")
def adaptive_avg_pool(ctx: Context, x, output_size):
    d = 3 if "3d" in str(ctx.node.target) else 2
    sizes, outs, spans = _adaptive_windows(ctx, x, output_size, d)
    counts = np.ones(outs, dtype=np.float64)
    for i, (start, end) in enumerate(spans):
        counts = counts * (end - start).reshape([-1 if j == i else 1 for j in range(d)])
    windows = [Window(s, o, int(np.max(e - st)), 1, 0) for s, o, (st, e) in zip(sizes, outs, spans)]
    return _window_mean(ctx, x, windows, counts, lambda v: _adaptive_space(ctx, v, d, sizes, outs, spans, 0.0))


@lowers("aten.adaptive_max_pool2d.default", "aten.adaptive_max_pool3d.default")
def adaptive_max_pool(ctx: Context, x, output_size):
    d = 3 if "3d" in str(ctx.node.target) else 2
    sizes, outs, spans = _adaptive_windows(ctx, x, output_size, d)
    windows = [Window(s, o, int(np.max(e - st)), 1, 0) for s, o, (st, e) in zip(sizes, outs, spans)]
    return _max_pool(ctx, x, windows, lambda v, fill: _adaptive_space(ctx, v, d, sizes, outs, spans, fill))
