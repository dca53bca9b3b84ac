"""View and copy ops as index maps: view/reshape, permute, expand, squeeze,
unsqueeze, slice, select, split and cat."""

from __future__ import annotations

from emmy.affine import Affine, Guard
from emmy.decompose.registry import Context, lowers
from emmy.dtypes import DType
from emmy.errors import UnsupportedOpError


@lowers("aten.view.default", "aten._unsafe_view.default", "aten.reshape.default")
def view(ctx: Context, x, shape):
    return ctx.b.reshape(x, ctx.out_type().shape, name=ctx.name)


@lowers("aten.permute.default")
def permute(ctx: Context, x, dims):
    return ctx.b.permute(x, dims, name=ctx.name)


@lowers("aten.transpose.int")
def transpose(ctx: Context, x, dim0, dim1):
    rank = len(ctx.b.shape(x))
    perm = list(range(rank))
    perm[dim0 % rank], perm[dim1 % rank] = perm[dim1 % rank], perm[dim0 % rank]
    return ctx.b.permute(x, perm, name=ctx.name)


@lowers("aten.t.default")
def t(ctx: Context, x):
    rank = len(ctx.b.shape(x))
    return ctx.b.permute(x, list(reversed(range(rank))), name=ctx.name)


@lowers("aten.expand.default")
def expand(ctx: Context, x, sizes, implicit=False):
    return ctx.b.broadcast_to(x, ctx.out_type().shape)


@lowers("aten.unsqueeze.default", "aten.squeeze.dims", "aten.squeeze.dim", "aten.squeeze.default")
def squeeze(ctx: Context, x, *dims):
    return ctx.b.reshape(x, ctx.out_type().shape, name=ctx.name)


@lowers("aten.slice.Tensor")
def slice_(ctx: Context, x, dim=0, start=None, end=None, step=1):
    return ctx.b.slice(x, dim, start, end, step, name=ctx.name)


@lowers("aten.narrow.default")
def narrow(ctx: Context, x, dim, start, length):
    extent = ctx.b.shape(x)[dim]
    start = start + extent if start < 0 else start
    return ctx.b.slice(x, dim, start, start + length, 1, name=ctx.name)


@lowers("aten.unbind.int")
def unbind(ctx: Context, x, dim=0):
    return tuple(ctx.b.select(x, dim, k, suffix=f"part{k}") for k in range(ctx.b.shape(x)[dim]))


@lowers("aten.select.int")
def select(ctx: Context, x, dim, index):
    return ctx.b.select(x, dim, index, name=ctx.name)


