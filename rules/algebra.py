"""Algebra: constant folding, identities, division by constants, index-map
composition, and commutativity (bounded: one swap per node, never with
associativity; extraction then takes one canonical operand order)."""

from __future__ import annotations

from egglog import PyObject, String, f64, ne, rewrite, vars_

from emmy.egraph.layout import compose, scalar_unguarded, unguarded
from emmy.egraph.terms import Term
from emmy.rules import RuleGroup

x, y = vars_("x y", Term)
(d,) = vars_("d", String)
a, b = vars_("a b", f64)
inner, outer = vars_("inner outer", String)

algebra = RuleGroup("algebra", "algebra", "canonical forms: constants, identities, layouts, operand order")

for op, fn in (("add", lambda p, q: p + q), ("subtract", lambda p, q: p - q), ("multiply", lambda p, q: p * q)):
    algebra.rule(f"fold_{op}", f"{op}(literal a, literal b) -> literal",
                 rewrite(Term.binary(op, d, Term.literal(a, d), Term.literal(b, d))).to(Term.literal(fn(a, b), d),
                                                                                         ne(d).to(String("bool"))))

algebra.rule("multiply_one", "x * 1 -> x, 1 * x -> x",
             rewrite(Term.binary("multiply", d, x, Term.literal(1.0, d))).to(x),
             rewrite(Term.binary("multiply", d, Term.literal(1.0, d), x)).to(x))
algebra.rule("add_zero", "x + 0 -> x, 0 + x -> x",
             rewrite(Term.binary("add", d, x, Term.literal(0.0, d))).to(x),
             rewrite(Term.binary("add", d, Term.literal(0.0, d), x)).to(x))
algebra.rule("subtract_zero", "x - 0 -> x",
             rewrite(Term.binary("subtract", d, x, Term.literal(0.0, d))).to(x))
algebra.rule("divide_one", "x / 1 -> x",
             rewrite(Term.binary("divide", d, x, Term.literal(1.0, d))).to(x))
algebra.rule("divide_by_constant", "x / c -> x * (1/c) for a constant c != 0",
             rewrite(Term.binary("divide", d, x, Term.literal(a, d))).to(
                 Term.binary("multiply", d, x, Term.literal(f64(1.0) / a, d)), ne(a).to(f64(0.0))))

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
                 rewrite(Term.binary(op, d, x, y)).to(Term.binary(op, d, y, x)))

RULESETS = [algebra]
