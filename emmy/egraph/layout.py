"""Index maps as the String literals that reindex terms carry.

A layout is the IndexMap of Tensor IR without its operand: output shape,
one index expression per operand axis, guards and fill. Its text is a
canonical machine form (equal maps, equal strings), so alpha-equivalent
reindexings land in one e-class; `compose` is what the map-composition rule
calls to fold a reindex of a reindex into one.
"""

from __future__ import annotations

import ast
import math
from dataclasses import dataclass
from functools import lru_cache

from emmy.affine import Affine, Dim, FloorDiv, Gathered, Guard, Mod


@dataclass(frozen=True)
class Layout:
    shape: tuple[int, ...]
    index: tuple[Affine, ...]
    guards: tuple[Guard, ...] = ()
    fill: object = None


def _affine_data(expr: Affine):
    return (tuple((_atom_data(a), c) for a, c in expr.terms), expr.const)


def _atom_data(atom):
    if isinstance(atom, Dim):
        return ("d", atom.index)
    if isinstance(atom, Gathered):
        return ("g", atom.buffer, tuple(_affine_data(e) for e in atom.index), atom.shape, atom.extent, atom.wrap,
                atom.ignore, atom.fallback)
    kind = "f" if isinstance(atom, FloorDiv) else "m"
    return (kind, _affine_data(atom.expr), atom.divisor)


def _affine_from(data) -> Affine:
    terms, const = data
    return Affine(tuple((_atom_from(a), c) for a, c in terms), const)


def _atom_from(data):
    if data[0] == "d":
        return Dim(data[1])
    if data[0] == "g":
        return Gathered(data[1], tuple(_affine_from(e) for e in data[2]), *data[3:])
    inner = _affine_from(data[1])
    return FloorDiv(inner, data[2]) if data[0] == "f" else Mod(inner, data[2])


def encode_layout(layout: Layout) -> str:
    return repr((
        layout.shape,
        tuple(_affine_data(e) for e in layout.index),
        tuple((_affine_data(g.expr), g.lo, g.hi) for g in layout.guards),
        _fill_data(layout.fill),
    ))


def _fill_data(fill):
    """A fill as a Python literal: -inf (max pooling's padding), inf and NaN are spelt as text."""
    if isinstance(fill, float) and not math.isfinite(fill):
        return ("float", repr(fill))
    return fill


@lru_cache(maxsize=4096)
def decode_layout(text: str) -> Layout:
    shape, index, guards, fill = ast.literal_eval(text)
    return Layout(
        tuple(shape),
        tuple(_affine_from(e) for e in index),
        tuple(Guard(_affine_from(g), lo, hi) for g, lo, hi in guards),
        float(fill[1]) if isinstance(fill, tuple) else fill,
    )


def compose(inner_text: str, outer_text: str) -> str:
    """The one layout equal to applying `inner`, then `outer`; "" if none exists.

    reindex(reindex(x, inner), outer)[c] = x[inner.index(outer.index(c))].
    Guards carry over when at most one side has them (two different fills
    cannot be one map).
    """
    inner, outer = decode_layout(inner_text), decode_layout(outer_text)
    if inner.guards and outer.guards and inner.fill != outer.fill:
        return ""
    if inner.guards and outer.guards:
        return ""  # both guarded: keep them apart rather than reason about nested fills
    extents = outer.shape
    index = tuple(e.substitute(outer.index, extents) for e in inner.index)
    if max((_gather_depth(e) for e in index), default=0) > MAX_GATHER_NESTING:
        return ""  # a gather that is an identity (a table of one 0) would compose with itself forever
    if max((e.division_depth() for e in index), default=0) > MAX_DIVISION_NESTING:
        return ""  # reshapes of shifted views that never simplify: kept apart, or the text grows without end
    guards = tuple(Guard(g.expr.substitute(outer.index, extents), g.lo, g.hi) for g in inner.guards) + outer.guards
    guards = tuple(g for g in guards if not g.always(extents))
    fill = (inner.fill if inner.guards else outer.fill) if guards else None
    return encode_layout(Layout(outer.shape, index, guards, fill))


MAX_GATHER_NESTING = 6  # gathers read by gathered positions (a sort's ranks, then ids): deeper is kept apart
# floor divisions and remainders nested in one index (a relative-shift attention's reshapes of padded
# views compose into ever deeper ones): deeper is kept apart in the e-graph (a fused kernel's own
# substitutions are not bounded yet: a Funnel transformer still compiles for minutes)
MAX_DIVISION_NESTING = 6


def _gather_depth(expr: Affine) -> int:
    """How many gathers deep `expr` reads (0: no table read; 1: a table read at plain positions)."""
    depth = 0
    for atom, _ in expr.terms:
        if isinstance(atom, Gathered):
            depth = max(depth, 1 + max((_gather_depth(e) for e in atom.index), default=0))
        elif isinstance(atom, (FloorDiv, Mod)):
            depth = max(depth, _gather_depth(atom.expr))
    return depth


def scalar_unguarded(text: str) -> str:
    """"yes" if the layout reads a rank-0 value as rank 0 with no guards (an identity), else ""."""
    layout = decode_layout(text)
    return "yes" if layout.shape == () and not layout.guards else ""


def unguarded(text: str) -> str:
    """"yes" if the layout has no guards (every output element reads an input element), else ""."""
    return "" if decode_layout(text).guards else "yes"
