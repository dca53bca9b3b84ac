"""Every load and store of a kernel inside its buffer: an interval proof over the loop extents.

Each index is a quasi-affine expression of loop variables; a variable ranges over its loop
(0 .. extent - 1), narrowed by the guards of a guarded load (a load made only where
`lo <= c * a + k < hi` holds needs to be in bounds only there); an index that differs from a
guard's expression (or a sum of multiples of guards' expressions) by a bounded rest is bounded
through the guards (a scan's `start + j <= i`, F.fold's `row * width + column`). Intervals go through sums,
multiples, floor divisions and remainders. An access whose interval leaves its buffer on some
dimension is reported; emitted kernels must have none (Kernel IR lowering refuses them).
"""

from __future__ import annotations

from math import ceil, floor

from emmy.affine import Affine, Dim, FloorDiv, Gathered, gathered_atoms, sum_bounds
from emmy.loop_ir.nodes import Assign, Kernel, Load, Loop, Store


def out_of_bounds(kernel: Kernel, shapes: dict[str, tuple[int, ...]]) -> list[str]:
    """A line per access that may fall outside its buffer (`shapes`: buffer name -> shape)."""
    problems = []
    stack = [(kernel.body, {})]
    while stack:
        body, ranges = stack.pop()
        for stmt in body:
            if isinstance(stmt, Loop):
                stack.append((stmt.body, {**ranges, stmt.var: (0, stmt.extent - 1)}))
            elif isinstance(stmt, Assign) and isinstance(stmt.expr, Load):
                where = narrowed(ranges, stmt.expr.guards)
                if where is not None:  # None: the guards never hold, so the load never happens
                    problems += _check(f"load {stmt.name} = {stmt.expr.buffer}", stmt.expr.buffer,
                                       stmt.expr.index, where, shapes, stmt.expr.guards)
            elif isinstance(stmt, Store):
                problems += _check(f"store {stmt.buffer}", stmt.buffer, stmt.index, ranges, shapes)
    return problems


def unproven_axes(index, shape, guards, ranges: dict) -> list[int]:
    """The axes of `index` (into `shape`, read where `guards` hold, each variable in its range) that
    the proof cannot keep inside the buffer."""
    where = narrowed(ranges, guards)
    if where is None:
        return []
    reach = [through_guards(expr, guards, where) for expr in index]
    return [axis for axis, ((lo, hi), size) in enumerate(zip(reach, shape)) if lo < 0 or hi >= size]


def _check(what: str, buffer: str, index, ranges: dict, shapes: dict, guards=()) -> list[str]:
    shape = shapes[buffer]
    if len(index) != len(shape):
        return [f"{what}: {len(index)} indices for a buffer of rank {len(shape)}"]
    out = []
    for axis, (expr, size) in enumerate(zip(index, shape)):
        lo, hi = through_guards(expr, guards, ranges)
        if lo < 0 or hi >= size:
            out.append(f"{what}[...{_short(expr)}...]: axis {axis} reaches {lo}..{hi}, outside 0..{size - 1}")
    for atom in gathered_atoms(index):  # each index tensor read at its own positions
        for axis, (expr, size) in enumerate(zip(atom.index, atom.shape)):
            lo, hi = through_guards(expr, guards, ranges)
            if lo < 0 or hi >= size:
                out.append(f"{what}: its index tensor {atom.buffer}[...{_short(expr)}...]: axis {axis} reaches "
                           f"{lo}..{hi}, outside 0..{size - 1}")
    return out


def _short(expr: Affine, limit: int = 160) -> str:
    """An index for a message: a chain of views can spell one thousands of characters long."""
    text = str(expr)
    return text if len(text) <= limit else f"{text[:limit // 2]} ... {text[-limit // 2:]}"


GUARDS_COMBINED = 3  # guards one index is written through at most (F.fold's row * width + column: two)


