"""Pointwise ATen ops: arithmetic, math functions, comparisons, selects, casts."""

from __future__ import annotations

import math

from emmy.decompose.registry import Context, lowers
from emmy.dtypes import DType
from emmy.errors import UnsupportedDtypeError, UnsupportedOpError


def _arith(ctx: Context, op: str, *args) -> str:
    out = ctx.out_type()
    prepared = [ctx.operand(a, out.dtype, out.shape) for a in args]
    return ctx.b.elementwise(op, *prepared, dtype=out.dtype, name=ctx.name)


def _scaled(ctx: Context, value, alpha):
    if alpha == 1:
        return value
    out = ctx.out_type()
    if isinstance(value, str):
        return ctx.b.elementwise("multiply", ctx.tensor(value, out.dtype, out.shape), alpha, suffix="alpha")
    return value * alpha


_BINARY = {
    "add": "add", "sub": "subtract", "mul": "multiply", "div": "divide",
    "maximum": "maximum", "minimum": "minimum", "pow": "power",
}


@lowers("aten.add.Tensor", "aten.add.Scalar", "aten.sub.Tensor", "aten.sub.Scalar")
def add_sub(ctx: Context, a, b, alpha=1):
    op = "add" if "add" in str(ctx.node.target) else "subtract"
    return _arith(ctx, op, a, _scaled(ctx, b, alpha))


@lowers("aten.rsub.Scalar", "aten.rsub.Tensor")
def rsub(ctx: Context, a, b, alpha=1):
    return _arith(ctx, "subtract", b, _scaled(ctx, a, alpha))


@lowers("aten.mul.Tensor", "aten.mul.Scalar", "aten.maximum.default", "aten.minimum.default",
        "aten.pow.Tensor_Scalar", "aten.pow.Tensor_Tensor", "aten.pow.Scalar")
def binary(ctx: Context, a, b):
    packet = str(ctx.node.target).split(".")[1]
    return _arith(ctx, _BINARY[packet], a, b)


@lowers("prims.fma.default")
def fused_multiply_add(ctx: Context, a, b, c):
    """a * b + c (torch's lerp and Adam's moment updates decompose to it): a product and a sum,
    which nvcc contracts back into one FMA where it keeps them together."""
    out = ctx.out_type()
    a, b, c = (ctx.operand(v, out.dtype, out.shape) for v in (a, b, c))
    product = ctx.b.elementwise("multiply", a, b, dtype=out.dtype, suffix="product")
    return ctx.b.elementwise("add", product, c, dtype=out.dtype, name=ctx.name)


@lowers("aten.div.Tensor", "aten.div.Scalar", "aten.div.Tensor_mode", "aten.div.Scalar_mode")
def div(ctx: Context, a, b, rounding_mode=None):
    if rounding_mode is None:
        return _arith(ctx, "divide", a, b)
    if rounding_mode == "floor":
        return _arith(ctx, "floor_divide", a, b)
    if rounding_mode == "trunc":
        return _arith(ctx, "trunc_divide", a, b)
    raise UnsupportedOpError(f"unsupported op {ctx.where}: division with rounding_mode={rounding_mode!r}")


@lowers("aten.floor_divide.default", "aten.floor_divide.Scalar")
def floor_divide(ctx: Context, a, b):
    return _arith(ctx, "floor_divide", a, b)


@lowers("aten.remainder.Tensor", "aten.remainder.Scalar", "aten.fmod.Tensor", "aten.fmod.Scalar")
def remainder(ctx: Context, a, b):
    return _arith(ctx, "remainder" if "remainder" in str(ctx.node.target) else "fmod", a, b)


@lowers("aten.remainder.Scalar_Tensor")
def remainder_of_number(ctx: Context, a, b):
    out = ctx.out_type()
    return _arith(ctx, "remainder", ctx.b.fill(a, out.shape, out.dtype), b)


@lowers("aten.floor.default", "aten.ceil.default", "aten.trunc.default", "aten.round.default", "aten.fix.default")
def rounding(ctx: Context, x):
    if not ctx.out_type().dtype.is_float:  # an integer is its own floor, ceiling, ...
        return ctx.tensor(x)
    packet = str(ctx.node.target).split(".")[1]
    return _arith(ctx, "trunc" if packet == "fix" else packet, x)


