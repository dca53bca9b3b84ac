"""Loop IR terms in the e-graph: a binder-free tensor language.

A term denotes a tensor as a function of its coordinates; loops are implicit
in shapes, so there are no loop variables to rename and alpha-equivalent
programs are the same term. Every primitive datum (names, shapes, dtypes,
ops, axes, layouts) is a literal on its node.

- buffer(name, shape, dtype)   an input or weight in global memory
- literal(value, dtype)        a rank-0 constant (booleans as 0.0 / 1.0)
- unary/binary/select          a scalar function applied at every coordinate
- reduce(op, axis, x)          a monoid over one axis (kept with extent 1)
- reindex(x, layout)           x read through an index map (see layout.py)
- value(name)                  names an e-class after the Tensor IR value it
                               holds (encoding unions it with the value's
                               term); never extracted.
- mat(x)                       x computed by a kernel of its own into a
                               temporary buffer: a kernel boundary. The
                               fusion rules equate mat(x) with x, so the
                               extractor may put the boundary or not.
- online_sum(axis, s)          sum(exp(s - max(s))) over axis in one pass:
                               the softmax normaliser folded with state
                               (m, d) (the twist rules introduce it).
- welford_m2(axis, x)          sum((x - mean x)^2) over axis in one pass
                               (Welford's n, mean, m2), likewise.
- softmax_wsum(axis, s, w)     sum over axis of softmax(s) * w, in one pass
                               with state (m, d, z): attention's weighted
                               sum, output z / d.

Beside the terms, one analysis: shape_of(x), the shape of a term's e-class
as text ("64,128,256"; "" for rank 0). Encoding sets it for every Tensor IR
value and emmy.egraph.shapes carries it to the terms rules create, so a rule
that needs an operand's extents (merging two reduced axes) can ask.
"""

from __future__ import annotations

from egglog import Expr, String, StringLike, f64Like, function, i64Like


class Term(Expr):
    @classmethod
    def buffer(cls, name: StringLike, shape: StringLike, dtype: StringLike) -> Term: ...

    @classmethod
    def literal(cls, value: f64Like, dtype: StringLike) -> Term: ...

    @classmethod
    def unary(cls, op: StringLike, dtype: StringLike, a: Term) -> Term: ...

    @classmethod
    def binary(cls, op: StringLike, dtype: StringLike, a: Term, b: Term) -> Term: ...

    @classmethod
    def select(cls, dtype: StringLike, cond: Term, a: Term, b: Term) -> Term: ...

    @classmethod
    def reduce(cls, op: StringLike, axis: i64Like, x: Term) -> Term: ...

    @classmethod
    def reindex(cls, x: Term, layout: StringLike) -> Term: ...

    @classmethod
    def mat(cls, x: Term) -> Term: ...

    @classmethod
    def value(cls, name: StringLike) -> Term:
        """The Tensor IR value `name`: unioned with its term when the program is encoded, so it names
        the e-class; never extracted (it computes nothing)."""

    @classmethod
    def online_sum(cls, axis: i64Like, s: Term) -> Term:
        """sum(exp(s - max(s))) over `axis`, as one pass with state (m, d)."""

    @classmethod
    def welford_m2(cls, axis: i64Like, x: Term) -> Term:
        """sum((x - mean(x))^2) over `axis`, as one pass with state (n, mean, m2) (Welford)."""


    @classmethod
    def softmax_wsum(cls, axis: i64Like, s: Term, w: Term) -> Term:
        """sum(softmax(s) * w) over `axis` (s and w of one shape), as one pass with state (m, d, z)."""


@function(merge=lambda old, new: old)
def shape_of(x: Term) -> String:
    """The shape of `x` as comma-separated extents (every term of an e-class has the same shape,
    so the first value set stays)."""


CONSTRUCTORS = ("buffer", "literal", "unary", "binary", "select", "reduce", "reindex", "mat", "online_sum",
                "welford_m2", "softmax_wsum")  # what extraction chooses among (not `value`)
