"""The twist: a reduction that reads another reduction over the same axis
through exp(x - max) becomes one fold.

sum(exp(s - max(s))) over an axis, the softmax normaliser, is folded with
state (m, d) into `online_sum`: one pass over s instead of two. A weighted
sum of softmax(s) (attention's `softmax(q @ k.T) @ v`) is folded with state
(m, d, z) into `softmax_wsum`: one pass over the keys instead of three. The rule
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
    approximate="the sum in another order, rounded once", ulps=2,
)



def carries_axis(layout_text: str, out_axis: int, in_axis: int, source_text: str) -> str:
    """"yes" if the layout (no guards) reads input axis `in_axis` exactly from output axis
    `out_axis`, over the input's whole extent (taken from `source_text`, a layout whose output
    has the input's shape), and no other input position depends on `out_axis`: then softmax over
    `out_axis` of the reindexed scores is the reindexed softmax over `in_axis`."""
    layout, source = decode_layout(layout_text), decode_layout(source_text)
    if layout.guards or not 0 <= in_axis < len(layout.index) or not 0 <= out_axis < len(layout.shape):
        return ""
    if layout.index[in_axis].as_dim() != out_axis or layout.shape[out_axis] != source.shape[in_axis]:
        return ""
    if any(out_axis in expr.dims() for k, expr in enumerate(layout.index) if k != in_axis):
        return ""
    return "yes"


e, w = vars_("e w", Term)
lm, lb, l1 = vars_("lm lb l1", String)
(ax,) = vars_("ax", i64)
_exp_shifted = Term.unary("exp", d, Term.binary("subtract", d, s, Term.reindex(Term.reduce("max", axis, s), lm)))
_softmax = Term.binary("divide", d, _exp_shifted, Term.reindex(Term.reduce("sum", axis, _exp_shifted), lb))


def _yes(fn, *args):
    return ne(PyObject(fn)(*args).to_string()).to(String(""))


_weighted_sum_guards = (
    _yes(broadcasts_back_along, PyObject.from_string(lm), PyObject.from_int(axis)),
    _yes(broadcasts_back_along, PyObject.from_string(lb), PyObject.from_int(axis)),
    _yes(carries_axis, PyObject.from_string(l1), PyObject.from_int(ax), PyObject.from_int(axis),
         PyObject.from_string(lm)),
)
twist.rule(
    "online_softmax_weighted_sum",
    "sum(softmax(s) * w) over the softmax axis -> softmax_wsum: one pass with state (m, d, z)",
    rewrite(Term.reduce("sum", ax, Term.binary("multiply", d, Term.reindex(_softmax, l1), w))).to(
        Term.softmax_wsum(ax, Term.reindex(s, l1), w), *_weighted_sum_guards),
    approximate="the sums in another order, rounded once", ulps=2,
)
(half,) = vars_("half", String)
twist.rule(
    "online_softmax_weighted_sum_rounded",
    "the same when the probabilities are rounded to f16/bf16 and widened back (a half-precision "
    "`softmax(...) @ v`): the fold keeps them in f32, as flash attention keeps them in registers",
    rewrite(Term.reduce("sum", ax, Term.binary("multiply", d, Term.reindex(
        Term.unary("cast", d, Term.unary("cast", half, _softmax)), l1), w))).to(
        Term.softmax_wsum(ax, Term.reindex(s, l1), w), *_weighted_sum_guards, ne(half).to(String("f32"))),
    approximate="the probabilities are not rounded to half precision: no farther from the exact sum than the "
                "rounded left side", ulps=2,
)

RULESETS = [twist]


def mean_along(layout_text: str, axis: int, scale_text: str, divides: bool = False) -> str:
    """"yes" if the layout broadcasts back along `axis` and the scale makes a mean of a sum along
    it: 1/extent as a factor, or (`divides`) the extent as a divisor; else ""."""
    if not broadcasts_back_along(layout_text, axis):
        return ""
    extent = decode_layout(layout_text).shape[axis]
    scale = float(scale_text)
    if divides:
        return "yes" if extent and scale == extent else ""
    return "yes" if extent and abs(scale * extent - 1.0) <= 1e-9 else ""


x, centred = vars_("x centred", Term)
(k,) = vars_("k", f64)


def _is_mean(divides: bool):
    return PyObject(mean_along)(PyObject.from_string(layout), PyObject.from_int(axis),
                                PyObject.from_string(k.to_string()), PyObject(divides)).to_string()


def _centred(mean: Term) -> Term:
    return Term.binary("subtract", d, x, Term.reindex(mean, layout))


def _square_of_centred(op: str) -> Term:
    """(x - mean(x))^2, the mean a sum times 1/n or divided by n (`op`), as a multiply of the two."""
    mean = Term.binary(op, d, Term.reduce("sum", axis, x), Term.literal(k, d))
    return Term.binary("multiply", d, _centred(mean), _centred(mean))


twist.rule(
    "welford_variance",
    "sum((x - mean(x))^2) over an axis -> welford_m2: one pass with state (n, mean, m2); the mean a sum "
    "times 1/n (n a power of two) or divided by n",
    rewrite(Term.reduce("sum", axis, _square_of_centred("multiply"))).to(
        Term.welford_m2(axis, x), ne(_is_mean(False)).to(String(""))),
    rewrite(Term.reduce("sum", axis, _square_of_centred("divide"))).to(
        Term.welford_m2(axis, x), ne(_is_mean(True)).to(String(""))),
    approximate="Welford's updates instead of two passes: no farther from the exact sum of squares", ulps=2,
)
