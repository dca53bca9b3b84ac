"""Algebra: constant folding, identities, division by constants, index-map
composition, and commutativity (bounded: one swap per node, never with
associativity; extraction then takes one canonical operand order)."""

from __future__ import annotations

from egglog import BigInt, BigRat, PyObject, String, f64, ne, rewrite, vars_

from emmy.egraph.constants import denominator, exact_reciprocal, folded, numerator
from emmy.egraph.layout import compose, scalar_unguarded, unguarded
from emmy.egraph.terms import Term
from emmy.rules import RuleGroup

x, y = vars_("x y", Term)
(d,) = vars_("d", String)
a, b = vars_("a b", f64)
inner, outer = vars_("inner outer", String)

algebra = RuleGroup("algebra", "algebra", "canonical forms: constants, identities, layouts, operand order")

def _folded_value(op: str):
    """(the f64 of `a op b` computed in dtype d, its text: "" when it does not fold)."""
    text = PyObject(folded)(PyObject.from_string(String(op)), PyObject.from_string(a.to_string()),
                            PyObject.from_string(b.to_string()), PyObject.from_string(d)).to_string()
    part = lambda fn: BigInt.from_string(PyObject(fn)(PyObject.from_string(text)).to_string())  # noqa: E731
    return BigRat(part(numerator), part(denominator)).to_f64(), text


for op in ("add", "subtract", "multiply"):
    value, text = _folded_value(op)
    algebra.rule(f"fold_{op}", f"{op}(literal a, literal b) -> literal, computed and rounded in the dtype",
                 rewrite(Term.binary(op, d, Term.literal(a, d), Term.literal(b, d))).to(
                     Term.literal(value, d), ne(text).to(String(""))))

algebra.rule("multiply_one", "x * 1 -> x, 1 * x -> x",
             rewrite(Term.binary("multiply", d, x, Term.literal(1.0, d))).to(x),
             rewrite(Term.binary("multiply", d, Term.literal(1.0, d), x)).to(x))
algebra.rule("add_zero", "x + 0 -> x, 0 + x -> x",
             rewrite(Term.binary("add", d, x, Term.literal(0.0, d))).to(x),
             rewrite(Term.binary("add", d, Term.literal(0.0, d), x)).to(x),
             approximate="the sign of a zero: -0.0 + 0.0 is +0.0")
algebra.rule("subtract_zero", "x - 0 -> x",
             rewrite(Term.binary("subtract", d, x, Term.literal(0.0, d))).to(x))
algebra.rule("divide_one", "x / 1 -> x",
             rewrite(Term.binary("divide", d, x, Term.literal(1.0, d))).to(x))
# 1/c must be exact (c a power of two) and normal in the dtype: then the product has the quotient's bits
_exact_reciprocal = PyObject(exact_reciprocal)(PyObject.from_string(a.to_string()), PyObject.from_string(d)).to_string()
algebra.rule("divide_by_constant", "x / c -> x * (1/c) for a power of two c whose reciprocal is a normal number",
             rewrite(Term.binary("divide", d, x, Term.literal(a, d))).to(
                 Term.binary("multiply", d, x, Term.literal(f64(1.0) / a, d)), ne(_exact_reciprocal).to(String(""))))

_composed = PyObject(compose)(PyObject.from_string(inner), PyObject.from_string(outer)).to_string()
algebra.rule("compose_layouts", "reindex(reindex(x, m1), m2) -> reindex(x, m1 then m2)",
             rewrite(Term.reindex(Term.reindex(x, inner), outer)).to(Term.reindex(x, _composed),
                                                                      ne(_composed).to(String(""))))

_scalar = PyObject(scalar_unguarded)(PyObject.from_string(outer)).to_string()
algebra.rule("scalar_literal", "reindex(literal, rank-0 identity) -> literal",
             rewrite(Term.reindex(Term.literal(a, d), outer)).to(Term.literal(a, d), ne(_scalar).to(String(""))))

_unguarded = PyObject(unguarded)(PyObject.from_string(outer)).to_string()
algebra.rule("cast_before_layout", "cast(reindex(x, m)) -> reindex(cast(x), m) for m without guards "
             "(casts meet, so a rounding round trip shows: half-precision softmax(...) @ v)",
             rewrite(Term.unary("cast", d, Term.reindex(x, outer))).to(
                 Term.reindex(Term.unary("cast", d, x), outer), ne(_unguarded).to(String(""))))

for op in ("add", "multiply", "maximum", "minimum"):
    algebra.rule(f"commute_{op}", f"{op}(x, y) -> {op}(y, x)",
                 rewrite(Term.binary(op, d, x, y)).to(Term.binary(op, d, y, x)),
                 # max(+0.0, -0.0): numpy returns the first operand, and IEEE maxNum leaves the choice open
                 approximate="" if op in ("add", "multiply") else f"the sign of a zero: {op}(+0.0, -0.0)")

RULESETS = [algebra]
