"""The scalar functions an Elementwise node can apply, with their meaning.

One table serves the interpreter, the printers and (later) the code
generators, so a new op is added in exactly one place.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np


def _erf(x):
    from scipy import special  # imported when erf is first evaluated: scipy costs 0.15 s to import

    return special.erf(x)


@dataclass(frozen=True)
class ScalarOp:
    name: str
    arity: int
    kind: str  # "arith" (float math), "compare" (-> bool), "logic" (bool -> bool), "select", "cast",
    # "index" (arg-reduction keys, -> int64)
    apply: Callable[..., np.ndarray]
    on_floats: bool = True  # False: integers only (bit twiddling), never tried on floats by the rule checks


def _sigmoid(x):
    with np.errstate(over="ignore"):
        return (1.0 / (1.0 + np.exp(-x))).astype(x.dtype, copy=False)


def _rsqrt(x):
    with np.errstate(divide="ignore", invalid="ignore"):
        return (1.0 / np.sqrt(x)).astype(x.dtype, copy=False)


def _reciprocal(x):
    with np.errstate(divide="ignore"):
        return (1.0 / x).astype(x.dtype, copy=False)


def _quiet(fn):
    def run(*args):
        with np.errstate(all="ignore"):
            return fn(*args)

    return run


# An arg-reduction as one monoid: a float value and its position packed into one int64 whose order
# is (value, then the earlier position), so a plain max (min) fold finds the first maximum (minimum).
# The value's key is its f32 bit pattern made order-preserving as a signed int (negatives' magnitude
# bits flipped), -0 read as +0 and NaN above every value (below, for min), as torch's argmax and
# argmin rank them; the position fills the low 32 bits (reversed for max, so that max prefers the
# earlier one).
_LOW = 2 ** 32


def _value_key(x, nan_key: int) -> np.ndarray:
    f = np.ascontiguousarray(np.asarray(x, dtype=np.float32) + np.float32(0.0))  # -0 -> +0
    bits = f.view(np.int32).astype(np.int64)
    return np.where(np.isnan(f), nan_key, np.where(bits >= 0, bits, bits ^ 0x7FFFFFFF))


def _max_key(x, position):
    return _value_key(x, 2 ** 31 - 1) * _LOW + (_LOW - 1 - np.asarray(position, dtype=np.int64))


def _min_key(x, position):
    return _value_key(x, -2 ** 31) * _LOW + np.asarray(position, dtype=np.int64)


def _max_key_position(key):
    return _LOW - 1 - (np.asarray(key, dtype=np.int64) & (_LOW - 1))


def _min_key_position(key):
    return np.asarray(key, dtype=np.int64) & (_LOW - 1)


def _zeta(s, q):
    """Hurwitz's zeta as torch computes it: NaN at q = inf (scipy gives the limit, 0)."""
    from scipy import special

    return np.where(np.isposinf(q), np.nan, special.zeta(s, q)).astype(np.result_type(s, q), copy=False)


def _scipy(name: str):
    """A scipy.special function, imported when first evaluated (as erf is)."""
    def run(*args):
        from scipy import special

        return getattr(special, name)(*args)

    return run


def _integer_or_float(integer, floating):
    """An op whose integer form differs from its float one (division, remainders)."""
    def run(a, b):
        a, b = np.asarray(a), np.asarray(b)
        with np.errstate(all="ignore"):
            if np.issubdtype(np.result_type(a, b), np.integer):
                return integer(a, b)
            return floating(a, b)

    return run


def _integer_power(a, b):
    """torch's integer pow: products wrapping, a negative exponent 0 but for bases 1 and -1."""
    raised = np.power(a, np.where(b < 0, 0, b).astype(b.dtype))
    odd = np.fmod(b, 2) != 0
    negative = np.where(a == 1, 1, np.where(a == -1, np.where(odd, -1, 1), 0))
    return np.where(b >= 0, raised, negative).astype(raised.dtype)


def _gcd(a, b):
    """Euclid's greatest common divisor on the magnitudes (wrapping: the most negative value is its
    own), step for step as emmy_rt.cuh's emmy::gcd; gcd(0, 0) = 0."""
    a, b = np.broadcast_arrays(np.asarray(a), np.asarray(b))
    with np.errstate(all="ignore"):
        a, b = np.where(a < 0, 0 - a, a), np.where(b < 0, 0 - b, b)
        while (a != 0).any():
            live = a != 0
            a, b = np.where(live, np.fmod(b, np.where(live, a, 1)), a), np.where(live, a, b)
    return b