@lowers("aten.round.decimals")
def round_decimals(ctx: Context, x, decimals=0):
    """torch's: to the nearest multiple of 10^-decimals, half to even, by scaling with 10^|decimals|."""
    out = ctx.out_type()
    if decimals == 0:
        return _arith(ctx, "round", x)
    power = float(10.0 ** abs(decimals))
    value = ctx.tensor(x, out.dtype)
    if decimals > 0:
        scaled = ctx.b.elementwise("multiply", value, power, suffix="scaled")
        return ctx.b.elementwise("divide", ctx.b.elementwise("round", scaled), power, name=ctx.name)
    scaled = ctx.b.elementwise("divide", value, power, suffix="scaled")
    return ctx.b.elementwise("multiply", ctx.b.elementwise("round", scaled), power, name=ctx.name)


@lowers("aten.frac.default")
def frac(ctx: Context, x):
    value = ctx.tensor(x, ctx.out_type().dtype)
    return ctx.b.elementwise("subtract", value, ctx.b.elementwise("trunc", value), name=ctx.name)


@lowers("aten.sign.default", "aten.sgn.default")
def sign(ctx: Context, x):
    """1, -1 or 0 (NaN too, as torch gives), in x's dtype; a bool is itself."""
    out = ctx.out_type()
    if out.dtype is DType.BOOL:
        return ctx.tensor(x)
    value = ctx.tensor(x, out.dtype)
    positive = ctx.b.elementwise("greater", value, 0, dtype=DType.BOOL, suffix="positive")
    negative = ctx.b.elementwise("less", value, 0, dtype=DType.BOOL, suffix="negative")
    low = ctx.b.elementwise("where", negative, -1, 0, dtype=out.dtype, suffix="low")
    return ctx.b.elementwise("where", positive, 1, low, dtype=out.dtype, name=ctx.name)


_UNARY = {
    "neg": "negative", "abs": "abs", "exp": "exp", "log": "log", "sqrt": "sqrt", "rsqrt": "rsqrt",
    "sigmoid": "sigmoid", "tanh": "tanh", "erf": "erf", "reciprocal": "reciprocal", "cos": "cos", "sin": "sin",
    "log1p": "log1p", "expm1": "expm1", "log2": "log2", "log10": "log10", "exp2": "exp2", "tan": "tan",
    "atan": "atan", "asin": "asin", "acos": "acos", "sinh": "sinh", "cosh": "cosh", "asinh": "asinh",
    "acosh": "acosh", "atanh": "atanh", "erfc": "erfc", "lgamma": "lgamma", "erfinv": "erfinv", "i0": "i0",
    "digamma": "digamma", "special_i1": "i1", "special_i0e": "i0e", "special_i1e": "i1e", "special_erfcx": "erfcx",
    "special_ndtri": "ndtri",
}


_UNARY_ALIASES = {"special_modified_bessel_i0": "i0", "special_modified_bessel_i1": "special_i1"}  # one function


@lowers(*(f"aten.{name}.default" for name in (*_UNARY, *_UNARY_ALIASES)))
def unary(ctx: Context, x):
    packet = str(ctx.node.target).split(".")[1]
    return _arith(ctx, _UNARY[_UNARY_ALIASES.get(packet, packet)], x)


