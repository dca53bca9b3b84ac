"""Quasi-affine index expressions: the maps of IndexMap nodes.

An index expression is an integer linear combination of atoms plus a
constant, where an atom is an output coordinate `d<i>`, or the floor
division or remainder of an expression by a positive constant (reshapes need
those). Expressions are immutable values in a canonical form, so two equal
maps compare and hash equal, and `floordiv`/`mod` simplify away when the
ranges of the coordinates (the extents of the output) allow.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from functools import lru_cache
from typing import Sequence, Union

import numpy as np


def _hashed_once(cls):
    """A frozen dataclass whose hash is computed once per object. Expressions share their
    sub-expressions (a reshape's floor division and remainder of one flattened index), so a hash
    recomputed through every path costs 2**depth: a memo keyed by coordinates of a relative-shift
    attention (Funnel's) took minutes. The cache is left out of pickles: string hashes differ
    between processes."""
    names = tuple(f.name for f in fields(cls))

    def __hash__(self):
        found = self.__dict__.get("_hash")
        if found is None:
            found = hash((cls.__name__, *(getattr(self, n) for n in names)))
            object.__setattr__(self, "_hash", found)
        return found

    def __reduce__(self):
        return cls, tuple(getattr(self, n) for n in names)

    cls.__hash__ = __hash__
    cls.__reduce__ = __reduce__
    return cls


@dataclass(frozen=True)
class Dim:
    index: int

    def __str__(self) -> str:
        return f"d{self.index}"


@_hashed_once
@dataclass(frozen=True)
class FloorDiv:
    expr: "Affine"
    divisor: int

    def __str__(self) -> str:
        return f"{self.expr._paren()} // {self.divisor}"


@_hashed_once
@dataclass(frozen=True)
class Mod:
    expr: "Affine"
    divisor: int

    def __str__(self) -> str:
        return f"{self.expr._paren()} % {self.divisor}"


@_hashed_once
@dataclass(frozen=True)
class Gathered:
    """The value of an integer tensor at an index (embedding ids, gather and index_select indices):
    a data-dependent coordinate. `buffer` is a program input or weight, or a value the program
    computes and keeps in memory (an argmax, clamped ids), of `shape`; its values index
    an axis of `extent` elements. A negative value counts from the end when `wrap` (Python
    indexing); a value still outside [0, extent) is an error the interpreters and the runtime
    report, and compiled code clamps it, so no access leaves its buffer. A value equal to `ignore`
    reads as `fallback` (cross entropy's ignore_index: `where(t != -100, t, 0)`)."""

    buffer: str
    index: tuple["Affine", ...]
    shape: tuple[int, ...]
    extent: int
    wrap: bool = False
    ignore: int | None = None
    fallback: int = 0

    def __str__(self) -> str:
        read = f"{self.buffer}[{', '.join(str(e) for e in self.index)}]"
        return read if self.ignore is None else f"{read}|{self.ignore}->{self.fallback}"

    def moved(self, index: tuple["Affine", ...]) -> "Gathered":
        return Gathered(self.buffer, index, self.shape, self.extent, self.wrap, self.ignore, self.fallback)

    def flat(self) -> "Affine":
        """The row-major offset of the read element in `buffer`."""
        flat, stride = Affine.constant(0), 1
        for expr, size in zip(reversed(self.index), reversed(self.shape)):
            flat, stride = flat + expr * stride, stride * size
        return flat

    def dims(self) -> set[int]:
        return set().union(*(e.dims() for e in self.index)) if self.index else set()

    def positions(self, values) -> tuple[np.ndarray, np.ndarray]:
        """(positions along the indexed axis, where a value is out of range) for index values:
        `ignore` read as `fallback`, negatives wrapped where Python indexing wraps them."""
        given = np.asarray(values, dtype=np.int64)
        if self.ignore is not None:
            given = np.where(given == self.ignore, self.fallback, given)
        bad = (given < (-self.extent if self.wrap else 0)) | (given >= self.extent)
        return (np.where(given < 0, given + self.extent, given) if self.wrap else given), bad

    def range_text(self) -> str:
        return f"[{-self.extent if self.wrap else 0}, {self.extent})"


Atom = Union[Dim, FloorDiv, Mod, Gathered]


def gathered_buffers(exprs) -> set[str]:
    """The index tensors read by the Gathered atoms in `exprs` (nested ones included)."""
    return set(gathered_reads(exprs))


def gathered_reads(exprs) -> list[str]:
    """The index tensor of each Gathered atom in `exprs`, nested ones included: one entry per
    read, so a tensor read twice is listed twice."""
    return [atom.buffer for atom in gathered_atoms(exprs)]


def gathered_atoms(exprs) -> list["Gathered"]:
    """Every Gathered atom in `exprs`, nested ones (an index read through another) included."""
    found: list[Gathered] = []
    todo = list(exprs)
    while todo:
        expr = todo.pop()
        for atom, _ in expr.terms:
            if isinstance(atom, Gathered):
                found.append(atom)
                todo.extend(atom.index)
            elif not isinstance(atom, Dim):
                todo.append(atom.expr)
    return found


def _atom_key(atom: Atom) -> tuple:
    if isinstance(atom, Dim):
        return (0, atom.index, "")
    return (1, 0, _atom_text(atom))


@lru_cache(maxsize=65536)
def _atom_text(atom: Atom) -> str:
    return str(atom)


@_hashed_once
@dataclass(frozen=True)
class Affine:
    """sum(coeff * atom) + const, terms sorted, coefficients non-zero."""

    terms: tuple[tuple[Atom, int], ...] = ()
    const: int = 0

    # -- construction -------------------------------------------------
    @staticmethod
    def dim(index: int) -> "Affine":
        return Affine(((Dim(index), 1),), 0)

    @staticmethod
    def constant(value: int) -> "Affine":
        return Affine((), int(value))

    @staticmethod
    def _build(coeffs: dict, const: int) -> "Affine":
        const = _recombine_digits(coeffs, const)
        items = [(a, c) for a, c in coeffs.items() if c != 0]
        if len(items) > 1:
            items.sort(key=lambda t: _atom_key(t[0]))
        return Affine(tuple(items), int(const))

    def __add__(self, other: "Affine | int") -> "Affine":
        other = _lift(other)
        coeffs = dict(self.terms)
        for atom, c in other.terms:
            coeffs[atom] = coeffs.get(atom, 0) + c
        return Affine._build(coeffs, self.const + other.const)

    __radd__ = __add__

    def __neg__(self) -> "Affine":
        return self * -1

    def __sub__(self, other: "Affine | int") -> "Affine":
        return self + (-_lift(other))

    def __mul__(self, k: int) -> "Affine":
        k = int(k)
        return Affine._build({a: c * k for a, c in self.terms}, self.const * k)

    __rmul__ = __mul__

    # -- queries -------------------------------------------------------
    @property
    def is_constant(self) -> bool:
        return not self.terms

    def as_dim(self) -> int | None:
        """The coordinate index if this expression is exactly `d<i>`."""
        if self.const == 0 and len(self.terms) == 1:
            atom, c = self.terms[0]
            if c == 1 and isinstance(atom, Dim):
                return atom.index
        return None

    def division_depth(self) -> int:
        """How many floor divisions and remainders deep the expression nests (through gathered
        positions too); computed once per object, as its sub-expressions are shared."""
        found = self.__dict__.get("_depth")
        if found is None:
            found = 0
            for atom, _ in self.terms:
                if isinstance(atom, (FloorDiv, Mod)):
                    found = max(found, 1 + atom.expr.division_depth())
                elif isinstance(atom, Gathered):
                    found = max(found, max((e.division_depth() for e in atom.index), default=0))
            object.__setattr__(self, "_depth", found)
        return found

    def dims(self) -> set[int]:
        found: set[int] = set()
        for atom, _ in self.terms:
            if isinstance(atom, Dim):
                found.add(atom.index)
            elif isinstance(atom, Gathered):
                found |= atom.dims()
            else:
                found |= atom.expr.dims()
        return found

    def bounds(self, extents: Sequence[int]) -> tuple[int, int]:
        """Inclusive [lo, hi] over coordinates 0 <= d_i < extents[i]. Kept on the object for the
        last extents asked: sub-expressions are shared, and each is bounded once."""
        key = tuple(extents)
        cached = self.__dict__.get("_bounds")
        if cached is not None and cached[0] == key:
            return cached[1]
        found = sum_bounds(self, lambda e: e.bounds(extents), lambda atom: _atom_bounds(atom, extents))
        object.__setattr__(self, "_bounds", (key, found))
        return found

    # -- quasi-affine operations, simplified by coordinate ranges ---------
    def floordiv(self, q: int, extents: Sequence[int]) -> "Affine":
        q = _positive(q)
        if q == 1:
            return self
        lo, hi = self.bounds(extents)
        if lo // q == hi // q:
            return Affine.constant(lo // q)
        high, rest = self._split(q)
        rlo, rhi = rest.bounds(extents)
        if 0 <= rlo and rhi < q:
            return Affine._build({a: c // q for a, c in high.terms}, high.const // q)
        reduced = self._common_factor(q, extents)
        if reduced is not None:  # (g*e + r) // q == e // (q/g) when 0 <= r < g and g | q
            g, inner, _ = reduced
            return inner.floordiv(q // g, extents)
        nested = self._lone_atom()
        if isinstance(nested, Mod) and nested.divisor % q == 0:  # (e % (q*m)) // q == (e // q) % m
            return nested.expr.floordiv(q, extents).mod(nested.divisor // q, extents)
        if isinstance(nested, FloorDiv):  # (e // p) // q == e // (p*q)
            return nested.expr.floordiv(nested.divisor * q, extents)
        return Affine(((FloorDiv(self, q), 1),), 0)

    def mod(self, q: int, extents: Sequence[int]) -> "Affine":
        q = _positive(q)
        if q == 1:
            return Affine.constant(0)
        lo, hi = self.bounds(extents)
        if 0 <= lo and hi < q:
            return self
        _, rest = self._split(q)
        rlo, rhi = rest.bounds(extents)
        if 0 <= rlo and rhi < q:
            return rest
        reduced = self._common_factor(q, extents)
        if reduced is not None:  # (g*e + r) % q == g*(e % (q/g)) + r when 0 <= r < g and g | q
            g, inner, remainder = reduced
            return inner.mod(q // g, extents) * g + remainder
        nested = self._lone_atom()
        if isinstance(nested, Mod) and nested.divisor % q == 0:  # (e % (q*m)) % q == e % q
            return nested.expr.mod(q, extents)
        return Affine(((Mod(self, q), 1),), 0)

    def _lone_atom(self):
        """The atom this expression is, alone with coefficient 1 and no constant; else None. (Floor
        division and remainder by positive divisors nest as Python's do, for any integer.)"""
        if self.const == 0 and len(self.terms) == 1 and self.terms[0][1] == 1:
            return self.terms[0][0]
        return None

    def digit(self, stride: int, size: int, extents: Sequence[int]) -> "Affine":
        """The coordinate of a row-major axis of `size` positions, `stride` elements apart, in the
        linear offset `self`: (self // stride) % size, with the multiples of `stride` divided out
        first ((stride*A + r) // stride == A + r // stride for every integer r), so the offset of a
        reshaped tensor's loops gives plain coordinates such as 8*a1 + a2 // 1024; likewise the
        multiples of `size` before the remainder."""
        stride = _positive(stride)
        high, rest = self._split(stride)
        quotient = Affine._build({a: c // stride for a, c in high.terms}, high.const // stride)
        _, remainder = (quotient + rest.floordiv(stride, extents))._split(size)  # (size*B + r) % size == r % size
        return remainder.mod(size, extents)

    def _common_factor(self, q: int, extents: Sequence[int]):
        """The largest g | q (1 < g < q) with self == g*inner + r, 0 <= r < g; else None."""
        for g in sorted((d for d in range(2, q) if q % d == 0), reverse=True):
            high, rest = self._split(g)
            if not high.terms:
                continue
            rlo, rhi = rest.bounds(extents)
            if 0 <= rlo and rhi < g:
                inner = Affine._build({a: c // g for a, c in high.terms}, high.const // g)
                return g, inner, rest
        return None

    def _split(self, q: int) -> tuple["Affine", "Affine"]:
        """(multiple of q, remainder part) of this expression."""
        high = {a: c for a, c in self.terms if c % q == 0}
        rest = {a: c for a, c in self.terms if c % q != 0}
        return (
            Affine._build(high, self.const - self.const % q),
            Affine._build(rest, self.const % q),
        )

    def substitute(self, mapping: Sequence["Affine"], extents: Sequence[int]) -> "Affine":
        """Replace each `d<i>` by mapping[i]; `extents` bound the new coordinates."""
        terms = self.terms
        if len(terms) == 1 and not self.const and terms[0][1] == 1 and isinstance(terms[0][0], Dim):
            return _lift(mapping[terms[0][0].index])  # a bare coordinate, the commonest index
        coeffs: dict = {}
        const = self.const
        for atom, c in terms:  # the terms summed into one table, built once (lowering's hot path)
            if isinstance(atom, Dim):
                value = _lift(mapping[atom.index])
            elif isinstance(atom, Gathered):
                index = tuple(e.substitute(mapping, extents) for e in atom.index)
                value = Affine(((atom.moved(index), 1),), 0)
            elif isinstance(atom, FloorDiv):
                value = atom.expr.substitute(mapping, extents).floordiv(atom.divisor, extents)
            else:
                value = atom.expr.substitute(mapping, extents).mod(atom.divisor, extents)
            const += value.const * c
            for inner, k in value.terms:
                coeffs[inner] = coeffs.get(inner, 0) + k * c
        return Affine._build(coeffs, const)

    def with_tables(self, renames: dict[str, str]) -> "Affine":
        """The same expression with its index tensors (Gathered buffers) renamed by `renames`."""
        if not renames or not any(not isinstance(atom, Dim) for atom, _ in self.terms):
            return self
        coeffs: dict = {}
        for atom, c in self.terms:
            if isinstance(atom, Gathered):
                atom = Gathered(renames.get(atom.buffer, atom.buffer), tuple(e.with_tables(renames) for e in atom.index),
                                atom.shape, atom.extent, atom.wrap, atom.ignore, atom.fallback)
            elif isinstance(atom, (FloorDiv, Mod)):
                atom = type(atom)(atom.expr.with_tables(renames), atom.divisor)
            coeffs[atom] = coeffs.get(atom, 0) + c
        return Affine._build(coeffs, self.const)

    def evaluate(self, coords: Sequence[np.ndarray], tables: dict | None = None) -> np.ndarray | int:
        """The value at `coords`; `tables` maps index tensors' names to their arrays (for Gathered
        atoms)."""
        total: np.ndarray | int = self.const
        for atom, c in self.terms:
            total = total + c * _atom_eval(atom, coords, tables)
        return total

    # -- printing --------------------------------------------------------
    def __str__(self) -> str:
        parts: list[str] = []
        # Positive terms first, so `d3 - d2` rather than `-d2 + d3`.
        for atom, c in sorted(self.terms, key=lambda t: t[1] < 0):
            text = str(atom)
            if not isinstance(atom, Dim) and (c != 1 or len(self.terms) > 1 or self.const):
                text = f"({text})"
            if c == 1:
                piece = text
            elif c == -1:
                piece = f"-{text}"
            else:
                piece = f"{c}*{text}"
            parts.append(piece)
        if self.const or not parts:
            parts.append(str(self.const))
        out = parts[0]
        for piece in parts[1:]:
            out += f" - {piece[1:]}" if piece.startswith("-") else f" + {piece}"
        return out

    def _paren(self) -> str:
        text = str(self)
        return text if (len(self.terms) + (1 if self.const else 0)) <= 1 and "*" not in text else f"({text})"


def row_major_strides(shape: Sequence[int]) -> list[int]:
    """Elements between neighbours along each axis of a row-major `shape`."""
    strides, step = [], 1
    for n in reversed(shape):
        strides.append(step)
        step *= n
    return strides[::-1]


def row_major_offset(index: Sequence[Affine], shape: Sequence[int]) -> Affine:
    """The linear offset of `index` into a row-major `shape` (not simplified: see `recombined`)."""
    return sum((e * s for e, s in zip(index, row_major_strides(shape))), Affine.constant(0))


def recombined(expr: Affine) -> Affine:
    """`expr` with the digits of a reshape put back together: a remainder rewritten as
    e - q*(e // q) and nested divisions as one ((e // a) // b == e // (a*b)), both exact for any
    integer e, so a row-major offset such as 4096*(r // 4096) + 64*((r // 64) % 64) + r % 64
    becomes r. Kept only when it has fewer division or remainder atoms than `expr`."""
    candidate = _expand(expr)
    return candidate if _quotients(candidate) < _quotients(expr) else expr


def sum_bounds(expr: "Affine", inner_bounds, atom_bounds) -> tuple[int, int]:
    """Inclusive [lo, hi] of `expr` from its atoms' bounds (`atom_bounds(atom)`), except that a
    remainder and a floor division of one expression e by one q, as a reshape's digits stand side
    by side (a*(e % q) + b*(e // q)), are bounded together from e's bounds (`inner_bounds(e)`):
    apart, they lose that the remainder wraps when the quotient steps, and a relative shift's
    index (e % 7 + 6*(e // 7) - 1, e in 1..34) would seem to reach -1."""
    quotients = {(atom.expr, atom.divisor): c for atom, c in expr.terms if isinstance(atom, FloorDiv)}
    paired = set()
    lo = hi = expr.const
    for atom, c in expr.terms:
        if isinstance(atom, Mod) and (atom.expr, atom.divisor) in quotients:
            paired.add((atom.expr, atom.divisor))
            alo, ahi = digits_range(c, quotients[(atom.expr, atom.divisor)], atom.divisor, *inner_bounds(atom.expr))
            lo, hi = lo + alo, hi + ahi
    for atom, c in expr.terms:
        if paired and isinstance(atom, (Mod, FloorDiv)) and (atom.expr, atom.divisor) in paired:
            continue
        alo, ahi = atom_bounds(atom)
        lo, hi = (lo + c * alo, hi + c * ahi) if c > 0 else (lo + c * ahi, hi + c * alo)
    return lo, hi


def digits_range(a: int, b: int, q: int, lo: int, hi: int) -> tuple[int, int]:
    """Exact [min, max] of a*(e % q) + b*(e // q) over the integers lo <= e <= hi (floor division):
    with e = q*t + r, a linear function of (t, r) over at most three boxes (the first quotient's
    remainders from lo % q, the last one's up to hi % q, every remainder between), so at their corners."""
    t0, t1 = lo // q, hi // q
    if t0 == t1:
        boxes = [((t0, t0), (lo % q, hi % q))]
    else:
        boxes = [((t0, t0), (lo % q, q - 1)), ((t1, t1), (0, hi % q))]
        if t1 - t0 >= 2:
            boxes.append(((t0 + 1, t1 - 1), (0, q - 1)))
    values = [a * r + b * t for ts, rs in boxes for t in ts for r in rs]
    return min(values), max(values)


def _recombine_digits(coeffs: dict, const: int) -> int:
    """Put a split index back together in place: c*(e % q) + c*q*(e // q) == c*e for every
    integer e, so a view that splits an axis read through one that merges it again indexes by e,
    not by e's digits. Without it a chain of reshapes (a relative-shift attention: reshape, slice,
    reshape) nests one division per view around copies of e, and the expression's text doubles
    per view. Returns the new constant; `coeffs` is updated."""
    if not any(isinstance(a, Mod) for a in coeffs) or not any(isinstance(a, FloorDiv) for a in coeffs):
        return const
    found = True
    while found:
        found = False
        for atom, c in coeffs.items():
            if not c or not isinstance(atom, Mod):
                continue
            quotient = FloorDiv(atom.expr, atom.divisor)
            if coeffs.get(quotient, 0) == c * atom.divisor:
                coeffs[atom] = coeffs[quotient] = 0
                for inner, k in atom.expr.terms:
                    coeffs[inner] = coeffs.get(inner, 0) + c * k
                const += c * atom.expr.const
                found = True
                break
    return const


def _expand(expr: Affine) -> Affine:
    out = Affine.constant(expr.const)
    for atom, c in expr.terms:
        if isinstance(atom, FloorDiv):
            value = _divided(_expand(atom.expr), atom.divisor)
        elif isinstance(atom, Mod):
            inner = _expand(atom.expr)
            value = inner - _divided(inner, atom.divisor) * atom.divisor
        else:
            value = Affine(((atom, 1),), 0)
        out = out + value * c
    return out


def _divided(expr: Affine, q: int) -> Affine:
    if expr.const == 0 and len(expr.terms) == 1 and expr.terms[0][1] == 1 and isinstance(expr.terms[0][0], FloorDiv):
        inner = expr.terms[0][0]
        return Affine(((FloorDiv(inner.expr, inner.divisor * q), 1),), 0)
    return Affine(((FloorDiv(expr, q), 1),), 0)


def _quotients(expr: Affine) -> int:
    return sum(1 + _quotients(atom.expr) for atom, _ in expr.terms if isinstance(atom, (FloorDiv, Mod)))


def _lift(value: "Affine | int") -> Affine:
    return value if isinstance(value, Affine) else Affine.constant(int(value))


def _positive(q: int) -> int:
    q = int(q)
    if q <= 0:
        raise ValueError(f"index divisor must be positive, got {q}")
    return q


def _atom_bounds(atom: Atom, extents: Sequence[int]) -> tuple[int, int]:
    if isinstance(atom, Dim):
        return 0, max(int(extents[atom.index]) - 1, 0)
    if isinstance(atom, Gathered):
        return 0, max(atom.extent - 1, 0)
    lo, hi = atom.expr.bounds(extents)
    if isinstance(atom, FloorDiv):
        return lo // atom.divisor, hi // atom.divisor
    if 0 <= lo and hi < atom.divisor:
        return lo, hi
    return 0, atom.divisor - 1


def _atom_eval(atom: Atom, coords: Sequence[np.ndarray], tables: dict | None):
    if isinstance(atom, Dim):
        return coords[atom.index]
    if isinstance(atom, Gathered):
        if tables is None or atom.buffer not in tables:
            raise ValueError(f"evaluating {atom} needs the values of {atom.buffer}")
        table = np.asarray(tables[atom.buffer]).reshape(atom.shape)
        positions = tuple(np.asarray(e.evaluate(coords, tables), dtype=np.int64) for e in atom.index)
        values = table[positions] if positions else table[()]
        return checked_positions(values, atom)
    inner = atom.expr.evaluate(coords, tables)
    if isinstance(atom, FloorDiv):
        return np.floor_divide(inner, atom.divisor)
    return np.mod(inner, atom.divisor)


def checked_positions(values, atom: Gathered) -> np.ndarray:
    """Index values as positions along the indexed axis; a value outside the axis is an
    IndexOutOfRangeError naming the first one."""
    from emmy.errors import IndexOutOfRangeError

    positions, bad = atom.positions(values)
    if np.any(bad):
        first = np.asarray(values)[tuple(np.argwhere(bad)[0])] if np.ndim(bad) else values
        raise IndexOutOfRangeError(f"index {int(first)} read from {atom.buffer} is outside {atom.range_text()}, "
                                   "the axis it indexes")
    return positions


@dataclass(frozen=True)
class Guard:
    """The condition lo <= expr < hi (either bound may be absent)."""

    expr: Affine
    lo: int | None = None
    hi: int | None = None

    def holds(self, coords: Sequence[np.ndarray], tables: dict | None = None):
        value = self.expr.evaluate(coords, tables)
        ok = np.ones(np.shape(value), dtype=bool) if not isinstance(value, int) else np.bool_(True)
        if self.lo is not None:
            ok = ok & (value >= self.lo)
        if self.hi is not None:
            ok = ok & (value < self.hi)
        return ok

    def negated(self) -> "Guard | None":
        """The guard that holds exactly where this one-sided guard fails (None for a two-sided one)."""
        if (self.lo is None) == (self.hi is None):
            return None
        return Guard(self.expr, hi=self.lo) if self.lo is not None else Guard(self.expr, lo=self.hi)

    def always(self, extents: Sequence[int]) -> bool:
        lo, hi = self.expr.bounds(extents)
        return (self.lo is None or lo >= self.lo) and (self.hi is None or hi < self.hi)

    def never(self, extents: Sequence[int]) -> bool:
        lo, hi = self.expr.bounds(extents)
        return (self.lo is not None and hi < self.lo) or (self.hi is not None and lo >= self.hi)

    def __str__(self) -> str:
        text = str(self.expr)
        if self.lo is not None and self.hi is not None:
            return f"{self.lo} <= {text} < {self.hi}"
        if self.lo is not None:
            return f"{text} >= {self.lo}"
        return f"{text} < {self.hi}"
