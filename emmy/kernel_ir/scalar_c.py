"""Loop IR scalar statements as C++ for the CUDA templates.

Values live in registers as float (f32, f16 and bf16: a half value is a float rounded to its
type after every operation, as the numpy interpreter rounds), double (f64, with the double forms
of the math functions and unsuffixed literals), long long, int or bool; buffers hold the storage
type. Operations follow tensor_ir.scalar_ops: maximum and minimum propagate
NaN like numpy's.
"""

from __future__ import annotations

import math

import numpy as np

from emmy.affine import Affine, Dim, FloorDiv, Gathered, Guard, Mod
from emmy.dtypes import DType
from emmy.errors import EmmyError
from emmy.kernel_ir.index_faults import INDEX_FAULTS, tensor_code
from emmy.kernel_ir.nodes import PartialSlot
from emmy.loop_ir import nodes as L
from emmy.tensor_ir.scalar_ops import REDUCE_OPS

# Narrow integers are registers of their own type, so arithmetic wraps as torch's (and numpy's) does.
REGISTER = {DType.F64: "double", DType.F32: "float", DType.F16: "float", DType.BF16: "float",
            DType.I64: "long long", DType.I32: "int", DType.I16: "short", DType.I8: "signed char", DType.U8: "unsigned char",
            DType.BOOL: "bool"}
STORAGE = {DType.F64: "double", DType.F32: "float", DType.F16: "__half", DType.BF16: "__nv_bfloat16",
           DType.I64: "long long", DType.I32: "int", DType.I16: "short", DType.I8: "signed char", DType.U8: "unsigned char",
           DType.BOOL: "bool"}
_MONOID_OP = {"sum": "add", "prod": "multiply", "max": "maximum", "min": "minimum"}  # Accumulate's op
_ROUND = {DType.F16: "emmy::round_half", DType.BF16: "emmy::round_bf16"}

_BINARY = {"add": "({0} + {1})", "subtract": "({0} - {1})", "multiply": "({0} * {1})", "divide": "({0} / {1})",
           "maximum": "emmy::maximum({0}, {1})", "minimum": "emmy::minimum({0}, {1})", "power": "powf({0}, {1})",
           "less": "({0} < {1})", "less_equal": "({0} <= {1})", "greater": "({0} > {1})",
           "greater_equal": "({0} >= {1})", "equal": "({0} == {1})", "not_equal": "({0} != {1})",
           "logical_and": "({0} && {1})", "logical_or": "({0} || {1})",
           "max_key": "emmy::max_key({0}, {1})", "min_key": "emmy::min_key({0}, {1})",
           "floor_divide": "emmy::floor_divide({0}, {1})", "trunc_divide": "emmy::trunc_divide({0}, {1})",
           "remainder": "emmy::remainder({0}, {1})", "fmod": "emmy::fmod({0}, {1})",
           "atan2": "atan2f({0}, {1})", "hypot": "hypotf({0}, {1})", "copysign": "copysignf({0}, {1})",
           "logical_xor": "({0} != {1})", "bitwise_and": "({0} & {1})", "bitwise_or": "({0} | {1})",
           "bitwise_xor": "({0} ^ {1})", "left_shift": "emmy::shift_left({0}, {1})",
           "right_shift": "emmy::shift_right({0}, {1})", "zeta": "emmy::zeta({0}, {1})",
           "nextafter": "nextafterf({0}, {1})"}
