"""Reductions: sum, mean, amax/amin, max/min, prod, var/std.

Half-precision inputs accumulate in float32 and round once at the end.
"""

from __future__ import annotations

from emmy.decompose.registry import Context, lowers
from emmy.dtypes import DType
from emmy.errors import UnsupportedOpError


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


class IndicesUnsupported:
    """The indices half of max.dim/min.dim: an error if anything reads it."""

    def __init__(self, where: str):
        self.where = where


@lowers("aten.max.dim", "aten.min.dim")
def max_dim(ctx: Context, x, dim, keepdim=False):
    op = "max" if ".max." in str(ctx.node.target) else "min"
    out = ctx.out_type(0)
    values = ctx.b.reduce_axes(op, x, [dim], keepdim, name=ctx.name)
    assert ctx.b.shape(values) == out.shape
    return (values, IndicesUnsupported(ctx.where))


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
    """sum((x - mean)^2) / (N - correction), keeping the reduced axes when asked."""
    b = ctx.b
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


@lowers("aten.argmax.default", "aten.argmin.default")
def argmax(ctx: Context, *args, **kwargs):
    raise UnsupportedOpError(f"unsupported op {ctx.where}: reductions that return indices")


@lowers("aten.linalg_vector_norm.default")
def vector_norm(ctx: Context, x, ord=2, dim=None, keepdim=False, dtype=None):
    """(sum |x|^p)^(1/p) over `dim`; max |x| for ord=inf, min |x| for -inf, the nonzero count for 0."""
    import math

    out = ctx.out_type()
    acc = out.dtype.accumulator
    b = ctx.b
    magnitude = b.elementwise("abs", ctx.tensor(x, acc), suffix="abs")
    axes = _axes(ctx, x, dim)
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
    return b.cast(result, out.dtype)
