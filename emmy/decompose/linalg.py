"""Matrix products as Tensor IR: sum(a[..,i,j,_] * b[..,_,j,k], axis=j).

Both operands are cast to the accumulator type (f32 for half inputs) and
broadcast by index maps into one [.., M, K, N] space; the product is summed
over K and an index map drops the reduced axis.
"""

from __future__ import annotations

from emmy.affine import Affine
from emmy.decompose.indexing import gathered_index
from emmy.decompose.registry import Context, lowers
from emmy.dtypes import DType
from emmy.errors import UnsupportedOpError


def matmul(ctx: Context, a: str, b: str, name: str | None) -> str:
    """Batched a[..., M, K] @ b[..., K, N] with equal batch shapes, in the accumulator type."""
    return product_of(ctx, a, b, ctx.out_type().dtype.accumulator, name)


def product_of(ctx: Context, a: str, b: str, acc: DType, name: str | None = None) -> str:
    """Batched a[..., M, K] @ b[..., K, N] with equal batch shapes, in `acc`."""
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


@lowers("aten.mm.default", "aten.bmm.default", "aten._int_mm.default")
def mm(ctx: Context, a, b):
    """a @ b; _int_mm's int8 operands are widened to its int32 result, the sum's type."""
    out = ctx.out_type()
    final = out.dtype.accumulator is out.dtype
    return ctx.b.cast(matmul(ctx, a, b, ctx.name if final else None), out.dtype)


@lowers("aten._weight_int8pack_mm.default")
def weight_int8pack_mm(ctx: Context, x, weight, scales):
    """x[M, K] @ weight[N, K].T * scales[N]: a linear layer with int8 weights and a scale per
    output channel (gpt-fast's weight-only quantization on CPU). In f32 throughout with one rounding
    to x's type at the end, as torch's CPU kernel computes it."""
    bld = ctx.b
    out = ctx.out_type()
    acc = DType.F32 if out.dtype is not DType.F64 else DType.F64
    product = product_of(ctx, x, bld.permute(weight, (1, 0), suffix="weight_t"), acc)
    per_column = bld.index_map(ctx.tensor(scales, acc), out.shape, [Affine.dim(1)], suffix="scales")
    return bld.cast(bld.elementwise("multiply", product, per_column), out.dtype)


@lowers("aten._grouped_mm.default", "transformers.grouped_mm_fallback.default")
def grouped_mm(ctx: Context, a, b, offs=None, bias=None, out_dtype=None):
    """A mixture of experts' products: each row a[s] of an (S, K) input, its rows sorted by group,
    times its group's matrix of a (G, K, N) stack, `offs` (G,) the groups' cumulative row ends.
    The group of row s is the number of ends at or before it (a count over the G ends, as
    searchsorted with right=True counts), gathered into the stack's first index. A row past the last
    end belongs to no group and is 0 (transformers' fallback leaves it zero; torch's kernel leaves it
    unspecified). (B, M, K) @ (B, K, N) without `offs` is a batched product. Transformers' own op
    (`transformers::grouped_mm_fallback`, its MoE layers' route where torch's kernel is not used)
    computes the same, so it is decomposed here too rather than refused as an unknown op."""
    import numpy as np

    bld = ctx.b
    out = ctx.out_type()
    acc = out.dtype.accumulator
    a_shape, b_shape = bld.shape(a), bld.shape(b)
    if offs is None and len(a_shape) == 3 and len(b_shape) == 3 and bias is None:
        return bld.cast(matmul(ctx, a, b, None), out.dtype)
    if offs is None or len(a_shape) != 2 or len(b_shape) != 3:
        raise UnsupportedOpError(f"unsupported op {ctx.where}: a grouped product of shapes {list(a_shape)} and "
                                 f"{list(b_shape)}{' without offsets' if offs is None else ''} (emmy takes (S, K) rows "
                                 "grouped by offsets times a (G, K, N) stack, or (B, M, K) @ (B, K, N))")
    (rows, k), (groups, _, n) = a_shape, b_shape
    positions = bld.reshape(ctx.constant(np.arange(rows, dtype=np.float64), DType.I64), (rows, 1), suffix="row")
    ends = bld.reshape(ctx.tensor(offs, DType.I64), (1, groups), suffix="ends")
    passed = bld.elementwise("less_equal", ctx.tensor(ends, DType.I64, (rows, groups)),
                             ctx.tensor(positions, DType.I64, (rows, groups)), dtype=DType.BOOL, suffix="passed")
    group = bld.reduce_axes("sum", bld.cast(passed, DType.I64), [1], False, suffix="group")  # 0 .. G (G: past the last end)
    inside = bld.elementwise("less", group, groups, dtype=DType.BOOL, suffix="grouped")
    clamped = bld.elementwise("minimum", group, groups - 1, dtype=DType.I64, suffix="expert")
    which = gathered_index(ctx, clamped, [Affine.dim(0)], groups, (rows, k, n), "grouped_mm group")
    space = (rows, k, n)
    a_b = bld.index_map(ctx.tensor(a, acc), space, [Affine.dim(0), Affine.dim(1)], suffix="a")
    b_b = bld.index_map(ctx.tensor(b, acc), space, [which, Affine.dim(1), Affine.dim(2)], suffix="b")
    product = bld.reduce_axes("sum", bld.elementwise("multiply", a_b, b_b, suffix="prod"), [1], False, suffix="sum")
    if bias is not None:
        row_bias = bld.index_map(ctx.tensor(bias, acc), (rows, n), [which, Affine.dim(1)], suffix="bias")
        product = bld.elementwise("add", product, row_bias, suffix="biased")
    kept = bld.elementwise("where", ctx.tensor(bld.reshape(inside, (rows, 1), suffix="grouped_row"), DType.BOOL,
                                               (rows, n)), product, 0.0, dtype=acc, suffix="rows")
    return bld.cast(kept, out.dtype)


@lowers("aten.addmm.default", "aten._sparse_addmm.default")
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