@lowers("aten.polygamma.default")
def polygamma(ctx: Context, n, x):
    """The n-th derivative of digamma: digamma itself for n = 0, else (-1)^(n+1) n! zeta(n + 1, x)
    (trigamma is n = 1: a digamma's gradient)."""
    if n == 0:
        return _arith(ctx, "digamma", x)
    if n < 0:
        raise UnsupportedOpError(f"unsupported op {ctx.where}: polygamma of negative order {n}")
    out = ctx.out_type()
    b = ctx.b
    value = ctx.operand(x, out.dtype, out.shape)
    series = b.elementwise("zeta", float(n + 1), value, dtype=out.dtype, suffix="zeta")
    result = b.elementwise("multiply", series, float((-1) ** (n + 1) * math.factorial(n)),
                           name=ctx.name if n > 1 else None)
    if n == 1:
        # torch's trigamma reflects x < 1/2, pi^2 / sin^2(pi x) - trigamma(1 - x) (huge and finite at
        # the poles, where sin(pi x) rounds off 0; NaN at -inf), and gives 0 at inf (zeta(2, inf) is NaN)
        wave = b.elementwise("sin", b.elementwise("multiply", value, math.pi))
        pole = b.elementwise("divide", math.pi ** 2, b.elementwise("multiply", wave, wave))
        mirrored = b.elementwise("zeta", 2.0, b.elementwise("subtract", 1.0, value), dtype=out.dtype)
        reflected = b.elementwise("subtract", pole, mirrored, suffix="reflected")
        result = b.elementwise("where", b.elementwise("less", value, 0.5), reflected, result, dtype=out.dtype)
        at_infinity = b.elementwise("logical_and", b.elementwise("isinf", value), b.elementwise("greater", value, 0.0))
        result = b.elementwise("where", at_infinity, 0.0, result, dtype=out.dtype, name=ctx.name)
    return result


@lowers(*(f"aten.special_bessel_{kind}.default" for kind in ("j0", "j1", "y0", "y1")))
def bessel(ctx: Context, x):
    """Bessel functions of the first and second kind (CUDA's j0f ... y1f); NaN at infinity, as
    torch gives (CUDA and C give the limit, 0)."""
    out = ctx.out_type()
    value = ctx.tensor(x, out.dtype)
    kind = str(ctx.node.target).split(".")[1].removeprefix("special_")
    result = ctx.b.elementwise(kind, value)
    return ctx.b.elementwise("where", ctx.b.elementwise("isinf", value), math.nan, result, dtype=out.dtype,
                             name=ctx.name)


@lowers("aten.special_zeta.default", "aten.special_zeta.self_scalar", "aten.special_zeta.other_scalar")
def hurwitz_zeta(ctx: Context, x, q):
    return _arith(ctx, "zeta", x, q)


@lowers("aten.special_log_ndtr.default")
def log_ndtr(ctx: Context, x):
    """log of the standard normal's CDF as torch computes it: log(erfcx(-t) / 2) - t^2 below x = -1
    (t = x / sqrt(2); no underflow in the far tail), log1p(-erfc(t) / 2) above."""
    out = ctx.out_type()
    b = ctx.b
    value = ctx.tensor(x, out.dtype)
    t = b.elementwise("multiply", value, 1.0 / math.sqrt(2.0), suffix="t")
    tail = b.elementwise("subtract", b.elementwise("log", b.elementwise("multiply", b.elementwise(
        "erfcx", b.elementwise("negative", t)), 0.5)), b.elementwise("multiply", t, t), suffix="tail")
    body = b.elementwise("log1p", b.elementwise("multiply", b.elementwise("erfc", t), -0.5), suffix="body")
    return b.elementwise("where", b.elementwise("less", value, -1.0), tail, body, dtype=out.dtype, name=ctx.name)


@lowers("aten.special_spherical_bessel_j0.default")
def spherical_bessel_j0(ctx: Context, x):
    """sin(x) / x, by its Taylor series below |x| = 1/2 (1 at 0, as torch) and 0 at infinity."""
    out = ctx.out_type()
    b = ctx.b
    value = ctx.tensor(x, out.dtype)
    square = b.elementwise("multiply", value, value, suffix="square")
    coefficients = [(-1) ** m / math.factorial(2 * m + 1) for m in range(8)]  # 1 - x^2/3! + ... - x^14/15!
    near = b.elementwise("multiply", square, coefficients[-1], suffix="series")
    for c in reversed(coefficients[1:-1]):  # Horner's rule in x^2
        near = b.elementwise("multiply", b.elementwise("add", near, c), square, suffix="series")
    near = b.elementwise("add", near, coefficients[0], suffix="near_zero")
    far = b.elementwise("divide", b.elementwise("sin", value), value, suffix="sinc")
    small = b.elementwise("less", b.elementwise("abs", value), 0.5)
    result = b.elementwise("where", small, near, far, dtype=out.dtype)
    return b.elementwise("where", b.elementwise("isinf", value), 0.0, result, dtype=out.dtype, name=ctx.name)


