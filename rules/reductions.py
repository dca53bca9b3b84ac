"""Folds over adjacent axes merged into one fold over their product.

`x.sum(-1).sum(-1)` is two folds, with a layout between them when keepdim
is False (it drops the first fold's axis), and without one when it is True.
Folds of one monoid over adjacent axes of one operand become one fold over
the two axes merged, read through a reshape (the row a single multi-axis
`sum(dim=(1, 2))` is lowered to): one kernel reading each element once, with
a row long enough to fill the GPU, instead of a second kernel (or a nested
loop) over the first fold's partial results. Through a layout, the rule
applies only where the layout reads the outer fold's axis plainly and whole
from one axis of the inner fold, next to the inner fold's axis; a chain of
three merges step by step (the shape analysis gives the merged read its
extents).
"""

from __future__ import annotations

from functools import lru_cache

from egglog import BigInt, BigRat, PyObject, String, eq, i64, ne, rewrite, vars_

from emmy.affine import Affine
from emmy.egraph.layout import Layout, compose, decode_layout, encode_layout
from emmy.egraph.shapes import parse_shape, reduced_shape
from emmy.egraph.terms import Term, shape_of
from emmy.rules import RuleGroup
from emmy.tensor_ir.builder import reshape_index

(x,) = vars_("x", Term)
layout, shape = vars_("layout shape", String)
a, b = vars_("a b", i64)

reductions = RuleGroup("reductions", "algebra", "folds of one monoid over adjacent axes merged into one")


@lru_cache(maxsize=4096)
def carried_axis(layout_text: str, axis: int, source_shape: str) -> str:
    """The operand axis (as text) that an unguarded layout reads output axis `axis` from, plainly
    (index d_axis) and whole (the extents agree), with no other operand axis depending on `axis`;
    "" when there is none. Then folding the layout's output over `axis` is folding the operand
    over that axis, in the same order."""
    layout, shape = decode_layout(layout_text), parse_shape(source_shape)
    if layout.guards or len(layout.index) != len(shape) or not 0 <= axis < len(layout.shape):
        return ""
    carriers = [k for k, expr in enumerate(layout.index) if axis in expr.dims()]
    if len(carriers) != 1 or layout.index[carriers[0]].as_dim() != axis:
        return ""
    if shape[carriers[0]] != layout.shape[axis]:
        return ""  # a slice of the axis, or a broadcast of it
    return str(carriers[0])


@lru_cache(maxsize=4096)
def layout_of_fold(layout_text: str, axis: int, source_shape: str) -> str:
    """The layout reading the operand's fold (over the carried axis) back as the fold of the
    layout's output over `axis`: the same map with that axis at extent 1 and read at 0."""
    carried = carried_axis(layout_text, axis, source_shape)
    if not carried:
        return ""
    layout = decode_layout(layout_text)
    shape = list(layout.shape)
    shape[axis] = 1
    index = list(layout.index)
    index[int(carried)] = Affine.constant(0)
    return encode_layout(Layout(tuple(shape), tuple(index)))


def _merged_extents(source_shape: str, a: int, b: int) -> tuple[tuple[int, ...], int] | None:
    """The operand's extents with axes a and b (adjacent) merged, and the merged axis; None if not
    adjacent axes of it."""
    shape = parse_shape(source_shape)
    lo = min(a, b)
    if abs(a - b) != 1 or lo < 0 or max(a, b) >= len(shape):
        return None
    return (*shape[:lo], shape[lo] * shape[lo + 1], *shape[lo + 2:]), lo


@lru_cache(maxsize=4096)
def merging_layout(source_shape: str, a: int, b: int) -> str:
    """The reshape reading the operand with axes a and b (adjacent) merged into one; "" when they
    are not adjacent axes of it."""
    merged = _merged_extents(source_shape, a, b)
    if merged is None:
        return ""
    shape, _ = merged
    return encode_layout(Layout(shape, tuple(reshape_index(parse_shape(source_shape), shape))))