def through_guards(expr: Affine, guards, ranges: dict, depth: int = 0) -> tuple[int, int]:
    """Inclusive bounds of `expr` where the guards hold. Besides each variable's range, `expr` is
    written as sum(c_k * guard_k) + rest wherever a term of a guard divides expr's term of the same
    atom, so an index made of guarded parts is bounded by their guards (a scan's `start + j <= i`;
    a flipped read `n - 1 - position`; a fold's `row * width + column`, each part guarded inside
    its axis)."""
    lo, hi = interval(expr, ranges, guards, depth)
    pending = [(expr, 0, 0, 0)]  # (rest, least and greatest value of the guarded parts, guards used)
    seen = set()
    while pending:
        rest, part_lo, part_hi, used = pending.pop()
        if used:
            rest_lo, rest_hi = interval(rest, ranges, guards, depth)
            if part_lo is not None:
                lo = max(lo, part_lo + rest_lo)
            if part_hi is not None:
                hi = min(hi, part_hi + rest_hi)
        if used == GUARDS_COMBINED:
            continue
        terms = dict(rest.terms)
        for g in guards:
            for c in {terms[atom] // k for atom, k in g.expr.terms if atom in terms and terms[atom] % k == 0}:
                # c * guard lies in c * [lo_g, hi_g - 1], ends swapped when c < 0 (None: unbounded)
                ends = (None if g.lo is None else g.lo * c, None if g.hi is None else (g.hi - 1) * c)
                low, high = ends if c > 0 else ends[::-1]
                new_lo = None if low is None or part_lo is None else part_lo + low
                new_hi = None if high is None or part_hi is None else part_hi + high
                if new_lo is None and new_hi is None:
                    continue
                key = (rest - g.expr * c, new_lo, new_hi)
                if key not in seen:
                    seen.add(key)
                    pending.append((*key, used + 1))
    return lo, hi


def narrowed(ranges: dict, guards) -> dict | None:
    """The variables' ranges where every guard holds (guards on one variable narrow it; others are
    kept as they are, which only widens the proof's intervals); None when a guard cannot hold."""
    out = dict(ranges)
    for g in guards:
        single = _single_variable(g.expr)
        if single is None:
            continue
        var, coeff, const = single
        lo, hi = out.get(var, (0, 0))
        # lo_g <= coeff * v + const < hi_g
        if coeff > 0:
            if g.lo is not None:
                lo = max(lo, ceil((g.lo - const) / coeff))
            if g.hi is not None:
                hi = min(hi, floor((g.hi - 1 - const) / coeff))
        else:
            if g.lo is not None:
                hi = min(hi, floor((g.lo - const) / coeff))
            if g.hi is not None:
                lo = max(lo, ceil((g.hi - 1 - const) / coeff))
        if lo > hi:
            return None
        out[var] = (lo, hi)
    return out


def _single_variable(expr: Affine):
    if len(expr.terms) == 1 and isinstance(expr.terms[0][0], Dim):
        atom, coeff = expr.terms[0]
        return atom.index, coeff, expr.const
    return None


def interval(expr: Affine, ranges: dict, guards=(), depth: int = 0, memo: dict | None = None) -> tuple[int, int]:
    """Inclusive bounds of `expr` with each variable in its range; the expression inside a floor
    division or remainder is bounded through the guards too (a flattened tensor's blocked scan reads
    row (start + j) // width, where the guard start + j <= i keeps it inside), one level deep: a
    guard's own divisions are bounded by the ranges alone. A reshape's digit pair is bounded as a
    pair (`sum_bounds`). `memo` keeps the bounds of guard-free sub-expressions of one access (they
    are shared: each level of a chain of reshapes reads the one below twice)."""
    memo = {} if memo is None else memo
    if not guards or depth:  # bounded by the ranges alone
        if expr not in memo:
            memo[expr] = sum_bounds(expr, lambda e: _inner_interval(e, ranges, (), depth, memo),
                                   lambda atom: _atom_interval(atom, ranges, (), depth, memo))
        return memo[expr]
    return sum_bounds(expr, lambda e: _inner_interval(e, ranges, guards, depth, memo),
                      lambda atom: _atom_interval(atom, ranges, guards, depth, memo))


def _inner_interval(expr: Affine, ranges: dict, guards, depth: int, memo: dict) -> tuple[int, int]:
    """Bounds of the expression inside a floor division or remainder."""
    return through_guards(expr, guards, ranges, depth + 1) if guards else interval(expr, ranges, memo=memo)


def _atom_interval(atom, ranges: dict, guards=(), depth: int = 0, memo: dict | None = None) -> tuple[int, int]:
    if isinstance(atom, Dim):
        return ranges.get(atom.index, (0, 0))
    if isinstance(atom, Gathered):  # compiled code clamps an index value into its axis
        return 0, max(atom.extent - 1, 0)
    lo, hi = _inner_interval(atom.expr, ranges, guards, depth, {} if memo is None else memo)
    if isinstance(atom, FloorDiv):
        return lo // atom.divisor, hi // atom.divisor
    if 0 <= lo and hi < atom.divisor:
        return lo, hi
    return 0, atom.divisor - 1

