"""A rewrite's two sides as patterns: find where the left side matches in an e-graph, and evaluate
either side on arrays. emmy.testing checks rules with both: a rule is sound when its right side
gives what its left side gives for every binding of its variables.

Evaluation follows the Tensor IR reference interpreter (emmy.tensor_ir.interpreter): scalar ops
compute and round in their dtype, sums accumulate in f64, index maps gather. With `exact=True`
nothing rounds (f64 throughout, a cast between float types included; literals keep their dtype's
value, being constants of the program): the value an approximate rule's right side is measured
against. The one-pass folds
(online_sum, welford_m2, softmax_wsum) are evaluated by their definitions in f64 and rounded once
to their dtype, as a kernel's final store rounds them.
"""

from __future__ import annotations

import pickle
from dataclasses import dataclass
from fractions import Fraction
from itertools import product

import numpy as np
from egglog.declarations import (CallDecl, ClassMethodRef, EqDecl, ExprFactDecl, FunctionRef, InitRef, LitDecl,
                                 MethodRef, PyObjectDecl, TypedExprDecl, UnboundVarDecl)

from emmy.dtypes import DType, to_storage
from emmy.egraph.layout import decode_layout
from emmy.egraph.shapes import shape_text
from emmy.tensor_ir.interpreter import apply_scalar, index_map, reduce_axis
from emmy.tensor_ir.nodes import IndexMap, TensorType
from emmy.tensor_ir.scalar_ops import SCALAR_OPS

# What a primitive argument of each Term constructor means: the checker picks values by role.
ROLES = {
    ("literal", 0): "number", ("literal", 1): "dtype",
    ("unary", 0): "unary_op", ("unary", 1): "dtype",
    ("binary", 0): "binary_op", ("binary", 1): "dtype",
    ("select", 0): "dtype",
    ("reduce", 0): "monoid", ("reduce", 1): "axis",
    ("reindex", 1): "layout",
    ("online_sum", 0): "axis", ("welford_m2", 0): "axis", ("softmax_wsum", 0): "axis",
    ("buffer", 0): "name", ("buffer", 1): "shape", ("buffer", 2): "dtype",
}


class Unfit(Exception):
    """A binding the pattern cannot be evaluated on (shapes that do not meet, a gathered index)."""


@dataclass(frozen=True)
class Value:
    """A tensor value in interpreter storage, with its dtype (bf16 lives in float32 arrays)."""
    array: np.ndarray
    dtype: DType


def term_kind(decl) -> str | None:
    if isinstance(decl, CallDecl) and isinstance(decl.callable, ClassMethodRef) \
            and decl.callable.ident.name == "Term":
        return decl.callable.method_name
    return None


def pattern_variables(decl) -> dict[str, tuple[str, str]]:
    """Each variable of a pattern: (its sort, its role among a Term's arguments: ROLES, or "term")."""
    found: dict[str, tuple[str, str]] = {}
    todo = [(decl, "Term", "term")]
    while todo:
        node, sort, role = todo.pop()
        if isinstance(node, UnboundVarDecl):
            found.setdefault(node.name, (sort, role))
        elif isinstance(node, CallDecl):
            kind = term_kind(node)
            for position, arg in enumerate(node.args):
                arg_role = ROLES.get((kind, position), "term") if kind else "computed"
                if kind == "select" and position == 1:
                    arg_role = "condition"
                todo.append((arg.expr, arg.tp.ident.name, arg_role))
    return found


def matches(view, pattern, limit: int = 64) -> list[dict]:
    """Bindings of `pattern`'s variables (Term variables to e-class ids, the rest to values) at
    which it matches some e-class of `view` (an EGraphView), at most `limit` of them."""
    kind = term_kind(pattern)
    found: list[dict] = []
    for cid, nodes in view.classes.items():
        if kind is not None and not any(n.kind == kind for n in nodes):
            continue
        for binding in _match(view, pattern, cid, {}):
            found.append(binding)
            if len(found) >= limit:
                return found
    return found


