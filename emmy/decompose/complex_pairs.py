"""complex64 as pairs of f32 (complex128 of f64): a complex tensor of shape S is the real tensor of
shape (*S, 2) that torch.view_as_real shows (real part, then imaginary), so view_as_complex and view_as_real are free
and rotary embeddings written with complex numbers (Meta's Llama: xq as complex times freqs_cis)
compile to the same arithmetic as their real spelling. Views, slices, cats, repeats, writes, torch.complex,
sums, products, quotients, real powers, square roots, sgn, exp and log, matrix products of complex tensors
are taken, their magnitude and angle, and Fourier transforms (emmy.decompose.fourier); any other op on one
is refused with the op named.
"""

from __future__ import annotations

from emmy.affine import Affine, Guard
from emmy.decompose.layout import joined
from emmy.decompose.registry import registrar
from emmy.dtypes import DType
from emmy.errors import UnsupportedOpError

COMPLEX_OPS: dict = {}
complex_op = registrar(COMPLEX_OPS)  # the decomposition of an ATen overload on complex tensors


def is_complex(value) -> bool:
    dtype = getattr(value, "dtype", None)
    return dtype is not None and getattr(dtype, "is_complex", False)


def lower_complex(ctx, key: str, args: list, kwargs: dict, pairs: set) -> object:
    """Decompose an op that makes or reads a complex tensor; `pairs`: the builder names that hold
    complex tensors as pairs (grown by what this op makes)."""
    fn = COMPLEX_OPS.get(key)
    if fn is None:
        raise UnsupportedOpError(f"unsupported op {ctx.where}: {key} on complex numbers (emmy takes view_as_complex, "
                                 "view_as_real, complex, polar, views, slices, cats, repeats, writes, sums, products, "
                                 "quotients, real powers, square roots, sgn, exp, log, matrix products, abs, angle "
                                 "and Fourier transforms of complex tensors)")
    result = fn(ctx, *args, **kwargs)
    if is_complex(ctx.node.meta.get("val")):
        pairs.add(result)
    return result


def _part(ctx) -> DType:
    """The real type of the op's complex values: f64 where complex128 is among what it reads or makes
    (a float64 program's spectrum), else f32 (complex64)."""
    vals = [ctx.node.meta.get("val")] + [n.meta.get("val") for n in ctx.node.all_input_nodes]
    flat = [v for x in vals for v in (x if isinstance(x, (list, tuple)) else [x])]
    return DType.F64 if any(str(getattr(v, "dtype", "")) == "torch.complex128" for v in flat) else DType.F32


def _shape(ctx) -> tuple[int, ...]:
    """The complex result's shape with the pair axis."""
    return (*(int(s) for s in ctx.node.meta["val"].shape), 2)


@complex_op("aten.view_as_complex.default", "aten.view_as_real.default")
def pairs_view(ctx, x):
    """The same values under a name of its own: one is complex, the other real."""
    shape = ctx.b.shape(x)
    return ctx.b.index_map(x, shape, [Affine.dim(d) for d in range(len(shape))], name=ctx.name)


@complex_op("aten.clone.default", "aten.alias.default", "aten._to_copy.default", "aten.contiguous.default")
def same(ctx, x, *args, **kwargs):
    """The same values; a real tensor made complex gains an imaginary part of zeros, a complex one
    made real keeps its real part (as torch casts, with its warning)."""
    if not is_complex(ctx.node.meta.get("val")):
        return ctx.b.cast(parts_of(ctx, x)[0], ctx.out_type().dtype)
    return x if x in ctx.pairs else as_pair(ctx, x, _shape(ctx))


@complex_op("aten._assert_tensor_metadata.default")
def assertion(ctx, *args, **kwargs):
    return None  # a check torch.export already made; nothing to compute


@complex_op("aten.full.default")
def full(ctx, size, value, **kwargs):
    value = complex(value)
    shape = _shape(ctx)
    return _pair(ctx, ctx.b.fill(value.real, shape[:-1], _part(ctx)), ctx.b.fill(value.imag, shape[:-1], _part(ctx)),
                 shape)