@lowers("aten.relu.default")
def relu(ctx: Context, x):
    return _arith(ctx, "maximum", x, 0)


@lowers("aten.isnan.default", "aten.isinf.default", "aten.signbit.default")
def float_test(ctx: Context, x):
    op = str(ctx.node.target).split(".")[1]
    if not ctx.b.dtype(x).is_float:  # an integer is never NaN or infinite; its sign bit is its sign
        if op == "signbit":
            return ctx.b.elementwise("less", ctx.tensor(x), 0, dtype=DType.BOOL, name=ctx.name)
        return ctx.b.fill(False, ctx.out_type().shape, DType.BOOL, name=ctx.name)
    return ctx.b.elementwise(op, ctx.tensor(x), dtype=DType.BOOL, name=ctx.name)


@lowers("aten.atan2.default", "aten.hypot.default", "aten.copysign.Tensor", "aten.copysign.Scalar",
        "aten.nextafter.default")
def float_binary(ctx: Context, a, b):
    op = str(ctx.node.target).split(".")[1]
    dtype = ctx.out_type().dtype
    if op == "nextafter" and dtype not in (DType.F32, DType.F64):  # computed in f32, a half's step rounds away
        raise UnsupportedDtypeError(f"unsupported op {ctx.where}: nextafter of {dtype} (emmy steps f32 and f64 values)")
    return _arith(ctx, op, a, b)


@lowers("aten.fmax.default", "aten.fmin.default")
def nan_ignoring_extreme(ctx: Context, a, b):
    """maximum/minimum where a NaN loses to a number (NaN only when both are)."""
    out = ctx.out_type()
    bld = ctx.b
    op = "maximum" if str(ctx.node.target).split(".")[1] == "fmax" else "minimum"
    if not out.dtype.is_float:
        return _arith(ctx, op, a, b)
    left, right = (ctx.operand(v, out.dtype, out.shape) for v in (a, b))
    extreme = bld.elementwise(op, left, right, suffix=op)
    right_nan = bld.elementwise("isnan", right, dtype=DType.BOOL, suffix="right_nan")
    unless_right = bld.elementwise("where", right_nan, left, extreme, dtype=out.dtype, suffix="unless_right")
    left_nan = bld.elementwise("isnan", left, dtype=DType.BOOL, suffix="left_nan")
    return bld.elementwise("where", left_nan, right, unless_right, dtype=out.dtype, name=ctx.name)


@lowers("aten.angle.default")
def angle(ctx: Context, x):
    """A real number's argument: pi below 0, else 0; NaN stays NaN (an integer's is a float)."""
    out = ctx.out_type()
    bld = ctx.b
    value = ctx.tensor(x, out.dtype)
    below = bld.elementwise("less", value, 0, dtype=DType.BOOL, suffix="below")
    turned = bld.elementwise("where", below, math.pi, 0.0, dtype=out.dtype, suffix="turned")
    nan = bld.elementwise("isnan", value, dtype=DType.BOOL, suffix="nan")
    return bld.elementwise("where", nan, value, turned, dtype=out.dtype, name=ctx.name)


@lowers("aten.ldexp.Tensor")
def ldexp(ctx: Context, x, exponent):
    """x * 2**exponent, in the (float) output type."""
    out = ctx.out_type()
    power = ctx.b.elementwise("exp2", ctx.operand(exponent, out.dtype, out.shape), suffix="power")
    return ctx.b.elementwise("multiply", ctx.operand(x, out.dtype, out.shape), power, name=ctx.name)


@lowers("aten.leaky_relu.default")
def leaky_relu(ctx: Context, x, negative_slope=0.01):
    out = ctx.out_type()
    value = ctx.tensor(x, out.dtype)
    positive = ctx.b.elementwise("greater", value, 0, dtype=DType.BOOL, suffix="positive")
    scaled = ctx.b.elementwise("multiply", value, float(negative_slope), suffix="scaled")
    return ctx.b.elementwise("where", positive, value, scaled, dtype=out.dtype, name=ctx.name)