def _match(view, pattern, cid: str, binding: dict):
    """Bindings extending `binding` under which `pattern` matches e-class `cid` (a generator; the
    depth is the pattern's, a handful of levels)."""
    if isinstance(pattern, UnboundVarDecl):
        if pattern.name in binding:
            if binding[pattern.name] == cid:
                yield binding
        else:
            yield {**binding, pattern.name: cid}
        return
    kind = term_kind(pattern)
    if kind is None:
        return
    for node in view.classes.get(cid, ()):
        if node.kind != kind or len(node.args) != len(pattern.args):
            continue
        yield from _match_args(view, pattern.args, node.args, binding)


def _match_args(view, patterns, args, binding: dict):
    if not patterns:
        yield binding
        return
    first, rest = patterns[0].expr, patterns[1:]
    arg = args[0]
    if patterns[0].tp.ident.name == "Term":
        for extended in _match(view, first, arg, binding):
            yield from _match_args(view, rest, args[1:], extended)
        return
    if isinstance(first, LitDecl):
        if _same(first.value, arg):
            yield from _match_args(view, rest, args[1:], binding)
    elif isinstance(first, UnboundVarDecl):
        if first.name in binding:
            if _same(binding[first.name], arg):
                yield from _match_args(view, rest, args[1:], binding)
        else:
            yield from _match_args(view, rest, args[1:], {**binding, first.name: arg})


def _same(a, b) -> bool:
    if isinstance(a, float) and isinstance(b, float) and np.isnan(a) and np.isnan(b):
        return True
    return type(a) is type(b) and a == b or (isinstance(a, (int, float)) and isinstance(b, (int, float))
                                             and not isinstance(a, bool) and float(a) == float(b))


def _unbound(decl, env: dict) -> bool:
    if isinstance(decl, TypedExprDecl):
        decl = decl.expr
    return isinstance(decl, UnboundVarDecl) and decl.name not in env


def holds(conditions, env: dict) -> bool:
    """Whether every condition of a rewrite holds under `env` (its variables' values). A condition
    eq(v).to(expr) with v not yet bound binds it in `env`, as egglog's query does."""
    for fact in conditions:
        if isinstance(fact, ExprFactDecl):
            if not evaluate(fact.typed_expr.expr, env):
                return False
        elif isinstance(fact, EqDecl) and _unbound(fact.left, env):
            env[fact.left.name] = evaluate(fact.right, env)  # a condition that binds: eq(var).to(f(...))
        elif isinstance(fact, EqDecl):
            if not _same(evaluate(fact.left, env), evaluate(fact.right, env)):
                return False
        else:  # pragma: no cover - egglog's fact kinds are closed
            raise Unfit(f"condition {type(fact).__name__}")
    return True


def evaluate(decl, env: dict, exact: bool = False):
    """The value of a pattern (a Term: Value; a primitive: its Python value) under `env`."""
    if isinstance(decl, TypedExprDecl):
        decl = decl.expr
    if isinstance(decl, UnboundVarDecl):
        return env[decl.name]
    if isinstance(decl, LitDecl):
        return decl.value
    if isinstance(decl, PyObjectDecl):
        return pickle.loads(decl.pickled)
    if not isinstance(decl, CallDecl):
        raise Unfit(f"cannot evaluate {type(decl).__name__}")
    kind = term_kind(decl)
    args = [evaluate(a.expr, env, exact) for a in decl.args]
    if kind is not None:
        return _TERMS[kind](*args, exact=exact)
    ref = decl.callable
    if isinstance(ref, FunctionRef):
        return _FUNCTIONS[ref.ident.name](*args)
    if isinstance(ref, InitRef) and ref.ident.name == "BigRat":
        return Fraction(*args)
    if isinstance(ref, (MethodRef, ClassMethodRef)):
        name = ref.method_name
        if name == "__call__":
            return args[0](*args[1:])
        if name == "from_string" and ref.ident.name == "BigInt":
            return int(args[0])
        if name not in _METHODS:
            raise Unfit(f"cannot evaluate {ref.ident.name}.{name}")
        return _METHODS[name](*args)
    raise Unfit(f"cannot evaluate a call of {ref}")