@complex_op("aten.copy.default")
def copy(ctx, dst, src, non_blocking=False):
    """dst's shape, src's values (broadcast; a real src with no imaginary part)."""
    return as_pair(ctx, src, _shape(ctx))


@complex_op("aten.slice_scatter.default")
def slice_scatter(ctx, x, src, dim=0, start=None, end=None, step=1):
    """x with x[.., start:end:step, ..] = src, on the pairs (their last axis untouched)."""
    from emmy.decompose.scatter import slice_written

    shape = _shape(ctx)
    dim %= len(shape) - 1
    src = as_pair(ctx, src, None)
    index, written = slice_written(shape, dim, start, end, step, ctx.b.shape(src)[dim])
    b = ctx.b
    value = b.index_map(src, shape, index, written, 0.0, suffix="written")
    mask = b.index_map(b.const(True, DType.BOOL), shape, (), guards=written, fill=False, suffix="where_written")
    return b.elementwise("where", mask, value, as_pair(ctx, x, shape), dtype=_part(ctx), name=ctx.name)


@complex_op("aten.mm.default", "aten.bmm.default")
def matrix_product(ctx, a, b):
    """(ar + i ai)(br + i bi) as four real products (a real operand: two)."""
    from emmy.decompose.linalg import product_of

    shape = _shape(ctx)
    (ar, ai), (br, bi) = parts_of(ctx, a), parts_of(ctx, b)
    mm = lambda x, y: product_of(ctx, x, y, _part(ctx))  # noqa: E731
    if ai is None or bi is None:
        real, imag = (mm(ar, br), mm(ar, bi)) if ai is None else (mm(ar, br), mm(ai, br))
    else:
        real = ctx.b.elementwise("subtract", mm(ar, br), mm(ai, bi), suffix="re")
        imag = ctx.b.elementwise("add", mm(ar, bi), mm(ai, br), suffix="im")
    return _pair(ctx, real, imag, shape)


@complex_op("aten.sum.dim_IntList", "aten.sum.default")
def sum_(ctx, x, dims=None, keepdim=False, **kwargs):
    """Each part summed on its own: the pair axis is never reduced."""
    rank = len(ctx.b.shape(x)) - 1
    axes = list(range(rank)) if not dims else [d % rank for d in dims]
    return ctx.b.reduce_axes("sum", as_pair(ctx, x, None), axes, bool(keepdim), name=ctx.name)


@complex_op("aten.roll.default")
def roll(ctx, x, shifts, dims=()):
    """The pairs rolled along the complex tensor's dims (fftshift), the pair axis untouched."""
    from emmy.decompose.layout import _rolled, shifts_by_dim

    if not dims:
        raise UnsupportedOpError(f"unsupported op {ctx.where}: a complex tensor rolled flat (give the dims)")
    shifts = [int(s) for s in (shifts if isinstance(shifts, (list, tuple)) else [shifts])]
    return _rolled(ctx, x, shifts_by_dim(shifts, dims, len(ctx.b.shape(x)) - 1), name=ctx.name)


