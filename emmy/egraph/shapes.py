"""The shape analysis: carry `shape_of` (emmy.egraph.terms) from the Tensor IR values encoding
names to the terms rewrites create, so a rule that needs an operand's extents finds them on a term
made by another rule (a reduction pushed through a layout, then merged with the next one).

Only the terms whose shape follows from one literal or one operand get a rule: a reindex's shape is
its layout's, a reduction's is its operand's with the axis at extent 1, and a unary op keeps its
operand's. Each is matched once per new term (egglog matches new tuples only), so
a program pays one small Python call per reindex and reduction.
"""

from __future__ import annotations

from functools import lru_cache

from egglog import PyObject, String, eq, i64, rule, ruleset, set_, vars_

from emmy.egraph.layout import decode_layout
from emmy.egraph.terms import Term, shape_of

LABEL = "analysis.shapes"  # how saturation reports count the analysis's matches


def parse_shape(text: str) -> tuple[int, ...]:
    return tuple(int(s) for s in text.split(",")) if text else ()


def shape_text(shape) -> str:
    return ",".join(str(int(s)) for s in shape)


@lru_cache(maxsize=4096)
def layout_shape(layout_text: str) -> str:
    return shape_text(decode_layout(layout_text).shape)


@lru_cache(maxsize=4096)
def reduced_shape(shape: str, axis: int) -> str:
    """The shape of a reduction over `axis`: the operand's, with that axis at extent 1."""
    extents = list(parse_shape(shape))
    if 0 <= axis < len(extents):
        extents[axis] = 1
    return shape_text(extents)


_t, _x = vars_("t x", Term)
_op, _d, _layout, _shape = vars_("op d layout shape", String)
(_axis,) = vars_("axis", i64)

RULES = (
    rule(eq(_t).to(Term.reindex(_x, _layout))).then(
        set_(shape_of(_t)).to(PyObject(layout_shape)(PyObject.from_string(_layout)).to_string())),
    rule(eq(_t).to(Term.reduce(_op, _axis, _x)), eq(_shape).to(shape_of(_x))).then(
        set_(shape_of(_t)).to(PyObject(reduced_shape)(PyObject.from_string(_shape),
                                                      PyObject.from_int(_axis)).to_string())),
    rule(eq(_t).to(Term.unary(_op, _d, _x)), eq(_shape).to(shape_of(_x))).then(set_(shape_of(_t)).to(_shape)),
)


def units() -> list[tuple[str, object, tuple]]:
    """The analysis as saturation units (label, rule, its declarations), as RuleGroup.units are."""
    return [(LABEL, r, tuple(ruleset(r, name=f"emmy.{LABEL}.{k}").__egg_ruleset__.rules))
            for k, r in enumerate(RULES)]