def _shape_of(value) -> str:
    """terms.shape_of: the shape of a Term value, as encoding writes it."""
    if not isinstance(value, Value):
        raise Unfit("shape_of of a primitive")
    return shape_text(value.array.shape)


_FUNCTIONS = {"!=": lambda a, b: not _same(a, b), "==": lambda a, b: _same(a, b), "shape_of": _shape_of}
_METHODS = {
    "__add__": lambda a, b: a + b, "__sub__": lambda a, b: a - b, "__mul__": lambda a, b: a * b,
    "__truediv__": lambda a, b: a / b if b else float("nan"), "__neg__": lambda a: -a, "__abs__": abs,
    "__lt__": lambda a, b: a < b, "__le__": lambda a, b: a <= b, "__gt__": lambda a, b: a > b,
    "__ge__": lambda a, b: a >= b, "min": min, "max": max,
    "to_string": lambda v: v if isinstance(v, str) else repr(float(v)) if isinstance(v, float) else str(v),
    "from_string": lambda s: s, "from_int": lambda i: i, "to_bool": bool, "to_f64": float, "to_i64": int,
}


def _literal(value, dtype, exact=False) -> Value:
    kind = DType.parse(dtype)
    with np.errstate(over="ignore"):  # a literal beyond the dtype's range is its infinity
        return Value(to_storage(np.asarray(float(value), np.float64), kind), kind)


def _shape(*values: Value) -> tuple[int, ...]:
    try:
        return np.broadcast_shapes(*(v.array.shape for v in values))
    except ValueError as err:
        raise Unfit(f"shapes {[v.array.shape for v in values]} do not meet") from err


def _scalar(op: str, dtype: str, *operands: Value, exact: bool) -> Value:
    if op not in SCALAR_OPS:
        raise Unfit(f"unknown scalar op {op}")
    kind = DType.parse(dtype)
    shape = _shape(*operands)
    exact_cast = SCALAR_OPS[op].kind == "cast" and kind.is_float and operands[0].dtype.is_float
    if exact and (SCALAR_OPS[op].kind == "arith" or exact_cast) and kind.is_float:
        with np.errstate(all="ignore"):
            arrays = [np.asarray(v.array, dtype=np.float64) for v in operands]
            result = arrays[0] if exact_cast else SCALAR_OPS[op].apply(*arrays)
        return Value(np.broadcast_to(np.asarray(result, dtype=np.float64), shape), kind)
    arrays = [v.array for v in operands]
    if not exact:
        arrays = [to_storage(a, v.dtype) for a, v in zip(arrays, operands)]
    return Value(np.broadcast_to(apply_scalar(op, kind, arrays), shape), kind)


def _unary(op, dtype, a, exact=False) -> Value:
    return _scalar(op, dtype, a, exact=exact)


def _binary(op, dtype, a, b, exact=False) -> Value:
    return _scalar(op, dtype, a, b, exact=exact)


def _select(dtype, cond, a, b, exact=False) -> Value:
    return _scalar("where", dtype, cond, a, b, exact=exact)


def _axis(x: Value, axis) -> int:
    if not isinstance(axis, int) or not 0 <= axis < x.array.ndim:
        raise Unfit(f"axis {axis} of a rank-{x.array.ndim} value")
    return axis


def _reduce(op, axis, x: Value, exact=False) -> Value:
    axis = _axis(x, axis)
    if op not in ("sum", "prod", "max", "min"):
        raise Unfit(f"unknown monoid {op}")
    if exact and x.dtype.is_float:
        fn = {"sum": np.sum, "prod": np.prod, "max": np.max, "min": np.min}[op]
        with np.errstate(all="ignore"):
            return Value(fn(np.asarray(x.array, np.float64), axis=axis, keepdims=True), x.dtype)
    return Value(reduce_axis(op, x.array, axis, x.dtype), x.dtype)