_UNARY = {"negative": "(-{0})", "abs": "fabsf({0})", "exp": "expf({0})", "rescale_exp": "emmy::rescale_exp({0})",
          "log": "logf({0})", "sqrt": "sqrtf({0})",
          "rsqrt": "rsqrtf({0})", "reciprocal": "(1.0f / {0})", "sigmoid": "(1.0f / (1.0f + expf(-{0})))",
          "tanh": "tanhf({0})", "erf": "erff({0})", "logical_not": "(!{0})", "cos": "cosf({0})",
          "sin": "sinf({0})", "log1p": "log1pf({0})", "expm1": "expm1f({0})", "isnan": "isnan({0})",
          "log2": "log2f({0})", "log10": "log10f({0})", "exp2": "exp2f({0})", "tan": "tanf({0})",
          "atan": "atanf({0})", "asin": "asinf({0})", "acos": "acosf({0})", "sinh": "sinhf({0})",
          "cosh": "coshf({0})", "asinh": "asinhf({0})", "acosh": "acoshf({0})", "atanh": "atanhf({0})",
          "erfc": "erfcf({0})", "lgamma": "lgammaf({0})", "erfinv": "erfinvf({0})", "i0": "cyl_bessel_i0f({0})",
          "i1": "cyl_bessel_i1f({0})", "digamma": "emmy::digamma({0})", "isinf": "isinf({0})", "bitwise_not": "(~{0})",
          "signbit": "signbit({0})", "i0e": "emmy::i0e({0})", "i1e": "emmy::i1e({0})", "erfcx": "erfcxf({0})",
          "ndtri": "normcdfinvf({0})", "bessel_j0": "j0f({0})", "bessel_j1": "j1f({0})", "bessel_y0": "y0f({0})",
          "bessel_y1": "y1f({0})",
          "floor": "floorf({0})", "ceil": "ceilf({0})", "trunc": "truncf({0})", "round": "rintf({0})",
          "max_key_position": "emmy::max_key_position({0})", "min_key_position": "emmy::min_key_position({0})"}

# Integer results computed exactly: the float math functions would round a value past 2^24 (f32).
_INTEGER = {"abs": "emmy::integer_abs({0})", "power": "emmy::integer_power({0}, {1})", "gcd": "emmy::gcd({0}, {1})"}

# f64's forms: the C math functions without their float suffix (CUDA's double functions), double
# literals, and exp for the online softmax's rescale (whose float form is tuned to f32's bits).
_DOUBLE_NAMES = {"fabsf": "fabs", "expf": "exp", "logf": "log", "sqrtf": "sqrt", "rsqrtf": "rsqrt", "tanhf": "tanh",
                 "erff": "erf", "cosf": "cos", "sinf": "sin", "log1pf": "log1p", "expm1f": "expm1", "log2f": "log2",
                 "log10f": "log10", "exp2f": "exp2", "tanf": "tan", "atanf": "atan", "asinf": "asin",
                 "acosf": "acos", "sinhf": "sinh", "coshf": "cosh", "asinhf": "asinh", "acoshf": "acosh",
                 "atanhf": "atanh", "erfcf": "erfc", "lgammaf": "lgamma", "erfinvf": "erfinv",
                 "cyl_bessel_i0f": "cyl_bessel_i0", "cyl_bessel_i1f": "cyl_bessel_i1", "floorf": "floor",
                 "ceilf": "ceil", "truncf": "trunc", "rintf": "rint", "powf": "pow", "atan2f": "atan2",
                 "hypotf": "hypot", "copysignf": "copysign", "emmy::rescale_exp": "exp", "erfcxf": "erfcx",
                 "normcdfinvf": "normcdfinv", "nextafterf": "nextafter", "j0f": "j0", "j1f": "j1", "y0f": "y0", "y1f": "y1"}


def _double_form(form: str) -> str:
    for single, double in _DOUBLE_NAMES.items():
        form = form.replace(single + "(", double + "(")
    return form.replace("1.0f", "1.0")


_UNARY_F64 = {op: _double_form(form) for op, form in _UNARY.items()}
_BINARY_F64 = {op: _double_form(form) for op, form in _BINARY.items()}


def buffer_c(name: str) -> str:
    """A buffer's name in CUDA text: `g_` (global memory) and its name, so that no buffer can take
    the name of a template's local variable (a user's input called `b` or `c`)."""
    return f"g_{name}"