@lowers("aten.rrelu_with_noise_functional.default")
def rrelu(ctx: Context, x, noise, lower=0.125, upper=1.0 / 3.0, training=False, generator=None):
    """Evaluation-mode RReLU: a leaky ReLU whose slope is the mean of its bounds (training draws
    random slopes, which a compiled program does not)."""
    if training:
        raise UnsupportedOpError(f"unsupported op {ctx.where}: rrelu in training mode draws random slopes")
    out = ctx.out_type(0)
    value = ctx.tensor(x, out.dtype)
    kept = ctx.b.elementwise("greater_equal", value, 0, dtype=DType.BOOL, suffix="kept")
    scaled = ctx.b.elementwise("multiply", value, (float(lower) + float(upper)) / 2, suffix="scaled")
    result = ctx.b.elementwise("where", kept, value, scaled, dtype=out.dtype, name=ctx.name)
    return result, ctx.tensor(noise)


@lowers("aten.elu.default")
def elu(ctx: Context, x, alpha=1.0, scale=1.0, input_scale=1.0):
    """scale * (x if x > 0 else alpha * (exp(x * input_scale) - 1)) (selu is elu with its constants)."""
    out = ctx.out_type()
    b = ctx.b
    acc = out.dtype.accumulator
    xf = ctx.tensor(x, acc)
    positive = b.elementwise("greater", xf, 0, dtype=DType.BOOL, suffix="positive")
    inner = b.elementwise("multiply", xf, float(input_scale), suffix="in") if input_scale != 1 else xf
    negative = b.elementwise("multiply", b.elementwise("expm1", inner), float(alpha), suffix="negative")
    y = b.elementwise("where", positive, xf, negative, dtype=acc, suffix="select")
    if scale != 1:
        y = b.elementwise("multiply", y, float(scale), suffix="scaled")
    return b.cast(y, out.dtype)


@lowers("aten.hardtanh.default")
def hardtanh(ctx: Context, x, min_val=-1.0, max_val=1.0):
    out = ctx.out_type()
    low = ctx.b.elementwise("maximum", ctx.tensor(x, out.dtype), float(min_val), suffix="lo")
    return ctx.b.elementwise("minimum", low, float(max_val), name=ctx.name)


@lowers("aten.softplus.default")
def softplus(ctx: Context, x, beta=1.0, threshold=20.0):
    """log1p(exp(beta * x)) / beta, and x itself where beta * x > threshold (as torch does)."""
    out = ctx.out_type()
    b = ctx.b
    acc = out.dtype.accumulator
    xf = ctx.tensor(x, acc)
    bx = b.elementwise("multiply", xf, float(beta), suffix="beta") if beta != 1 else xf
    soft = b.elementwise("log1p", b.elementwise("exp", bx))
    if beta != 1:
        soft = b.elementwise("divide", soft, float(beta), suffix="soft")
    linear = b.elementwise("greater", bx, float(threshold), dtype=DType.BOOL, suffix="linear")
    return b.cast(b.elementwise("where", linear, xf, soft, dtype=acc, suffix="select"), out.dtype)


@lowers("aten.clamp.default", "aten.clamp.Tensor")
def clamp(ctx: Context, x, min=None, max=None):
    out = ctx.out_type()
    value = ctx.tensor(x, out.dtype, out.shape)
    if min is not None:
        value = ctx.b.elementwise("maximum", value, ctx.operand(min, out.dtype, out.shape), suffix="lo",
                                  name=None if max is not None else ctx.name)
    if max is not None:
        value = ctx.b.elementwise("minimum", value, ctx.operand(max, out.dtype, out.shape), name=ctx.name)
    return value


@lowers("aten.silu.default")
def silu(ctx: Context, x):
    out = ctx.out_type()
    acc = out.dtype.accumulator
    xf = ctx.tensor(x, acc)
    y = ctx.b.elementwise("multiply", xf, ctx.b.elementwise("sigmoid", xf),
                          name=ctx.name if acc is out.dtype else None)
    return ctx.b.cast(y, out.dtype)


