"""Where a flash attention block's keys start and end: the causal bound and a sliding window.

A softmax fold whose score is `where(mask, x, -inf)`, with the mask an index predicate (sdpa's
`is_causal`: `key - row < 1`), gives a key no weight in a row where the predicate fails. For a
block of query rows, every key past some point fails it in every row (causal: past the block's
last row), so the block's walk over the keys can stop there: about half the work of a causal
attention (FlashAttention does the same). A sliding window (`row - key < W` too) also fails every
key before some point, so the walk starts there: a block walks about W + its rows keys.

Stopping early is exact only for rows that have seen an unmasked score: a -inf score then adds
nothing to the state (its weight is exp(-inf - m) = 0 and the maximum stands). A row that has
seen none keeps m = -inf, and the fold's step counts even masked keys there (weight 1 where
score == m); the templates check for such rows and then walk the remaining keys too. Starting
late is exact for the same reason: a row's masked keys before its first unmasked one are
weighted 1 while m is -inf, and the first finite m scales all of them by exp(-inf) = 0.

`key_range_guards` finds the guards that bound the keys from above or below; `live_key_end` and
`live_key_start` are the bounds for a box of row coordinates; `live_fraction` the share of key
steps a schedule's blocks walk (the cost model's price of the bounds).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from math import ceil

from emmy.affine import Dim, Guard
from emmy.loop_ir import nodes as L

_NEG_INF = float("-inf")


@dataclass(frozen=True)
class KeyBound:
    """An attention kernel's key bounds: `guards` (linear, each bounding the key from above or
    below) over the key variable `key_var` of `keys` keys, the query-row variables `row_vars`
    ((variable, extent), outermost first: a block's rows are consecutive flat rows) and the batch
    variables `other_vars` a guard may read."""

    guards: tuple[Guard, ...]
    key_var: int
    keys: int
    row_vars: tuple[tuple[int, int], ...]
    other_vars: tuple[tuple[int, int], ...]

    def fraction(self, block_rows: int, key_step: int) -> float:
        return live_fraction(self.guards, self.key_var, self.keys, self.row_vars, self.other_vars, block_rows,
                             key_step)


def key_range_guards(fold_body: tuple, key_var: int, allowed_vars: set[int]) -> tuple[Guard, ...]:
    """The guards of the index predicate that sets a softmax fold's score to -inf where it fails
    and that bound the key from above or below: linear in loop variables (no reshape digits),
    reading the key and otherwise only `allowed_vars` (query-row and batch variables). () when
    the score is not so masked."""
    defs = {s.name: s for s in L.statements(fold_body) if isinstance(s, L.Assign)}
    state = {s.acc for s in fold_body if isinstance(s, L.Update)}
    score = _running_max_score(defs, state)
    if score is None:
        return ()
    guards = _where_guards(defs, score)
    return tuple(g for g in guards if _bounds_keys(g, key_var, allowed_vars))


def _running_max_score(defs: dict, state: set[str]):
    """The score the fold's running maximum takes (maximum(m, score), m a state value)."""
    found = _running_max(defs, state)
    return found[1] if found else None


def _running_max(defs: dict, state: set[str]):
    """(m, score) of the fold's running maximum, maximum(m, score) with m a state value."""
    for stmt in defs.values():
        e = stmt.expr
        if isinstance(e, L.Op) and e.op == "maximum" and len(e.args) == 2:
            a, b = e.args
            if a in state and isinstance(b, str):
                return a, b
            if b in state and isinstance(a, str):
                return b, a
    return None


def running_max(fold_body: tuple, state: set[str]) -> str:
    """The state value a softmax fold keeps its running maximum in ("" when there is none)."""
    found = _running_max({s.name: s for s in L.statements(fold_body) if isinstance(s, L.Assign)}, set(state))
    return found[0] if found else ""


def _is_neg_inf(operand) -> bool:
    return isinstance(operand, L.Lit) and isinstance(operand.value, float) and operand.value == _NEG_INF


def _where_guards(defs: dict, name: str) -> tuple[Guard, ...]:
    """Guards G when `name` is, through casts, where(G, x, -inf) (or where(not G, -inf, x), or with
    one one-sided guard H = not G: where(H, -inf, x)) with G a predicate on the indices alone."""
    for _ in range(8):
        stmt = defs.get(name)
        if stmt is None or not isinstance(stmt.expr, L.Op):
            return ()
        e = stmt.expr
        if e.op == "cast" and len(e.args) == 1 and isinstance(e.args[0], str):
            name = e.args[0]
            continue
        if e.op != "where" or len(e.args) != 3 or not isinstance(e.args[0], str):
            return ()
        condition = defs.get(e.args[0])
        if condition is None or not isinstance(condition.expr, L.Masked):
            return ()
        m = condition.expr
        value, fill = _truth(m.value), _truth(m.fill)
        # the score is -inf exactly where a guard fails: true inside, -inf taken on false
        if value is True and fill is False and _is_neg_inf(e.args[2]):
            return m.guards
        if value is False and fill is True and _is_neg_inf(e.args[1]):
            return m.guards
        # -inf taken where the guard holds (masked_fill(triu(...), -inf)): the scores kept lie
        # where it fails, itself a guard when the one guard is one-sided
        inside_masked = (value is True and fill is False and _is_neg_inf(e.args[1])) or (
            value is False and fill is True and _is_neg_inf(e.args[2]))
        if inside_masked and len(m.guards) == 1 and m.guards[0].negated() is not None:
            return (m.guards[0].negated(),)
        return ()
    return ()


def _truth(operand):
    if isinstance(operand, L.Lit) and isinstance(operand.value, bool):
        return operand.value
    if isinstance(operand, bool):
        return operand
    return None


def _bounds_keys(guard: Guard, key_var: int, allowed_vars: set[int]) -> bool:
    terms = dict(guard.expr.terms)
    if not all(isinstance(atom, Dim) for atom in terms):
        return False
    coefficient = terms.get(Dim(key_var), 0)
    others = {atom.index for atom in terms} - {key_var}
    return coefficient != 0 and others <= allowed_vars


def bounds_keys_above(guard: Guard, key_var: int) -> bool:
    """Whether the guard fails for every key past some point: its expression grows with the key
    and has a ceiling, or falls with it and has a floor."""
    ck = key_coefficients(guard, key_var)[0]
    return (ck > 0 and guard.hi is not None) or (ck < 0 and guard.lo is not None)


def bounds_keys_below(guard: Guard, key_var: int) -> bool:
    """Whether the guard fails for every key before some point (a sliding window's far edge)."""
    ck = key_coefficients(guard, key_var)[0]
    return (ck > 0 and guard.lo is not None) or (ck < 0 and guard.hi is not None)


def _rest_range(others: dict, const: int, ranges: dict) -> tuple[int, int]:
    """The least and most of a guard's expression less its key term over the box `ranges`."""
    low = const + sum(c * (ranges[v][0] if c > 0 else ranges[v][1]) for v, c in others.items())
    high = const + sum(c * (ranges[v][1] if c > 0 else ranges[v][0]) for v, c in others.items())
    return low, high


def key_coefficients(guard: Guard, key_var: int) -> tuple[int, dict[int, int], int]:
    """(the key's coefficient, the other variables' coefficients, the constant) of a linear guard."""
    terms = {atom.index: c for atom, c in guard.expr.terms}
    return terms.pop(key_var), terms, guard.expr.const


def live_key_end(guards: tuple[Guard, ...], key_var: int, ranges: dict[int, tuple[int, int]], keys: int) -> int:
    """Keys at or past the returned one fail a guard for every coordinate in the box `ranges`
    (variable -> (lowest, highest) value): the first key a block of those rows need not walk."""
    end = keys
    for guard in guards:
        if not bounds_keys_above(guard, key_var):
            continue
        ck, others, const = key_coefficients(guard, key_var)
        low, high = _rest_range(others, const, ranges)
        if ck > 0:  # ck * key + rest < hi fails for every row once ck * key + low >= hi
            end = min(end, -(-(guard.hi - low) // ck))
        else:  # rest - |ck| * key >= lo fails for every row once high - |ck| * key < lo
            end = min(end, (high - guard.lo) // -ck + 1)
    return max(0, end)


def live_key_start(guards: tuple[Guard, ...], key_var: int, ranges: dict[int, tuple[int, int]]) -> int:
    """Keys before the returned one fail a guard for every coordinate in the box `ranges`: the
    first key a block of those rows walks (0 without a guard bounding the keys from below)."""
    start = 0
    for guard in guards:
        if not bounds_keys_below(guard, key_var):
            continue
        ck, others, const = key_coefficients(guard, key_var)
        low, high = _rest_range(others, const, ranges)
        if ck > 0:  # ck * key + rest >= lo holds in some row only once ck * key + high >= lo
            start = max(start, -(-(guard.lo - high) // ck))
        else:  # rest - |ck| * key < hi holds in some row only once low - |ck| * key < hi
            start = max(start, (low - guard.hi) // -ck + 1)
    return start


@lru_cache(maxsize=4096)
def live_fraction(guards: tuple[Guard, ...], key_var: int, keys: int, row_vars: tuple[tuple[int, int], ...],
                  other_vars: tuple[tuple[int, int], ...], block_rows: int, key_step: int) -> float:
    """The share of (block, key step) pairs a flash kernel walks when each block of `block_rows`
    query rows (`row_vars`: (variable, extent), outermost first) walks the steps from its live
    key start to its live key end; `other_vars` (batch variables a guard reads) are taken at
    their whole range."""
    if not guards:
        return 1.0
    rows = 1
    for _, extent in row_vars:
        rows *= extent
    steps = ceil(keys / key_step)
    base = {v: (0, e - 1) for v, e in other_vars}
    walked = blocks = 0
    for start in range(0, rows, block_rows):
        ranges = base | block_ranges(row_vars, start, min(start + block_rows, rows) - 1)
        end = min(steps, ceil(live_key_end(guards, key_var, ranges, keys) / key_step))
        walked += max(0, end - live_key_start(guards, key_var, ranges) // key_step)
        blocks += 1
    return walked / (blocks * steps) if blocks else 1.0


def block_ranges(row_vars: tuple[tuple[int, int], ...], first: int, last: int) -> dict[int, tuple[int, int]]:
    """Each row variable's (lowest, highest) value over flat rows first..last (row-major digits:
    the last variable fastest); a digit that wraps within the span takes its whole range."""
    ranges, divisor = {}, 1
    for var, extent in reversed(row_vars):
        lo, hi = first // divisor, last // divisor
        if hi - lo >= extent or lo % extent > hi % extent:
            ranges[var] = (0, extent - 1)
        else:
            ranges[var] = (lo % extent, hi % extent)
        divisor *= extent
    return ranges