def literal(value, dtype: DType) -> str:
    if dtype == DType.BOOL:  # a max (min) fold starts at -inf (inf): false (true), the least (greatest) bool
        return "true" if (value > 0 if isinstance(value, float) and math.isinf(value) else value) else "false"
    if not dtype.is_float:
        if isinstance(value, float) and math.isinf(value):  # a max or min fold's identity
            info = np.iinfo(dtype.numpy)
            value = int(info.max) if value > 0 else int(info.min)
        value = int(value)
        suffix = "LL" if dtype == DType.I64 else ""
        if value in (-(1 << 63), -(1 << 31)):  # the most negative literal is an expression in C
            return f"({value + 1}{suffix} - 1)"
        return f"{value}{suffix}"
    v = float(value)
    if math.isnan(v):
        return "NAN"
    if math.isinf(v):
        return "INFINITY" if v > 0 else "-INFINITY"
    text = repr(v)
    if dtype == DType.F64:  # repr gives the shortest text that reads back as the same double
        return text if ("." in text or "e" in text) else text + ".0"
    return text + ("f" if ("." in text or "e" in text) else ".0f")


def operand(value) -> str:
    return value if isinstance(value, str) else literal(value.value, value.dtype)


def statement(stmt, index_c, types: dict, vector_of: dict[str, str] | None = None,
              stored_to: dict[str, str] | None = None, load_from: dict[str, str] | None = None) -> str:
    """One Loop IR statement as C. `index_c(buffer, index)` gives the flat index text; `types`:
    buffer -> TensorType; `vector_of[name]`: the register array a vectorised load of `name` went
    into, `stored_to[buffer]`: the one a vectorised store to `buffer` comes from (lane `u`);
    `load_from[name]`: where a staged load of `name` reads instead (a shared-memory element)."""
    vector_of = vector_of or {}
    stored_to = stored_to or {}
    load_from = load_from or {}
    if isinstance(stmt, L.Init):
        register = stmt.dtype.accumulator  # a half accumulator is a float
        return f"{REGISTER[register]} {stmt.acc} = {literal(REDUCE_OPS[stmt.op], register)};"
    if isinstance(stmt, L.Accumulate):
        binary = _MONOID_OP.get(stmt.op, stmt.op)
        return f"{stmt.acc} = {_op(binary, (stmt.acc, operand(stmt.value)))};"
    if isinstance(stmt, L.Update):
        return f"{stmt.acc} = {operand(stmt.value)};"
    if isinstance(stmt, L.Store):
        storage = STORAGE[types[stmt.buffer].dtype]
        target = f"{stored_to[stmt.buffer]}.v[u]" if stmt.buffer in stored_to else \
            f"{buffer_c(stmt.buffer)}[{index_c(stmt.buffer, stmt.index)}]"
        return f"{target} = emmy::from_reg<{storage}>({operand(stmt.value)});"
    if isinstance(stmt, L.Loop):  # a loop nested in a row's element (a dot product a sweep computes)
        inner = [statement(s, index_c, types, vector_of, stored_to, load_from) for s in stmt.body]
        # nvcc unrolls a constant-trip loop whole; nested in a row's unrolled element loop that
        # multiplies live values past the register file (spills), so unrolling is bounded: an outer
        # nested loop not at all, the innermost by 4 (enough independent loads in flight)
        unroll = 1 if any(isinstance(s, L.Loop) for s in stmt.body) else 4
        return "\n".join([f"#pragma unroll {unroll}", f"for (int a{stmt.var} = 0; a{stmt.var} < {stmt.extent}; ++a{stmt.var}) {{",
                          *("  " + line for text in inner for line in text.split("\n")), "}"])
    if not isinstance(stmt, L.Assign):
        raise EmmyError(f"no C form for {type(stmt).__name__}")
    expr = stmt.expr
    if isinstance(expr, L.Load):
        if stmt.name in load_from:
            text = f"emmy::to_reg({load_from[stmt.name]})"
        elif stmt.name in vector_of:
            text = f"emmy::to_reg({vector_of[stmt.name]}.v[u])"
        else:
            text = f"emmy::to_reg({buffer_c(expr.buffer)}[{index_c(expr.buffer, expr.index)}])"
        if expr.guards:  # the load happens only where its guards hold (a conditional, not a select)
            condition = " && ".join(_guard(g) for g in expr.guards)
            text = f"(({condition}) ? {text} : {literal(0, stmt.dtype)})"
    elif isinstance(expr, L.Masked):
        condition = " && ".join(_guard(g) for g in expr.guards) or "true"
        text = f"(({condition}) ? {operand(expr.value)} : {literal(expr.fill, stmt.dtype)})"
    else:
        text = _op(expr.op, tuple(operand(a) for a in expr.args), stmt.dtype)
    # a half-precision result is rounded to its dtype; a load of a buffer of that dtype already is
    # (a fill of zero too), so rounding it again would cost a conversion an element for nothing
    exact = isinstance(expr, L.Load) and types[expr.buffer].dtype == stmt.dtype
    if stmt.dtype in _ROUND and not exact:
        text = f"{_ROUND[stmt.dtype]}({text})"
    return f"const {REGISTER[stmt.dtype]} {stmt.name} = {text};"