@lowers("aten.gelu.default")
def gelu(ctx: Context, x, approximate="none"):
    out = ctx.out_type()
    acc = out.dtype.accumulator
    b = ctx.b
    xf = ctx.tensor(x, acc)
    if approximate == "tanh":
        cube = b.elementwise("multiply", b.elementwise("multiply", xf, xf, suffix="sq"), xf, suffix="cube")
        inner = b.elementwise("add", xf, b.elementwise("multiply", cube, 0.044715), suffix="inner")
        t = b.elementwise("tanh", b.elementwise("multiply", inner, math.sqrt(2.0 / math.pi)))
    elif approximate == "none":
        t = b.elementwise("erf", b.elementwise("multiply", xf, math.sqrt(0.5)))
    else:
        raise UnsupportedOpError(f"unsupported op {ctx.where}: gelu approximate={approximate!r}")
    half = b.elementwise("multiply", xf, 0.5, suffix="half")
    y = b.elementwise("multiply", half, b.elementwise("add", t, 1.0, suffix="one_plus"),
                      name=ctx.name if acc is out.dtype else None)
    return b.cast(y, out.dtype)


_COMPARE = {"lt": "less", "le": "less_equal", "gt": "greater", "ge": "greater_equal", "eq": "equal", "ne": "not_equal"}


@lowers(*(f"aten.{p}.{o}" for p in _COMPARE for o in ("Tensor", "Scalar")))
def compare(ctx: Context, a, b):
    out = ctx.out_type()
    compute = ctx.promoted(*ctx.node.args[:2])
    x = ctx.operand(a, compute, out.shape)
    y = ctx.operand(b, compute, out.shape)
    if not isinstance(x, str):  # scalar on the left: give the literal the compute type
        x = ctx.b.fill(x, out.shape, compute)
    op = _COMPARE[str(ctx.node.target).split(".")[1]]
    return ctx.b.elementwise(op, x, y, dtype=DType.BOOL, name=ctx.name)


_LOGICAL = {"logical_and": "logical_and", "logical_or": "logical_or", "logical_xor": "logical_xor",
            "bitwise_and": "logical_and", "bitwise_or": "logical_or", "bitwise_xor": "logical_xor"}


def _on_integers(ctx: Context) -> bool:
    """On bools, bitwise ops are logical ops; on integers they twiddle bits."""
    dtype = ctx.out_type().dtype
    return "bitwise" in str(ctx.node.target) and dtype is not DType.BOOL and not dtype.is_float


@lowers("aten.logical_and.default", "aten.logical_or.default", "aten.logical_xor.default", "aten.bitwise_and.Tensor",
        "aten.bitwise_or.Tensor", "aten.bitwise_xor.Tensor", "aten.bitwise_and.Scalar", "aten.bitwise_or.Scalar",
        "aten.bitwise_xor.Scalar")
def logical_binary(ctx: Context, a, b):
    out = ctx.out_type()
    if _on_integers(ctx):
        return _arith(ctx, str(ctx.node.target).split(".")[1], a, b)
    if out.dtype is not DType.BOOL:
        raise UnsupportedOpError(f"unsupported op {ctx.where}: bitwise ops on {out.dtype}")
    x = ctx.tensor(a, DType.BOOL, out.shape)
    y = ctx.operand(b if isinstance(b, str) else bool(b), DType.BOOL, out.shape)  # a Scalar overload's number
    op = _LOGICAL[str(ctx.node.target).split(".")[1]]
    return ctx.b.elementwise(op, x, y, dtype=DType.BOOL, name=ctx.name)


@lowers("aten.gcd.default", "aten.lcm.default")
def gcd_lcm(ctx: Context, a, b):
    """Greatest common divisor (Euclid's, in the kernel) and least common multiple |a / gcd * b|
    (0 where the gcd is: emmy's division by 0 gives 0), as torch's, of integers."""
    out = ctx.out_type()
    if out.dtype.is_float or out.dtype is DType.BOOL:
        raise UnsupportedOpError(f"unsupported op {ctx.where}: gcd and lcm of {out.dtype} (torch takes integers)")
    if "gcd" in str(ctx.node.target):
        return _arith(ctx, "gcd", a, b)
    # C promotes a narrow integer to int before it divides, multiplies and takes abs: only the
    # result wraps to the type, as torch's kernel computes it
    wide = DType.I32 if out.dtype.itemsize < 4 else out.dtype
    left, right = (ctx.operand(v, wide, out.shape) for v in (a, b))
    divisor = ctx.b.elementwise("gcd", left, right, dtype=wide, suffix="gcd")
    quotient = ctx.b.elementwise("trunc_divide", left, divisor, dtype=wide, suffix="quotient")
    product = ctx.b.elementwise("multiply", quotient, right, dtype=wide, suffix="product")
    return ctx.b.cast(ctx.b.elementwise("abs", product, dtype=wide, suffix="magnitude"), out.dtype)