def _int_safe(op):
    """An integer division-like op with C's traps removed: by 0 and by -1 the kernels return 0 for a
    remainder and 0 or -a for a quotient, without dividing (emmy_rt.cuh)."""
    def run(a, b):
        a, b = np.broadcast_arrays(np.asarray(a), np.asarray(b))
        safe = np.where((b == 0) | (b == -1), 1, b)
        return op(a, safe, b)

    return run


def _remainder(a, b):
    """Python's (and torch's) modulo: the sign of the divisor; fmod's remainder moved by one divisor
    where it and the divisor differ in sign."""
    r = np.fmod(a, b)
    return np.where((r != 0) & ((b < 0) != (r < 0)), r + b, r)


_TABLE = [
    ScalarOp("add", 2, "arith", np.add),
    ScalarOp("subtract", 2, "arith", np.subtract),
    ScalarOp("multiply", 2, "arith", _quiet(np.multiply)),
    ScalarOp("divide", 2, "arith", _quiet(np.divide)),
    ScalarOp("maximum", 2, "arith", np.maximum),
    ScalarOp("minimum", 2, "arith", np.minimum),
    ScalarOp("power", 2, "arith", _integer_or_float(_integer_power, _quiet(np.power))),
    ScalarOp("negative", 1, "arith", np.negative),
    ScalarOp("abs", 1, "arith", np.abs),
    ScalarOp("exp", 1, "arith", _quiet(np.exp)),
    # exp for an online fold's rescale factor: the same function, computed without leaning (emmy_rt.cuh's
    # emmy::rescale_exp says why); made by the lowering, never by a program
    ScalarOp("rescale_exp", 1, "arith", _quiet(np.exp)),
    ScalarOp("log", 1, "arith", _quiet(np.log)),
    ScalarOp("sqrt", 1, "arith", _quiet(np.sqrt)),
    ScalarOp("rsqrt", 1, "arith", _rsqrt),
    ScalarOp("reciprocal", 1, "arith", _reciprocal),
    ScalarOp("sigmoid", 1, "arith", _sigmoid),
    ScalarOp("tanh", 1, "arith", np.tanh),
    ScalarOp("erf", 1, "arith", _erf),
    ScalarOp("cos", 1, "arith", _quiet(np.cos)),
    ScalarOp("sin", 1, "arith", _quiet(np.sin)),
    ScalarOp("log1p", 1, "arith", _quiet(np.log1p)),
    ScalarOp("expm1", 1, "arith", _quiet(np.expm1)),
    ScalarOp("log2", 1, "arith", _quiet(np.log2)),
    ScalarOp("log10", 1, "arith", _quiet(np.log10)),
    ScalarOp("exp2", 1, "arith", _quiet(np.exp2)),
    ScalarOp("tan", 1, "arith", _quiet(np.tan)),
    ScalarOp("atan", 1, "arith", np.arctan),
    ScalarOp("asin", 1, "arith", _quiet(np.arcsin)),
    ScalarOp("acos", 1, "arith", _quiet(np.arccos)),
    ScalarOp("sinh", 1, "arith", _quiet(np.sinh)),
    ScalarOp("cosh", 1, "arith", _quiet(np.cosh)),
    ScalarOp("asinh", 1, "arith", np.arcsinh),
    ScalarOp("acosh", 1, "arith", _quiet(np.arccosh)),
    ScalarOp("atanh", 1, "arith", _quiet(np.arctanh)),
    ScalarOp("erfc", 1, "arith", _quiet(_scipy("erfc"))),
    ScalarOp("lgamma", 1, "arith", _quiet(_scipy("gammaln"))),  # log|gamma(x)|, as torch.lgamma
    ScalarOp("digamma", 1, "arith", _quiet(_scipy("digamma"))),  # -inf at 0, NaN at negative integers, as torch
    ScalarOp("erfinv", 1, "arith", _quiet(_scipy("erfinv"))),
    ScalarOp("i0", 1, "arith", _quiet(_scipy("i0"))),  # modified Bessel functions of the first kind
    ScalarOp("i1", 1, "arith", _quiet(_scipy("i1"))),
    ScalarOp("i0e", 1, "arith", _quiet(_scipy("i0e"))),  # exponentially scaled: i0(x) exp(-|x|), finite for any x
    ScalarOp("i1e", 1, "arith", _quiet(_scipy("i1e"))),
    ScalarOp("erfcx", 1, "arith", _quiet(_scipy("erfcx"))),  # exp(x^2) erfc(x)
    ScalarOp("ndtri", 1, "arith", _quiet(_scipy("ndtri"))),  # the standard normal's quantile
    ScalarOp("bessel_j0", 1, "arith", _quiet(_scipy("j0"))),  # Bessel functions of the first and second kind
    ScalarOp("bessel_j1", 1, "arith", _quiet(_scipy("j1"))),
    ScalarOp("bessel_y0", 1, "arith", _quiet(_scipy("y0"))),
    ScalarOp("bessel_y1", 1, "arith", _quiet(_scipy("y1"))),
    ScalarOp("zeta", 2, "arith", _quiet(_zeta)),  # Hurwitz's zeta(s, q) (polygamma's series)
    ScalarOp("atan2", 2, "arith", np.arctan2),
    ScalarOp("hypot", 2, "arith", np.hypot),
    ScalarOp("copysign", 2, "arith", np.copysign),
    ScalarOp("nextafter", 2, "arith", np.nextafter),  # the next representable value after a toward b
    # bit twiddling of integers (bools take the logical ops)
    ScalarOp("bitwise_and", 2, "arith", np.bitwise_and, on_floats=False),
    ScalarOp("bitwise_or", 2, "arith", np.bitwise_or, on_floats=False),
    ScalarOp("bitwise_xor", 2, "arith", np.bitwise_xor, on_floats=False),
    ScalarOp("bitwise_not", 1, "arith", np.invert, on_floats=False),
    ScalarOp("gcd", 2, "arith", _gcd, on_floats=False),
    ScalarOp("left_shift", 2, "arith", np.left_shift, on_floats=False),  # a count past the bits: 0
    ScalarOp("right_shift", 2, "arith", np.right_shift, on_floats=False),  # arithmetic for signed types
    ScalarOp("floor", 1, "arith", np.floor),
    ScalarOp("ceil", 1, "arith", np.ceil),
    ScalarOp("trunc", 1, "arith", np.trunc),
    ScalarOp("round", 1, "arith", np.rint),  # half to even, as torch.round
    # floor division and remainders of floats as torch computes them (from fmod, exactly); of
    # integers, by 0 giving 0 (torch raises on the CPU; a kernel cannot)
    ScalarOp("floor_divide", 2, "arith", _integer_or_float(
        _int_safe(lambda a, s, b: np.where(b == 0, 0, np.where(b == -1, np.negative(a), np.floor_divide(a, s)))),
        np.floor_divide)),
    ScalarOp("trunc_divide", 2, "arith", _integer_or_float(
        _int_safe(lambda a, s, b: np.where(b == 0, 0, np.where(b == -1, np.negative(a),
                                                                 np.sign(a) * np.sign(s) * (np.abs(a) // np.abs(s))))),
        lambda a, b: np.trunc(a / b))),
    ScalarOp("remainder", 2, "arith", _integer_or_float(
        _int_safe(lambda a, s, b: np.where((b == 0) | (b == -1), 0, _remainder(a, s))), _remainder)),
    ScalarOp("fmod", 2, "arith", _integer_or_float(
        _int_safe(lambda a, s, b: np.where((b == 0) | (b == -1), 0, np.fmod(a, s))), np.fmod)),
    ScalarOp("isnan", 1, "compare", np.isnan),
    ScalarOp("isinf", 1, "compare", np.isinf),
    ScalarOp("signbit", 1, "compare", np.signbit),
    ScalarOp("less", 2, "compare", np.less),
    ScalarOp("less_equal", 2, "compare", np.less_equal),
    ScalarOp("greater", 2, "compare", np.greater),
    ScalarOp("greater_equal", 2, "compare", np.greater_equal),
    ScalarOp("equal", 2, "compare", np.equal),
    ScalarOp("not_equal", 2, "compare", np.not_equal),
    ScalarOp("logical_and", 2, "logic", np.logical_and),
    ScalarOp("logical_or", 2, "logic", np.logical_or),
    ScalarOp("logical_not", 1, "logic", np.logical_not),
    ScalarOp("logical_xor", 2, "logic", np.logical_xor),
    ScalarOp("where", 3, "select", np.where),
    ScalarOp("max_key", 2, "index", _max_key),
    ScalarOp("min_key", 2, "index", _min_key),
    ScalarOp("max_key_position", 1, "index", _max_key_position),
    ScalarOp("min_key_position", 1, "index", _min_key_position),
    ScalarOp("cast", 1, "cast", lambda x: x),
]

SCALAR_OPS: dict[str, ScalarOp] = {op.name: op for op in _TABLE}

# Monoids a Reduce node may fold with, and their identities.
REDUCE_OPS: dict[str, float] = {"sum": 0.0, "prod": 1.0, "max": float("-inf"), "min": float("inf")}