def _op(op: str, args: tuple[str, ...], dtype: DType | None = None) -> str:
    """`op` of `args` as C; `dtype` is the result's (f64 takes the double forms; a comparison's bool
    result has the same form for either)."""
    binary, unary = (_BINARY_F64, _UNARY_F64) if dtype == DType.F64 else (_BINARY, _UNARY)
    if dtype is not None and not dtype.is_float and op in _INTEGER:
        return _INTEGER[op].format(*args)
    if op in binary:
        return binary[op].format(*args)
    if op in unary:
        return unary[op].format(*args)
    if op == "where":
        return f"({args[0]} ? {args[1]} : {args[2]})"
    if op == "cast":
        return f"(({REGISTER[dtype]})({args[0]}))" if dtype is not None else args[0]
    raise EmmyError(f"no C form for the scalar op {op!r}")


def guards_c(guards) -> str:
    """Where every guard holds, as one C condition ("" for none)."""
    return " && ".join(_guard(g) for g in guards)


def _guard(g: Guard) -> str:
    text = affine_c(g.expr)
    parts = ([f"{text} >= {g.lo}"] if g.lo is not None else []) + ([f"{text} < {g.hi}"] if g.hi is not None else [])
    return "(" + " && ".join(parts) + ")"


def affine_c(a: Affine, names: dict[int, str] | None = None) -> str:
    """C text of an index expression; loop variable d<i> is `a<i>` unless `names` says otherwise."""
    names = names or {}
    parts = []
    quotients = {(atom.expr, atom.divisor): c for atom, c in a.terms if isinstance(atom, FloorDiv)}
    paired = {(atom.expr, atom.divisor) for atom, _ in a.terms if isinstance(atom, Mod)} & quotients.keys()
    for atom, c in a.terms:
        if isinstance(atom, (FloorDiv, Mod)) and (atom.expr, atom.divisor) in paired:
            if isinstance(atom, Mod):  # a*(e % q) + b*(e // q): e spelt once (emmy_rt.cuh)
                b = quotients[(atom.expr, atom.divisor)]
                parts.append(f"emmy::index_digits({affine_c(atom.expr, names)}, {atom.divisor}, {c}, {b})")
            continue
        if isinstance(atom, Dim):
            text = names.get(atom.index, f"a{atom.index}")
        elif isinstance(atom, Gathered):  # clamped into its axis, a bad value recorded (index_faults.py)
            ignoring = f"{atom.ignore}LL, {atom.fallback}LL, " if atom.ignore is not None else ""
            text = (f"emmy::gather_index({buffer_c(atom.buffer)}, {affine_c(atom.flat(), names)}, "
                    f"{math.prod(atom.shape)}, {ignoring}"
                    f"{atom.extent}, {'true' if atom.wrap else 'false'}, {buffer_c(INDEX_FAULTS)}, "
                    f"{tensor_code(atom.buffer)})")
        elif isinstance(atom, (FloorDiv, Mod)):  # C's / and % truncate: floor where it may be negative
            inner = affine_c(atom.expr, names)
            if never_negative(atom.expr):
                text = f"(({inner}) {'/' if isinstance(atom, FloorDiv) else '%'} {atom.divisor})"
            else:
                text = f"emmy::index_floor_{'div' if isinstance(atom, FloorDiv) else 'mod'}({inner}, {atom.divisor})"
        parts.append(text if c == 1 else f"{c} * {text}")
    if a.const or not parts:
        parts.append(str(a.const))
    return " + ".join(parts).replace("+ -", "- ")