@lowers("aten.split_with_sizes.default", "aten.split.Tensor")
def split(ctx: Context, x, sizes, dim=0):
    extent = ctx.b.shape(x)[dim]
    if isinstance(sizes, int):
        sizes = [sizes] * (extent // sizes) + ([extent % sizes] if extent % sizes else [])
    parts, start = [], 0
    for size in sizes:
        parts.append(ctx.b.slice(x, dim, start, start + size, 1, suffix=f"part{len(parts)}"))
        start += size
    return tuple(parts)


@lowers("aten.cat.default")
def cat(ctx: Context, tensors, dim=0):
    out = ctx.out_type()
    rank = len(out.shape)
    # torch allows empty 1-d tensors in cat; they contribute nothing.
    pieces = [ctx.tensor(t, out.dtype) for t in tensors if len(ctx.b.shape(t)) == rank and ctx.b.shape(t)[dim % rank]]
    return joined(ctx.b, pieces, out.shape, dim % rank, out.dtype, ctx.name)


def joined(b, pieces: list, shape: tuple, dim: int, dtype: DType, name: str):
    """`pieces` (of `dtype`, none empty along `dim`) one after another along `dim`: one guarded read
    of each, selected by where its part lies."""
    rank = len(shape)
    result = None
    start = 0
    for k, piece in enumerate(pieces):
        size = b.shape(piece)[dim]
        within = Guard(Affine.dim(dim), lo=start, hi=start + size)
        index = [Affine.dim(a) if a != dim else Affine.dim(a) - start for a in range(rank)]
        value = b.index_map(piece, shape, index, guards=(within,), fill=0, suffix=f"part{k}")
        if result is None:
            result = value
        else:
            # Select, not add: the fill of one part must never touch another's values.
            mask = b.index_map(b.const(True, DType.BOOL), shape, (), guards=(within,), fill=False,
                               suffix=f"in_part{k}")
            last = k == len(pieces) - 1
            result = b.elementwise("where", mask, value, result, dtype=dtype, name=name if last else None)
        start += size
    return result


@lowers("aten.constant_pad_nd.default")
def constant_pad(ctx: Context, x, pad, value=0):
    """F.pad with a constant: `pad` holds (before, after) pairs from the last dimension back; a negative
    amount crops. One guarded index map: the value outside the input."""
    out = ctx.out_type()
    shape = ctx.b.shape(x)
    rank = len(shape)
    if len(pad) % 2 or len(pad) // 2 > rank:
        raise UnsupportedOpError(f"unsupported op {ctx.where}: pad has {len(pad)} values for a rank-{rank} tensor")
    before = [0] * rank
    for i in range(len(pad) // 2):
        before[rank - 1 - i] = int(pad[2 * i])
    index = [Affine.dim(k) - before[k] for k in range(rank)]
    guards = [Guard(index[k], 0, shape[k]) for k in range(rank) if before[k] > 0 or out.shape[k] - before[k] > shape[k]]
    return ctx.b.index_map(x, out.shape, index, guards, value, name=ctx.name)


@lowers("aten.reflection_pad1d.default", "aten.reflection_pad2d.default", "aten.reflection_pad3d.default",
        "aten.replication_pad1d.default", "aten.replication_pad2d.default", "aten.replication_pad3d.default")
def edge_pad(ctx: Context, x, padding):
    """Reflection (x[1], x[0], x[1], ...) or replication (x[0], x[0], ...) padding of the last
    dimensions, `padding` as (before, after) pairs from the last dimension back: per padded
    dimension, three index maps (before, inside, after), each affine, joined by selects as cat is."""
    reflect = "reflection" in str(ctx.node.target)
    b = ctx.b
    rank = len(b.shape(x))
    pairs = [(int(padding[2 * i]), int(padding[2 * i + 1])) for i in range(len(padding) // 2)]
    out = x
    for i, (before, after) in enumerate(pairs):
        dim = rank - 1 - i
        n = b.shape(out)[dim]
        if reflect and (before >= n or after >= n):
            raise UnsupportedOpError(f"unsupported op {ctx.where}: reflection padding {max(before, after)} must be "
                                     f"less than the dimension's size {n}")
        shape = tuple(s + (before + after if k == dim else 0) for k, s in enumerate(b.shape(out)))
        d = Affine.dim(dim)
        # where output position d reads: before the input, inside it, after it; each read's guard is
        # written on the index it reads (the same region), so the bounds proof sees it in range
        if reflect:
            left, right = Affine.constant(before) - d, Affine.constant(2 * n - 2 + before) - d
            reads = [(left, Guard(left, 1, None)), (d - before, Guard(d - before, 0, n)), (right, Guard(right, None, n - 1))]
        else:
            reads = [(Affine.constant(0), Guard(d, 0, before)), (d - before, Guard(d - before, 0, n)),
                     (Affine.constant(n - 1), Guard(d, before + n, None))]
        regions = [Guard(d, 0, before), Guard(d, before, before + n), Guard(d, before + n, None)]
        result = None
        for k, (within, (at, reading)) in enumerate(zip(regions, reads)):
            index = [Affine.dim(a) if a != dim else at for a in range(rank)]
            value = b.index_map(out, shape, index, (reading,), 0, suffix=f"edge{k}")
            if result is None:
                result = value
                continue
            mask = b.index_map(b.const(True, DType.BOOL), shape, (), guards=(within,), fill=False, suffix=f"in_edge{k}")
            last = k == len(regions) - 1 and i == len(pairs) - 1
            result = b.elementwise("where", mask, value, result, dtype=b.dtype(out), name=ctx.name if last else None)
        out = result
    return out


@lowers("aten._assert_tensor_metadata.default", "aten._assert_scalar.default", "aten._assert_async.msg",
        "aten._assert_async.default", "aten.sym_constrain_range.default",
        "aten.sym_constrain_range_for_size.default")
def assertion(ctx: Context, *args, **kwargs):
    return None  # checks torch.export already made; nothing to compute


@lowers("aten.flip.default")
def flip(ctx: Context, x, dims):
    shape = ctx.b.shape(x)
    if not shape:  # a 0-d tensor flipped along dim 0 or -1 is itself
        return ctx.tensor(x)
    flipped = {d % len(shape) for d in dims}
    index = [Affine.constant(n - 1) - Affine.dim(k) if k in flipped else Affine.dim(k)
             for k, n in enumerate(shape)]
    return ctx.b.index_map(x, shape, index, name=ctx.name)


@lowers("aten.unfold.default")
def unfold(ctx: Context, x, dim, size, step):
    """Tensor.unfold: the windows of `size` every `step` along `dim`, counted along `dim`, each
    window's elements on a new last axis: out[.., w, .., j] = x[.., w*step + j, ..]."""
    shape = ctx.b.shape(x)
    if not shape:  # a rank-0 tensor unfolds into one window of itself
        return ctx.b.reshape(x, (1,), name=ctx.name)
    dim %= len(shape)
    out = ctx.out_type().shape
    index = [Affine.dim(k) for k in range(len(shape))]
    index[dim] = Affine.dim(dim) * int(step) + Affine.dim(len(shape))
    return ctx.b.index_map(x, out, index, name=ctx.name)


@lowers("aten.diagonal.default")
def diagonal(ctx: Context, x, offset=0, dim1=0, dim2=1):
    """The diagonal of dims (dim1, dim2), `offset` above (below, if negative) the main one: the
    other dims in order, then the diagonal's positions k, reading x[.., k + max(-offset, 0), ..,
    k + max(offset, 0), ..]."""
    shape = ctx.b.shape(x)
    rank = len(shape)
    dim1, dim2 = dim1 % rank, dim2 % rank
    rest = [k for k in range(rank) if k not in (dim1, dim2)]
    out = ctx.out_type().shape
    k = Affine.dim(len(rest))
    index = []
    for d in range(rank):
        if d == dim1:
            index.append(k + max(-offset, 0))
        elif d == dim2:
            index.append(k + max(offset, 0))
        else:
            index.append(Affine.dim(rest.index(d)))
    return ctx.b.index_map(x, out, index, name=ctx.name)


@lowers("aten.roll.default")
def roll(ctx: Context, x, shifts, dims=()):
    """out[.., d, ..] = x[.., (d - shift) mod n, ..] per rolled dimension; with no dims, the
    flattened tensor rolls and keeps its shape."""
    shape = ctx.b.shape(x)
    shifts = [int(s) for s in (shifts if isinstance(shifts, (list, tuple)) else [shifts])]
    if not dims:
        flat = ctx.b.reshape(x, (max(1, _count(shape)),), suffix="flat")
        rolled = _rolled(ctx, flat, {0: shifts[0]}, suffix="flat_rolled")
        return ctx.b.reshape(rolled, shape, name=ctx.name)
    return _rolled(ctx, x, shifts_by_dim(shifts, dims, len(shape)), name=ctx.name)


def shifts_by_dim(shifts: list[int], dims, rank: int) -> dict[int, int]:
    """roll's (shift, dim) pairs as the total shift of each dim (a dim named twice adds up)."""
    by_dim: dict[int, int] = {}
    for d, shift in zip([int(d) for d in (dims if isinstance(dims, (list, tuple)) else [dims])], shifts):
        by_dim[d % rank] = by_dim.get(d % rank, 0) + shift
    return by_dim


def _rolled(ctx: Context, x, shifts: dict[int, int], name=None, suffix="rolled"):
    shape = ctx.b.shape(x)
    index = [(Affine.dim(k) + (n - shifts[k] % n)).mod(n, shape) if k in shifts and n else Affine.dim(k)
             for k, n in enumerate(shape)]
    return ctx.b.index_map(x, shape, index, name=name, suffix=suffix)


def _count(shape) -> int:
    total = 1
    for n in shape:
        total *= n
    return total


@lowers("aten.repeat.default")
def repeat(ctx: Context, x, repeats):
    """x tiled `repeats` times per dimension (leading repeats add dimensions): each output
    coordinate reads its input coordinate modulo the input's extent."""
    shape = ctx.b.shape(x)
    out = ctx.out_type().shape
    lead = len(repeats) - len(shape)
    index = [Affine.dim(lead + k).mod(n, out) if n > 1 else Affine.constant(0) for k, n in enumerate(shape)]
    return ctx.b.index_map(x, out, index, name=ctx.name)


@lowers("aten.arange.default", "aten.arange.start", "aten.arange.start_step")
def arange(ctx: Context, *args, **kwargs):
    """A known sequence (positions, mask rows and columns): a constant tensor of the program."""
    import numpy as np

    bounds = [a for a in args if isinstance(a, (int, float))]
    start, end, step = (0, bounds[0], 1) if len(bounds) == 1 else (*bounds[:2], bounds[2] if len(bounds) > 2 else 1)
    out = ctx.out_type()
    values = np.arange(start, end, step, dtype=np.float64)[:out.shape[0]]
    return ctx.constant(values, out.dtype)


@lowers("aten.tril_indices.default", "aten.triu_indices.default")
def triangle_indices(ctx: Context, row, col, offset=0, **kwargs):
    """The (2, count) coordinates of a matrix's lower (upper) triangle, row by row: a constant."""
    import numpy as np

    pick = np.tril_indices if "tril" in str(ctx.node.target) else np.triu_indices
    return ctx.constant(np.stack(pick(int(row), int(offset), int(col))), ctx.out_type().dtype)
