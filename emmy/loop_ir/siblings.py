"""Sibling folds share a kernel: two row kernels that fold the same rows over the same axis and
load an element in common (a variance and a mean of one tensor, a sum and a sum of squares) run
as one kernel with both outputs, so the rows are read once and one launch does both.

Two kernels merge when each is one nest of free loops around folds (the same loop variables and
extents; the first folds merge, later ones follow: a two-pass variance and a mean share the
variance's first pass), neither reads what the other writes, no kernel between them reads the first's
output (the merged kernel runs where the second did), and at most one of them keeps a twisted
state (the lowering merges one twisted state beside any plain accumulators). The second's local
names are renamed apart; its loads that repeat one of the first's at the same level are dropped
and read from the first's. Kernels are grouped by their loop nest, so the pass looks at each
kernel against the next WINDOW kernels of its nest, not against every kernel of the program.
"""

from __future__ import annotations

import dataclasses
from collections import defaultdict
from typing import Callable

from emmy.loop_ir.nodes import (Accumulate, Assign, Init, Kernel, Load, Loop, LoopProgram, Update, free_nest,
                                fresh_name, index_tensors, renamed, statements)

WINDOW = 8  # later kernels of the same loop nest each kernel is tried against (siblings sit close)


@dataclasses.dataclass(frozen=True)
class _Fold:
    free: tuple[tuple[int, int], ...]  # (var, extent) of the free loops, outermost first
    before: tuple  # statements of the innermost free loop before the fold
    fold: Loop
    after: tuple


def merge_sibling_folds(program: LoopProgram, accept: Callable[[Kernel, Kernel, Kernel], bool] | None = None
                        ) -> LoopProgram:
    """`program` with sibling folds merged; `accept(first, second, merged)`, when given, must say
    the merged kernel is worth it (extraction passes the cost model's verdict: two matmuls that
    read one input fold alike, but the pair is no matmul and would be priced as a row kernel)."""
    kernels = list(program.kernels)
    folds = [_fold_of(k) for k in kernels]
    readers: dict[str, list[int]] = defaultdict(list)  # buffer -> positions of the kernels reading it
    for i, k in enumerate(kernels):
        for buffer in reads_of(k.body):
            readers[buffer].append(i)
    groups: dict[tuple, list[int]] = defaultdict(list)
    for i, fold in enumerate(folds):
        if fold is not None:
            groups[(fold.free, fold.fold.var, fold.fold.extent)].append(i)
    merged_away: set[int] = set()  # positions of first kernels, now part of a later one
    for positions in groups.values():
        used: set[int] = set()
        for a, i in enumerate(positions):
            if i in used:
                continue
            for j in positions[a + 1:a + 1 + WINDOW]:
                if j in used or not _may_merge(kernels[i], kernels[j], folds[i], folds[j], i, j, readers):
                    continue
                merged = _merged(kernels[i], kernels[j], folds[i], folds[j])
                if accept is not None and not accept(kernels[i], kernels[j], merged):
                    continue
                kernels[j] = merged
                folds[j] = _fold_of(kernels[j])
                merged_away.add(i)
                used |= {i, j}
                break
    if not merged_away:
        return program
    kept = tuple(k for i, k in enumerate(kernels) if i not in merged_away)
    return dataclasses.replace(program, kernels=kept)


def _fold_of(kernel: Kernel) -> _Fold | None:
    """The kernel as free loops around folds (the first one, and what follows it: more folds that
    may read it, as a two-pass variance's sum of squares reads its mean), or None."""
    free, body = free_nest(kernel.body)
    folds = [s for s in body if isinstance(s, Loop)]
    if not free or not folds or not all(f.reduction and not any(isinstance(s, Loop) for s in f.body) for f in folds):
        return None
    at = body.index(folds[0])
    return _Fold(free, tuple(body[:at]), folds[0], tuple(body[at + 1:]))


def _may_merge(first: Kernel, second: Kernel, a: _Fold, b: _Fold, i: int, j: int, readers) -> bool:
    ours = {name for name, _ in first.outputs}
    theirs = {name for name, _ in second.outputs}
    if ours & reads_of(second.body) or theirs & reads_of(first.body):
        return False
    if any(i < r < j for name in ours for r in readers.get(name, ())):
        return False  # a kernel between them needs the first's output before the merged kernel runs
    if _twisted(a.fold) and _twisted(b.fold):
        return False
    return bool(_loads(a.fold.body) & _loads(b.fold.body))


def _merged(first: Kernel, second: Kernel, a: _Fold, b: _Fold) -> Kernel:
    rename = names_apart(local_names(second.body), local_names(first.body))
    # the second fold's loads that the first already makes (same buffer, index and guards) are read from it
    known = {(s.expr.buffer, s.expr.index, s.expr.guards): s.name for s in a.fold.body
             if isinstance(s, Assign) and isinstance(s.expr, Load)}
    fold_body = []
    for s in b.fold.body:
        if isinstance(s, Assign) and isinstance(s.expr, Load) and (s.expr.buffer, s.expr.index, s.expr.guards) in known:
            rename[s.name] = known[(s.expr.buffer, s.expr.index, s.expr.guards)]
            continue
        fold_body.append(s)
    second_fold = [renamed(s, rename) for s in fold_body]
    fold = dataclasses.replace(a.fold, body=(*a.fold.body, *second_fold))
    inner = (*a.before, *(renamed(s, rename) for s in b.before), fold, *a.after,
             *(renamed(s, rename) for s in b.after))
    for var, extent in reversed(a.free):
        inner = (Loop(var, extent, inner),)
    return Kernel(first.name, first.output, first.type, inner, (*first.more_outputs, *second.outputs))


def names_apart(names, taken: set[str]) -> dict[str, str]:
    """A new name for each of `names` that none of `taken` (nor another new one) has: name_1, ..."""
    taken, rename = set(taken), {}
    for name in sorted(names):
        rename[name] = fresh_name(name, taken)
        taken.add(rename[name])
    return rename


def local_names(body) -> set[str]:
    """The values and accumulators statements (loops searched) define."""
    found = set()
    for s in statements(body):
        if isinstance(s, Assign):
            found.add(s.name)
        elif isinstance(s, (Init, Accumulate, Update)):
            found.add(s.acc)
    return found


def reads_of(body) -> set[str]:
    """The buffers statements load, and the index tensors their indices and guards read."""
    loaded = {s.expr.buffer for s in statements(body) if isinstance(s, Assign) and isinstance(s.expr, Load)}
    return loaded | index_tensors(body)


def _loads(body) -> set[tuple]:
    return {(s.expr.buffer, s.expr.index, s.expr.guards) for s in body
            if isinstance(s, Assign) and isinstance(s.expr, Load)}


def _twisted(fold: Loop) -> bool:
    return any(isinstance(s, Update) for s in fold.body)
