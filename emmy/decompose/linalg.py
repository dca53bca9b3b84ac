"""Matrix products as Tensor IR: sum(a[..,i,j,_] * b[..,_,j,k], axis=j).

Both operands are cast to the accumulator type (f32 for half inputs) and
broadcast by index maps into one [.., M, K, N] space; the product is summed
over K and an index map drops the reduced axis.
"""

from __future__ import annotations

from emmy.affine import Affine
from emmy.decompose.registry import Context, lowers


def matmul(ctx: Context, a: str, b: str, name: str | None) -> str:
    """Batched a[..., M, K] @ b[..., K, N] with equal batch shapes, in the accumulator type."""
    out = ctx.out_type()
    acc = out.dtype.accumulator
    bld = ctx.b
    a_shape, b_shape = bld.shape(a), bld.shape(b)
    batch = a_shape[:-2]
    m, k = a_shape[-2:]
    n = b_shape[-1]
    nb = len(batch)
    space = batch + (m, k, n)
    batch_index = [Affine.dim(i) for i in range(nb)]
    a_b = bld.index_map(ctx.tensor(a, acc), space, batch_index + [Affine.dim(nb), Affine.dim(nb + 1)], suffix="a")
    b_b = bld.index_map(ctx.tensor(b, acc), space, batch_index + [Affine.dim(nb + 1), Affine.dim(nb + 2)], suffix="b")
    prod = bld.elementwise("multiply", a_b, b_b, suffix="prod")
    total = bld.reduce("sum", prod, nb + 1, suffix="sum")
    return bld.keep_axes(total, [i for i in range(nb + 3) if i != nb + 1], name=name)


@lowers("aten.mm.default", "aten.bmm.default")
def mm(ctx: Context, a, b):
    out = ctx.out_type()
    final = out.dtype.accumulator is out.dtype
    return ctx.b.cast(matmul(ctx, a, b, ctx.name if final else None), out.dtype)


@lowers("aten.addmm.default")
def addmm(ctx: Context, bias, a, b, beta=1, alpha=1):
    return _scaled_sum(ctx, matmul(ctx, a, b, None), bias, beta, alpha)


@lowers("aten.addmv.default")
def addmv(ctx: Context, bias, mat, vec, beta=1, alpha=1):
    """beta*bias + alpha*(mat @ vec): the vector as a one-column matrix."""
    bld = ctx.b
    column = bld.reshape(vec, (bld.shape(vec)[0], 1), suffix="column")
    product = bld.reshape(matmul(ctx, mat, column, None), ctx.out_type().shape, suffix="vector")
    return _scaled_sum(ctx, product, bias, beta, alpha)


@lowers("aten.addbmm.default")
def addbmm(ctx: Context, bias, a, b, beta=1, alpha=1):
    """beta*bias + alpha*sum over the batch of a[i] @ b[i]."""
    product = ctx.b.reduce_axes("sum", matmul(ctx, a, b, None), [0], False, suffix="batch_sum")
    return _scaled_sum(ctx, product, bias, beta, alpha)


def _scaled_sum(ctx: Context, product: str, bias, beta, alpha) -> str:
    """beta*bias + alpha*product, cast to the output type; with beta 0 the bias is not read
    (torch's rule: its NaNs and infinities do not reach the result)."""
    out = ctx.out_type()
    acc = out.dtype.accumulator
    bld = ctx.b
    if alpha != 1:
        product = bld.elementwise("multiply", product, alpha, suffix="alpha")
    if beta == 0:
        return bld.cast(ctx.tensor(product, acc, out.shape), out.dtype)
    shift = ctx.tensor(bias, acc, out.shape)
    if beta != 1:
        shift = bld.elementwise("multiply", shift, beta, suffix="beta")
    total = bld.elementwise("add", product, shift, name=ctx.name if acc is out.dtype else None)
    return bld.cast(total, out.dtype)


@lowers("aten._trilinear.default")
def trilinear(ctx: Context, i1, i2, i3, expand1, expand2, expand3, sumdim, unroll_dim=1):
    """sum over `sumdim` of the three inputs' product, each with size-1 axes inserted at its
    `expand` positions (nn.Bilinear: x1[b, _, i, _] * W[_, o, i, j] * x2[b, _, _, j] summed over i, j)."""
    out = ctx.out_type()
    acc = out.dtype.accumulator
    bld = ctx.b
    spread = []
    for value, inserted in ((i1, expand1), (i2, expand2), (i3, expand3)):
        shape = list(bld.shape(value))
        for axis in sorted(inserted):
            shape.insert(axis, 1)
        spread.append(bld.reshape(value, shape, suffix="spread"))
    rank = len(bld.shape(spread[0]))
    full = tuple(max(bld.shape(s)[k] for s in spread) for k in range(rank))
    product = bld.elementwise("multiply", ctx.tensor(spread[0], acc, full), ctx.tensor(spread[1], acc, full), suffix="prod")
    product = bld.elementwise("multiply", product, ctx.tensor(spread[2], acc, full), suffix="prod")
    total = bld.reduce_axes("sum", product, sorted(sumdim), False, name=ctx.name if acc is out.dtype else None)
    return bld.cast(total, out.dtype)