@lowers("aten.__lshift__.Scalar", "aten.__lshift__.Tensor", "aten.bitwise_left_shift.Tensor",
        "aten.bitwise_left_shift.Tensor_Scalar", "aten.__rshift__.Scalar", "aten.__rshift__.Tensor",
        "aten.bitwise_right_shift.Tensor", "aten.bitwise_right_shift.Tensor_Scalar")
def shift(ctx: Context, a, b):
    """Bit shifts of integers (int4 weights unpacked from bytes: (packed >> 4) & 15)."""
    if ctx.out_type().dtype.is_float or ctx.out_type().dtype is DType.BOOL:
        raise UnsupportedOpError(f"unsupported op {ctx.where}: shifts of {ctx.out_type().dtype} (torch shifts integers)")
    left = "lshift" in str(ctx.node.target) or "left" in str(ctx.node.target)
    return _arith(ctx, "left_shift" if left else "right_shift", a, b)


@lowers("aten.logical_not.default", "aten.bitwise_not.default")
def logical_not(ctx: Context, a):
    if _on_integers(ctx):
        return _arith(ctx, "bitwise_not", a)
    return ctx.b.elementwise("logical_not", ctx.tensor(a, DType.BOOL), dtype=DType.BOOL, name=ctx.name)


@lowers("aten.where.self", "aten.where.ScalarSelf", "aten.where.ScalarOther", "aten.where.Scalar")
def where(ctx: Context, cond, a, b):
    out = ctx.out_type()
    c = ctx.tensor(cond, DType.BOOL, out.shape)
    x, y = ctx.operand(a, out.dtype, out.shape), ctx.operand(b, out.dtype, out.shape)
    return ctx.b.elementwise("where", c, x, y, dtype=out.dtype, name=ctx.name)


@lowers("aten._to_copy.default", "aten.clone.default", "aten.alias.default", "aten.lift_fresh_copy.default",
        "aten.contiguous.default", "aten.detach.default", "prims.convert_element_type.default")
def copy(ctx: Context, x, *args, **kwargs):
    out = ctx.out_type()
    value = ctx.tensor(x, out.dtype)
    if value == x:
        return x  # a copy is the same value; no node needed
    return value


@lowers("aten.full.default", "aten.scalar_tensor.default")
def full(ctx: Context, size, fill_value=None, **kwargs):
    out = ctx.out_type()
    if fill_value is None:  # scalar_tensor(value)
        fill_value = size
    return ctx.b.fill(fill_value, out.shape, out.dtype, name=ctx.name)


@lowers("aten.empty.memory_format", "aten.empty_permuted.default", "aten.empty_like.default",
        "aten.empty_strided.default", "aten.new_empty.default", "aten.new_empty_strided.default")
def empty(ctx: Context, *args, **kwargs):
    """Memory a program writes before it reads (functionalized graphs fill it by later ops); any
    value is right for it, and zeros are the cheapest to reason about."""
    out = ctx.out_type()
    return ctx.b.fill(False if out.dtype is DType.BOOL else 0, out.shape, out.dtype, name=ctx.name)


@lowers("aten.full_like.default", "aten.zeros_like.default", "aten.ones_like.default")
def full_like(ctx: Context, x, fill_value=None, **kwargs):
    out = ctx.out_type()
    target = str(ctx.node.target)
    value = 0 if "zeros" in target else 1 if "ones" in target else fill_value
    return ctx.b.fill(value, out.shape, out.dtype, name=ctx.name)