@lru_cache(maxsize=4096)
def splitting_layout(source_shape: str, a: int, b: int) -> str:
    """The reshape reading the merged fold (extent 1 at the merged axis) back with extent 1 at
    both axes: the shape the two folds had."""
    merged = _merged_extents(source_shape, a, b)
    if merged is None:
        return ""
    shape, lo = merged
    out = list(parse_shape(source_shape))
    out[a] = out[b] = 1
    return encode_layout(Layout(tuple(out), tuple(reshape_index((*shape[:lo], 1, *shape[lo + 1:]), out))))


@lru_cache(maxsize=4096)
def _through(layout_text: str, outer_axis: int, inner_axis: int, source_shape: str) -> tuple[str, str, str]:
    """For fold(outer_axis, reindex(fold(inner_axis, y), layout)) with y of `source_shape`: (the
    layout merging y's two folded axes, the merged axis, the layout reading the merged fold back
    as the left side's result); ("", "", "") when the layout does not carry the outer fold's axis
    from an axis of the inner fold next to its own."""
    folded = reduced_shape(source_shape, inner_axis)
    carried = carried_axis(layout_text, outer_axis, folded)
    if not carried or abs(int(carried) - inner_axis) != 1:
        return "", "", ""
    merging = merging_layout(source_shape, inner_axis, int(carried))
    back = compose(splitting_layout(source_shape, inner_axis, int(carried)),
                   layout_of_fold(layout_text, outer_axis, folded))
    return (merging, str(min(inner_axis, int(carried))), back) if merging and back else ("", "", "")


def through_merging(layout_text: str, outer_axis: int, inner_axis: int, source_shape: str) -> str:
    return _through(layout_text, outer_axis, inner_axis, source_shape)[0]


def through_axis(layout_text: str, outer_axis: int, inner_axis: int, source_shape: str) -> str:
    return _through(layout_text, outer_axis, inner_axis, source_shape)[1]


def through_back(layout_text: str, outer_axis: int, inner_axis: int, source_shape: str) -> str:
    return _through(layout_text, outer_axis, inner_axis, source_shape)[2]


def _text(fn, *args) -> String:
    return PyObject(fn)(*args).to_string()


def _axis_of(text: String) -> i64:
    return BigRat(BigInt.from_string(text), BigInt.from_string("1")).to_f64().to_i64()


# egglog reads a function's value in a rule's query only, so the operand's shape is bound there.
_merging = _text(merging_layout, PyObject.from_string(shape), PyObject.from_int(a), PyObject.from_int(b))
_splitting = _text(splitting_layout, PyObject.from_string(shape), PyObject.from_int(a), PyObject.from_int(b))
_through_args = (PyObject.from_string(layout), PyObject.from_int(a), PyObject.from_int(b), PyObject.from_string(shape))
_through_merging = _text(through_merging, *_through_args)


def _merges(monoid: str):
    """The rewrites merging two folds of `monoid`: directly (keepdim) and through a layout."""
    direct = rewrite(Term.reduce(monoid, a, Term.reduce(monoid, b, x))).to(
        Term.reindex(Term.reduce(monoid, a.min(b), Term.reindex(x, _merging)), _splitting),
        eq(shape).to(shape_of(x)), ne(_merging).to(String("")))
    through = rewrite(Term.reduce(monoid, a, Term.reindex(Term.reduce(monoid, b, x), layout))).to(
        Term.reindex(Term.reduce(monoid, _axis_of(_text(through_axis, *_through_args)),
                                 Term.reindex(x, _through_merging)), _text(through_back, *_through_args)),
        eq(shape).to(shape_of(x)), ne(_through_merging).to(String("")))
    return direct, through


reductions.rule(
    "merge_adjacent_sums",
    "sum over axis a of a sum over an adjacent axis b, directly or through a layout that keeps a "
    "-> one sum over the two merged (likewise prod)",
    *_merges("sum"), *_merges("prod"),
    approximate="the partial folds are not rounded to the dtype between the two: one rounding of the "
                "whole fold instead of two", ulps=1,
)
reductions.rule(
    "merge_adjacent_extrema",
    "max over axis a of a max over an adjacent axis b, directly or through a layout -> one max over "
    "the two merged (likewise min)",
    *_merges("max"), *_merges("min"),
    approximate="the sign of a zero: which of +0.0 and -0.0 an extremum of equal zeros returns", ulps=0,
)

RULESETS = [reductions]
