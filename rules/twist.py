"""The twist: a reduction that reads another reduction over the same axis
through exp(x - max) becomes one fold (DESIGN.md section 3).

sum(exp(s - max(s))) over an axis, the softmax normaliser, is folded with
state (m, d) into `online_sum`: one pass over s instead of two. The rule
matches the structure, so torch.softmax, log_softmax, a hand-written
exp/amax/sum and the softmax inside attention all reach it; the multi-pass
form stays in the e-graph beside it.
"""

from __future__ import annotations

from egglog import PyObject, String, f64, i64, ne, rewrite, vars_

from emmy.egraph.layout import decode_layout
from emmy.egraph.terms import Term
from emmy.rules import RuleGroup

s, = vars_("s", Term)
d, layout = vars_("d layout", String)
(axis,) = vars_("axis", i64)


def broadcasts_back_along(layout_text: str, axis: int) -> str:
    """"yes" if the layout reads a keepdim reduction over `axis` back at every position of that axis."""
    layout = decode_layout(layout_text)
    if layout.guards or not 0 <= axis < len(layout.index):
        return ""
    for k, expr in enumerate(layout.index):
        wanted = 0 if k == axis else None
        if wanted is not None:
            if not (expr.is_constant and expr.const == 0):
                return ""
        elif expr.as_dim() != k:
            return ""
    return "yes"


_broadcast = PyObject(broadcasts_back_along)(PyObject.from_string(layout), PyObject.from_int(axis)).to_string()

twist = RuleGroup("twist", "twist", "one-pass folds for reductions that read another reduction over the same axis")
twist.rule(
    "online_softmax_normaliser",
    "sum(exp(s - max(s))) over an axis -> online_sum: one pass with state (m, d)",
    rewrite(Term.reduce("sum", axis, Term.unary("exp", d, Term.binary(
        "subtract", d, s, Term.reindex(Term.reduce("max", axis, s), layout))))).to(
        Term.online_sum(axis, s), ne(_broadcast).to(String(""))),
)

RULESETS = [twist]


def mean_along(layout_text: str, axis: int, scale_text: str) -> str:
    """"yes" if the layout broadcasts back along `axis` and the scale is 1/extent of that axis (a mean)."""
    if not broadcasts_back_along(layout_text, axis):
        return ""
    extent = decode_layout(layout_text).shape[axis]
    return "yes" if extent and abs(float(scale_text) * extent - 1.0) <= 1e-9 else ""


x, centred = vars_("x centred", Term)
(k,) = vars_("k", f64)
_is_mean = PyObject(mean_along)(PyObject.from_string(layout), PyObject.from_int(axis),
                                PyObject.from_string(k.to_string())).to_string()


def _centred(mean: Term) -> Term:
    return Term.binary("subtract", d, x, Term.reindex(mean, layout))


twist.rule(
    "welford_variance",
    "sum((x - mean(x))^2) over an axis -> welford_m2: one pass with state (n, mean, m2)",
    rewrite(Term.reduce("sum", axis, Term.binary("multiply", d, _centred(
        Term.binary("multiply", d, Term.reduce("sum", axis, x), Term.literal(k, d))),
        _centred(Term.binary("multiply", d, Term.reduce("sum", axis, x), Term.literal(k, d)))))).to(
        Term.welford_m2(axis, x), ne(_is_mean).to(String(""))),
)