@complex_op("aten.constant_pad_nd.default")
def pad(ctx, x, padding, value=0.0):
    """Zeros around the complex tensor (a transform of n beyond its length pads so): `padding` holds
    (before, after) per dim from the last complex one back; negative amounts crop."""
    if complex(value) != 0:
        raise UnsupportedOpError(f"unsupported op {ctx.where}: a complex tensor padded with {value} (emmy pads with 0)")
    shape = _shape(ctx)
    rank = len(shape) - 1
    index, guards = [Affine.dim(d) for d in range(rank + 1)], []
    source = ctx.b.shape(x)
    for k in range(len(padding) // 2):
        d = rank - 1 - k
        before = int(padding[2 * k])
        index[d] = Affine.dim(d) - before
        guards.append(Guard(Affine.dim(d), before, before + source[d]))
    return ctx.b.index_map(as_pair(ctx, x, None), shape, index, guards, 0.0, name=ctx.name)


@complex_op("aten._conj.default", "aten.conj_physical.default", "aten._conj_physical.default",
            "aten.resolve_conj.default")
def conjugate(ctx, x):
    """re - i im (resolve_conj: the values a conjugate view shows, which _conj already made)."""
    if "resolve" in str(ctx.node.target):
        return x
    re, im = parts_of(ctx, x)
    return _pair(ctx, re, ctx.b.elementwise("negative", im), _shape(ctx))


@complex_op("aten.abs.default")
def magnitude(ctx, x):
    """|re + i im|, a real tensor (hypot: no overflow of the squares)."""
    re, im = parts_of(ctx, x)
    return ctx.b.elementwise("hypot", re, im, name=ctx.name)


@complex_op("aten.angle.default")
def angle(ctx, x):
    re, im = parts_of(ctx, x)
    return ctx.b.elementwise("atan2", im, re, name=ctx.name)


@complex_op("aten.view.default", "aten._unsafe_view.default", "aten.reshape.default", "aten.unsqueeze.default",
            "aten.squeeze.dim", "aten.squeeze.dims", "aten.squeeze.default")
def view(ctx, x, *args):
    return ctx.b.reshape(x, _shape(ctx), name=ctx.name)


@complex_op("aten.expand.default")
def expand(ctx, x, *args, **kwargs):
    return ctx.b.broadcast_to(x, _shape(ctx))


@complex_op("aten.slice.Tensor")
def slice_(ctx, x, dim=0, start=None, end=None, step=1):
    return ctx.b.slice(x, dim % (len(ctx.b.shape(x)) - 1), start, end, step, name=ctx.name)


@complex_op("aten.select.int")
def select(ctx, x, dim, index):
    return ctx.b.select(x, dim % (len(ctx.b.shape(x)) - 1), index, name=ctx.name)


@complex_op("aten.permute.default")
def permute(ctx, x, dims):
    rank = len(ctx.b.shape(x)) - 1
    return ctx.b.permute(x, [d % rank for d in dims] + [rank], name=ctx.name)


@complex_op("aten.mul.Tensor", "aten.add.Tensor", "aten.sub.Tensor", "aten.mul.Scalar")
def arithmetic(ctx, a, b, alpha=1):
    """(a_re + i a_im) (b_re + i b_im) and sums; a real operand (a tensor or a number) is a complex
    one with no imaginary part."""
    op = str(ctx.node.target).split(".")[1]
    shape = _shape(ctx)
    if op != "mul" and alpha != 1:
        b = _scaled(ctx, b, alpha)
    parts_a, parts_b = _parts(ctx, a, shape), _parts(ctx, b, shape)
    builder = ctx.b
    if op in ("add", "sub"):
        name = "add" if op == "add" else "subtract"
        real = builder.elementwise(name, parts_a[0], parts_b[0], suffix="re")
        zero = builder.fill(0.0, shape[:-1], _part(ctx))  # a real side's imaginary part
        imag = builder.elementwise(name, parts_a[1] or zero, parts_b[1] or zero, suffix="im")
        return _pair(ctx, real, imag, shape)
    (ar, ai), (br, bi) = parts_a, parts_b
    mul = lambda x, y: builder.elementwise("multiply", x, y)  # noqa: E731
    if ai is None or bi is None:  # one side real: each part scales
        scale, (re, im) = (ar, (br, bi)) if ai is None else (br, (ar, ai))
        return _pair(ctx, mul(re, scale), mul(im, scale), shape)
    real = builder.elementwise("subtract", mul(ar, br), mul(ai, bi), suffix="re")
    imag = builder.elementwise("add", mul(ar, bi), mul(ai, br), suffix="im")
    return _pair(ctx, real, imag, shape)


@complex_op("aten.cat.default")
def concatenate(ctx, tensors, dim=0):
    """A cat (torch.stack's too) of complex tensors, a real one among them with no imaginary part:
    their pairs joined along the axis, which never is the pair axis."""
    shape = _shape(ctx)
    rank = len(shape) - 1
    pieces = [as_pair(ctx, t, None) for t in tensors]
    pieces = [p for p in pieces if len(ctx.b.shape(p)) == rank + 1 and ctx.b.shape(p)[dim % rank]]
    return joined(ctx.b, pieces, shape, dim % rank, _part(ctx), ctx.name)


@complex_op("aten.repeat.default")
def repeat(ctx, x, repeats):
    """x tiled per dimension (layout.repeat) with its pair axis read as it is."""
    pairs = as_pair(ctx, x, None)
    shape, out = ctx.b.shape(pairs)[:-1], _shape(ctx)
    lead = len(repeats) - len(shape)
    index = [Affine.dim(lead + k).mod(n, out) if n > 1 else Affine.constant(0) for k, n in enumerate(shape)]
    return ctx.b.index_map(pairs, out, [*index, Affine.dim(len(out) - 1)], name=ctx.name)


@complex_op("aten.complex.default")
def from_parts(ctx, real, imag):
    """torch.complex(real, imag), the two broadcast to the result's shape."""
    shape = _shape(ctx)
    return _pair(ctx, ctx.tensor(real, _part(ctx), shape[:-1]), ctx.tensor(imag, _part(ctx), shape[:-1]), shape)


@complex_op("aten.neg.default")
def negative(ctx, x):
    re, im = parts_of(ctx, x)
    return _pair(ctx, ctx.b.elementwise("negative", re), ctx.b.elementwise("negative", im), _shape(ctx))


@complex_op("aten.exp.default")
def exponential(ctx, x):
    """e^re (cos im + i sin im)."""
    b = ctx.b
    re, im = parts_of(ctx, x)
    scale = b.elementwise("exp", re)
    return _pair(ctx, b.elementwise("multiply", scale, b.elementwise("cos", im)),
                 b.elementwise("multiply", scale, b.elementwise("sin", im)), _shape(ctx))


@complex_op("aten.log.default")
def logarithm(ctx, x):
    """log |z| + i arg z."""
    b = ctx.b
    re, im = parts_of(ctx, x)
    return _pair(ctx, b.elementwise("log", b.elementwise("hypot", re, im)), b.elementwise("atan2", im, re), _shape(ctx))


@complex_op("aten.div.Tensor", "aten.div.Scalar", "aten.reciprocal.default")
def division(ctx, a, b=None):
    """a / b (reciprocal: 1 / a). By a real divisor each part is divided; by a complex one as
    c10::complex divides (_quotient)."""
    if b is None:
        a, b = 1.0, a
    shape = _shape(ctx)
    (ar, ai), (c, d) = _parts(ctx, a, shape), _parts(ctx, b, shape)
    op = ctx.b.elementwise
    if d is None:
        return _pair(ctx, op("divide", ar, c), op("divide", ai, c) if ai else ctx.b.fill(0.0, shape[:-1], _part(ctx)),
                     shape)
    return _pair(ctx, *_quotient(ctx, (ar, ai), (c, d), shape), shape)


def _quotient(ctx, dividend, divisor, shape) -> tuple:
    """(a + i b) / (c + i d) as Smith's method (numpy's, c10::complex's): the ratio of the smaller part
    of the divisor to the larger, so no square overflows; 0 / 0 gives the infinities and NaNs of
    a / |c|, b / |d|. `dividend`'s imaginary part may be None (a real one)."""
    (ar, ai), (c, d) = dividend, divisor
    op = ctx.b.elementwise
    ai = ai or ctx.b.fill(0.0, shape[:-1], _part(ctx))
    abs_c, abs_d = op("abs", c), op("abs", d)
    real_first = op("greater_equal", abs_c, abs_d)  # |c| >= |d|: the ratio d / c
    big, small = op("where", real_first, c, d), op("where", real_first, d, c)
    ratio = op("divide", small, big)
    scale = op("divide", 1.0, op("add", big, op("multiply", small, ratio)))
    # |c| >= |d|: ((a + b r) s, (b - a r) s); else ((a r + b) s, (b r - a) s)
    first = op("where", real_first, ar, ai)
    second = op("where", real_first, ai, ar)
    real = op("multiply", op("add", first, op("multiply", second, ratio)), scale)
    imag_when_c = op("multiply", op("subtract", ai, op("multiply", ar, ratio)), scale)
    imag_when_d = op("multiply", op("subtract", op("multiply", ai, ratio), ar), scale)
    imag = op("where", real_first, imag_when_c, imag_when_d)
    both_zero = op("logical_and", op("equal", abs_c, 0.0), op("equal", abs_d, 0.0))
    return op("where", both_zero, op("divide", ar, abs_c), real), op("where", both_zero, op("divide", ai, abs_d), imag)


def _product(ctx, a, b) -> tuple:
    """(ar + i ai) (br + i bi) as parts."""
    op = ctx.b.elementwise
    (ar, ai), (br, bi) = a, b
    return (op("subtract", op("multiply", ar, br), op("multiply", ai, bi)),
            op("add", op("multiply", ar, bi), op("multiply", ai, br)))


@complex_op("aten.pow.Tensor_Scalar")
def power(ctx, x, exponent):
    """z ** p for a real number p. As torch's kernel does: 2 and 3 as products, -1 and -2 as quotients
    of one by them, 0.5 as sqrt; any other p as |z|^p (cos p arg z + i sin p arg z)."""
    if isinstance(exponent, complex):
        raise UnsupportedOpError(f"unsupported op {ctx.where}: a complex number raised to a complex power "
                                 "(emmy takes real exponents)")
    shape, p = _shape(ctx), float(exponent)
    b, z = ctx.b, _both_parts(ctx, x)
    if p == 0.5:
        return _pair(ctx, *_root(ctx, z), shape)
    if p in (1.0, 2.0, 3.0, -1.0, -2.0):
        result = z
        for _ in range(int(abs(p)) - 1):
            result = _product(ctx, result, z)
        if p < 0:
            result = _quotient(ctx, (b.fill(1.0, shape[:-1], _part(ctx)), None), result, shape)
        return _pair(ctx, *result, shape)
    op = b.elementwise
    magnitude = op("power", op("hypot", *z), p)
    turned = op("multiply", op("atan2", z[1], z[0]), p)
    return _pair(ctx, op("multiply", magnitude, op("cos", turned)), op("multiply", magnitude, op("sin", turned)), shape)


@complex_op("aten.sqrt.default")
def square_root(ctx, x):
    return _pair(ctx, *_root(ctx, _both_parts(ctx, x)), _shape(ctx))


def _root(ctx, z) -> tuple:
    """The principal square root, without cancellation (C99's csqrt): t = sqrt((|z| + |re|) / 2) is the
    larger part; re >= 0: (t, im / 2t); else (|im| / 2t, t with im's sign); z = 0: (0, im)."""
    op = ctx.b.elementwise
    re, im = z
    t = op("sqrt", op("multiply", op("add", op("hypot", re, im), op("abs", re)), 0.5))
    other = op("divide", im, op("multiply", t, 2.0))
    nonnegative = op("greater_equal", re, 0.0)
    real = op("where", nonnegative, t, op("abs", other))
    imag = op("where", nonnegative, other, op("copysign", t, im))
    zero = op("equal", t, 0.0)
    return op("where", zero, 0.0, real), op("where", zero, im, imag)


@complex_op("aten.sgn.default")
def unit(ctx, x):
    """z / |z|, and 0 where z is 0."""
    op = ctx.b.elementwise
    re, im = _both_parts(ctx, x)
    magnitude = op("hypot", re, im)
    zero = op("equal", magnitude, 0.0)
    return _pair(ctx, op("where", zero, 0.0, op("divide", re, magnitude)),
                 op("where", zero, 0.0, op("divide", im, magnitude)), _shape(ctx))


@complex_op("aten.scalar_tensor.default")
def scalar(ctx, value, **kwargs):
    """A rank-0 complex tensor (a backward graph's complex zero)."""
    value = complex(value)
    shape = _shape(ctx)
    return _pair(ctx, ctx.b.fill(value.real, shape[:-1], _part(ctx)), ctx.b.fill(value.imag, shape[:-1], _part(ctx)),
                 shape)


@complex_op("aten.where.self")
def select_where(ctx, condition, a, b):
    """Each part chosen by the condition, broadcast to the result's shape."""
    shape = _shape(ctx)
    builder = ctx.b
    chosen = ctx.tensor(condition, DType.BOOL, shape[:-1])
    zero = builder.fill(0.0, shape[:-1], _part(ctx))
    (ar, ai), (br, bi) = _parts(ctx, a, shape), _parts(ctx, b, shape)
    return _pair(ctx, builder.elementwise("where", chosen, ar, br),
                 builder.elementwise("where", chosen, ai or zero, bi or zero), shape)


@complex_op("aten.polar.default")
def polar(ctx, magnitude, angle):
    shape = _shape(ctx)
    b = ctx.b
    m = ctx.tensor(magnitude, _part(ctx), shape[:-1])
    t = ctx.tensor(angle, _part(ctx), shape[:-1])
    real = b.elementwise("multiply", m, b.elementwise("cos", t))
    imag = b.elementwise("multiply", m, b.elementwise("sin", t))
    return _pair(ctx, real, imag, shape)


def _scaled(ctx, value, alpha):
    return ctx.b.elementwise("multiply", value, float(alpha)) if isinstance(value, str) else value * alpha


def _parts(ctx, value, shape) -> tuple:
    """(real part, imaginary part or None) of an operand, broadcast to the result's shape."""
    b = ctx.b
    if not isinstance(value, str):  # a Python number, complex too (1j * x)
        value = complex(value)
        imag = b.fill(value.imag, shape[:-1], _part(ctx)) if value.imag else None
        return b.fill(value.real, shape[:-1], _part(ctx)), imag
    if value not in ctx.pairs:
        return ctx.tensor(value, _part(ctx), shape[:-1]), None
    rank = len(shape) - 1
    full = b.broadcast_to(value, shape) if b.shape(value) != shape else value
    parts = []
    for k in (0, 1):
        index = [Affine.dim(d) for d in range(rank)] + [Affine.constant(k)]
        parts.append(b.index_map(full, shape[:-1], index, suffix="re" if k == 0 else "im"))
    return tuple(parts)


def parts_of(ctx, x) -> tuple:
    """(real part, imaginary part or None) of a tensor at its own shape (a real one: no imaginary part)."""
    b = ctx.b
    if x not in ctx.pairs:
        return ctx.tensor(x, _part(ctx)), None
    shape = b.shape(x)
    rank = len(shape) - 1
    return tuple(b.index_map(x, shape[:-1], [Affine.dim(d) for d in range(rank)] + [Affine.constant(k)],
                             suffix=("re", "im")[k]) for k in (0, 1))


def _both_parts(ctx, x) -> tuple:
    """(real part, imaginary part) of the op's operand at the result's shape, a real one's imaginary
    part zeros (for an op whose formula reads both)."""
    re, im = parts_of(ctx, x)
    return re, im if im is not None else ctx.b.fill(0.0, _shape(ctx)[:-1], _part(ctx))


def as_pair(ctx, x, shape):
    """x as pairs broadcast to `shape` (with the pair axis; None: x's own), a real x with zeros."""
    b = ctx.b
    if x in ctx.pairs:
        return x if shape is None or b.shape(x) == shape else b.broadcast_to(x, shape)
    real = ctx.tensor(x, _part(ctx)) if shape is None else ctx.tensor(x, _part(ctx), shape[:-1])
    shape = shape or (*b.shape(real), 2)
    return _pair(ctx, real, b.fill(0.0, shape[:-1], _part(ctx)), shape, name=None)


def _pair(ctx, real, imag, shape, name: str | None = ""):
    """The pair tensor (.., 2) of two real ones, named as the op's result ("") or by `name`."""
    b = ctx.b
    rank = len(shape) - 1
    spread = [Affine.dim(d) for d in range(rank)]
    re = b.index_map(real, shape, spread, suffix="pair_re")
    im = b.index_map(imag, shape, spread, suffix="pair_im")
    first = b.index_map(b.const(True, DType.BOOL), shape, (), guards=[Guard(Affine.dim(rank), None, 1)], fill=False,
                        suffix="is_re")
    return b.elementwise("where", first, re, im, dtype=_part(ctx), name=ctx.name if name == "" else name)
