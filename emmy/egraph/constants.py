"""Constant folding as the program computes: in the operation's dtype.

Term literals hold f64 values; a folded literal must hold what the program would have computed,
each operand rounded to the dtype and the result rounded once more, or a folded f32 `0.1 + 1e-9`
keeps digits no f32 program has. The algebra rules call `folded` through egglog's PyObject and
read its exact rational text back into an f64 (egglog has no PyObject -> f64 conversion).
"""

from __future__ import annotations

from fractions import Fraction

import numpy as np

from emmy.dtypes import DType, to_storage

_OPS = {"add": np.add, "subtract": np.subtract, "multiply": np.multiply}


def folded(op: str, a: str, b: str, dtype: str) -> str:
    """`a op b` (f64 text as egglog prints it) computed in `dtype`, as exact "numerator/denominator"
    text; "" when the result is not a finite number, or is -0.0 (a rational has no sign of zero),
    and then nothing folds."""
    kind = DType.parse(dtype)
    if kind is DType.BOOL:
        return ""
    if not kind.is_float and not all(np.isfinite(float(v)) for v in (a, b)):
        return ""  # an integer type's extreme riding as an infinity (encode.literal_value)
    with np.errstate(all="ignore"):  # operands beyond the dtype's range become infinities, as in the program
        x, y = (to_storage(np.asarray(float(v)).astype(kind.numpy), kind) for v in (a, b))
        result = to_storage(np.asarray(_OPS[op](x, y)), kind)
    value = float(result)
    if not np.isfinite(value) or (value == 0.0 and np.signbit(value)):
        return ""
    exact = Fraction(value)
    return f"{exact.numerator}/{exact.denominator}"


def exact_reciprocal(value: str, dtype: str) -> str:
    """"yes" when 1/value (value: f64 text) is exact and a normal number of float `dtype` (value a
    power of two), so x * (1/c) gives x / c's bits; else "". A rounded reciprocal would lean every
    quotient the same way (1/7 in f32 is 4.5e-8 high, so a mean over 7 would be up to 0.5 ulp high
    everywhere), which the lean check of emmy.checking rightly calls wrong."""
    kind = DType.parse(dtype)
    if not kind.is_float:
        return ""
    c = float(value)
    if c == 0 or not np.isfinite(c) or np.frexp(abs(c))[0] != 0.5:  # 0.5 * 2**k: a power of two
        return ""
    smallest, largest = {DType.F16: (2.0 ** -14, 65504.0), DType.BF16: (2.0 ** -126, 3.3895314e38)}.get(
        kind, (2.0 ** -126, 3.4028235e38))
    return "yes" if smallest <= abs(1.0 / c) <= largest else ""


def numerator(text: str) -> str:
    return text.split("/")[0]


def denominator(text: str) -> str:
    return text.split("/")[1]