def _reindex(x: Value, layout, exact=False) -> Value:
    try:
        decoded = decode_layout(layout)
    except Exception as err:
        raise Unfit(f"not a layout: {layout!r}") from err
    node = IndexMap("r", TensorType(decoded.shape, x.dtype), "x", decoded.index, decoded.guards, decoded.fill)
    try:
        return Value(index_map(node, np.asarray(x.array), use_views=False), x.dtype)
    except (IndexError, KeyError, ValueError, TypeError) as err:  # a gather, or a map of another shape
        raise Unfit(f"layout does not apply: {err}") from err


def _mat(x: Value, exact=False) -> Value:
    return x


def _fold(result: np.ndarray, like: Value, exact: bool) -> Value:
    return Value(result if exact else to_storage(result, like.dtype), like.dtype)


def _online_sum(axis, s: Value, exact=False) -> Value:
    axis, v = _axis(s, axis), np.asarray(s.array, np.float64)
    with np.errstate(all="ignore"):
        result = np.sum(np.exp(v - np.max(v, axis=axis, keepdims=True)), axis=axis, keepdims=True)
    return _fold(result, s, exact)


def _welford_m2(axis, x: Value, exact=False) -> Value:
    axis, v = _axis(x, axis), np.asarray(x.array, np.float64)
    with np.errstate(all="ignore"):
        result = np.sum((v - np.mean(v, axis=axis, keepdims=True)) ** 2, axis=axis, keepdims=True)
    return _fold(result, x, exact)


def _softmax_wsum(axis, s: Value, w: Value, exact=False) -> Value:
    axis = _axis(s, axis)
    if s.array.shape != w.array.shape:
        raise Unfit("softmax_wsum of values of two shapes")
    v, weights = np.asarray(s.array, np.float64), np.asarray(w.array, np.float64)
    with np.errstate(all="ignore"):
        e = np.exp(v - np.max(v, axis=axis, keepdims=True))
        result = np.sum(e * weights, axis=axis, keepdims=True) / np.sum(e, axis=axis, keepdims=True)
    return _fold(result, w, exact)


def _buffer(name, shape, dtype, exact=False) -> Value:
    raise Unfit("a buffer in a rule: its contents are the program's")


_TERMS = {"literal": _literal, "unary": _unary, "binary": _binary, "select": _select, "reduce": _reduce,
          "reindex": _reindex, "mat": _mat, "online_sum": _online_sum, "welford_m2": _welford_m2,
          "softmax_wsum": _softmax_wsum, "buffer": _buffer}


def role_choices(role: str, dtypes: tuple[str, ...]) -> list:
    """Values a synthesized binding tries for a primitive variable of this role ([] when it must come
    from a match: layouts, names)."""
    if role == "dtype":
        return list(dtypes)
    if role == "unary_op":
        return [op.name for op in SCALAR_OPS.values() if op.arity == 1 and op.kind == "arith" and op.on_floats]
    if role == "binary_op":
        return [op.name for op in SCALAR_OPS.values()
                if op.arity == 2 and op.kind in ("arith", "compare") and op.on_floats]
    if role == "monoid":
        return ["sum", "prod", "max", "min"]
    if role == "axis":
        return [0]
    if role == "number":
        return list(SPECIAL_NUMBERS)
    return []


SPECIAL_NUMBERS = (0.0, -0.0, 1.0, -1.0, 2.0, 0.5, 3.0, 0.1, -7.0, 1e-3, 7e4, 1e-6, 3e38, 1e-40,
                   float("inf"), float("-inf"), float("nan"))


def synthesized(variables: dict[str, tuple[str, str]], dtypes: tuple[str, ...], rng, limit: int) -> list[dict]:
    """Bindings of the primitive variables drawn from their roles' choices (Term variables are left
    for the caller to fill), at most `limit`; [] when some variable can only come from a match."""
    choices = {}
    for name, (sort, role) in variables.items():
        if sort == "Term":
            continue
        options = role_choices(role, dtypes)
        if not options:
            return []
        choices[name] = options
    names = sorted(choices)
    every = list(product(*(choices[n] for n in names)))
    if len(every) > limit:
        every = [every[i] for i in rng.choice(len(every), size=limit, replace=False)]
    return [dict(zip(names, combo)) for combo in every]