def never_negative(a: Affine) -> bool:
    """Whether `a` is at least 0 at every coordinate, loop extents aside: a constant and terms
    that cannot be negative (loop variables, clamped gathered positions, remainders, quotients of
    such), so C's truncating / and % give its floor semantics."""
    return a.const >= 0 and all(
        c > 0 and (not isinstance(atom, FloorDiv) or never_negative(atom.expr)) for atom, c in a.terms)


# How Kernel IR's words for who works are spelt in CUDA.
WORKER_C = {"thread": "threadIdx.x", "warp": "threadIdx.x / 32", "alone": "0"}
ONLY_THREAD_C = {"first": "threadIdx.x == 0", "grid_first": "blockIdx.x == 0 && threadIdx.x == 0",
                 "output_lanes": "threadIdx.x < 32 && row_ok"}
_MERGE = {"sum": "{0} = {0} + {1};", "prod": "{0} = {0} * {1};", "max": "{0} = emmy::maximum({0}, {1});",
          "min": "{0} = emmy::minimum({0}, {1});"}


def merge_c(op: str, accs: tuple[str, ...], suffix: str) -> str:
    """The C statement that folds `<acc><suffix>_other` into `<acc><suffix>` (a monoid, or a twisted
    state merged by the runtime header's emmy::merge_softmax, merge_softmax_wsum or merge_welford)."""
    return _merge(op, [f"{a}{suffix}" for a in accs], [f"{a}{suffix}_other" for a in accs])


def merge_chunk_c(op: str, accs: tuple[str, ...]) -> str:
    """The C statements that fold a chunk's state (`accs`) into the row's (`<acc>_row`) and leave
    the total in `accs`."""
    rows = [f"{a}_row" for a in accs]
    return _merge(op, rows, accs) + " " + " ".join(f"{a} = {r};" for a, r in zip(accs, rows))


def _merge(op: str, mine: list[str], theirs) -> str:
    if op in ("softmax", "welford"):
        name = "softmax_wsum" if op == "softmax" and len(mine) == 3 else op  # attention's (m, d, z)
        return f"emmy::merge_{name}({', '.join(mine)}, {', '.join(theirs)});"
    return " ".join(_MERGE[op].format(m, t) for m, t in zip(mine, theirs))


def store_index_c(index) -> str:
    """A Kernel IR Store's index: a flat Affine, or a slot of a split row's workspace
    ([accumulator][row][slice], `row` and `slice` as RowIndex names them)."""
    if isinstance(index, PartialSlot):
        row = "(row & 1)" if index.alternate else "row"
        return f"({index.slot} * {index.rows} + {row}) * {index.split} + slice"
    return affine_c(index)


def stored_value_c(value) -> str:
    return value if isinstance(value, str) else repr(value)


def vector_index_c(access) -> str:
    """A VecLoad's or VecStore's flat index, its vector's loop variable read as the thread's `base`."""
    return affine_c(access.index, {access.base_var: "base"})


def panel_element_c(panel, row: str, col: str) -> str:
    """An element of a staged panel (K.Panel) in the current stage: `row`, `col` name the template's
    loop variables."""
    return f"{panel.name}_panel[(stage * {panel.rows} + {row}) * {panel.cols} + {col}]"


def micro_register_c(name: str, side: str) -> str:
    """A micro-tile's operand held in registers for this K step: its row (side "a") or column."""
    return f"{name}_reg[{'r' if side == 'a' else 'c'}]"
