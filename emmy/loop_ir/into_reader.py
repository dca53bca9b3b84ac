"""A kernel computed inside the kernel that reads it, which stores it as a second output.

A value several kernels read is materialized; when its first reader walks the same free loops and
reads it element for element where it was written (an LSTM step's cell state, read by the kernel
computing the step's hidden state, and by the next step), the reader can compute it itself and
store it on the way: one launch instead of two, and that reader no longer loads it back. The
boundary search prices kernels one at a time and cannot see this; the pass runs on its result,
and keeps a merge only where `accept` (the cost model) prices the merged kernel at most the two
it replaces.

A merge needs: the same free loops (variables and extents) in both kernels, the first storing
one output at those loops' coordinates as its last statement, the second loading it only at
those coordinates without guards, no kernel between them reading it (the merged kernel runs
where the second did), and at most one twisted (Update) state between them.
"""

from __future__ import annotations

import dataclasses
from collections import defaultdict
from typing import Callable

from emmy.affine import Affine
from emmy.loop_ir.nodes import (Assign, Kernel, Load, Loop, LoopProgram, Store, Update, free_nest, renamed,
                                statements, substituted)
from emmy.loop_ir.siblings import local_names, names_apart, reads_of
from emmy.loop_ir.validate import check_defined_before_use


def merge_into_readers(program: LoopProgram, accept: Callable[[Kernel, Kernel, Kernel], bool]) -> LoopProgram:
    """`program` with each kernel that may be computed inside its first reader merged into it,
    where `accept(first, reader, merged)` agrees."""
    kernels: list[Kernel | None] = list(program.kernels)
    readers: dict[str, list[int]] = defaultdict(list)
    for i, k in enumerate(kernels):
        for buffer in reads_of(k.body):
            readers[buffer].append(i)
    for i, first in enumerate(kernels):
        if first is None or first.more_outputs:
            continue
        later = [j for j in readers.get(first.output, ()) if j > i and kernels[j] is not None]
        if not later:
            continue
        j = min(later)
        merged = _merged(first, kernels[j])
        if merged is not None and accept(first, kernels[j], merged):
            kernels[j], kernels[i] = merged, None
            for buffer in reads_of(first.body):
                readers[buffer].append(j)
    kept = tuple(k for k in kernels if k is not None)
    return program if len(kept) == len(program.kernels) else dataclasses.replace(program, kernels=kept)


def _merged(first: Kernel, second: Kernel) -> Kernel | None:
    free, inner = free_nest(first.body)
    second_free, second_inner = free_nest(second.body)
    if not free or free != second_free or not inner or not isinstance(inner[-1], Store):
        return None
    store = inner[-1]
    if store.buffer != first.output or not isinstance(store.value, str):
        return None
    if _twisted(inner) and _twisted(second_inner):
        return None
    reads = [s for s in statements(second_inner) if isinstance(s, Assign) and isinstance(s.expr, Load)
             and s.expr.buffer == first.output]
    if not reads or any(s.expr.index != store.index or s.expr.guards for s in reads):
        return None
    # the first's inner loops take variables after the second's; its values take names apart
    used = {var for var, _ in free} | {s.var for s in statements(second_inner) if isinstance(s, Loop)}
    moved = {s.var: max(used) + 1 + k for k, s in enumerate(s for s in statements(inner) if isinstance(s, Loop))}
    rename = names_apart(local_names(inner), local_names(second_inner))
    extents = {var: extent for var, extent in free}
    extents |= {moved[s.var]: s.extent for s in statements(inner) if isinstance(s, Loop)}
    top = max((*moved, *moved.values(), *extents), default=0)
    dims = [Affine.dim(moved.get(var, var)) for var in range(top + 1)]
    bounds = [extents.get(moved.get(var, var), 1) for var in range(top + 1)]
    computed = tuple(renamed(s, rename) for s in substituted(inner, dims, bounds, moved))
    value = rename.get(store.value, store.value)
    dropped = {s.name for s in reads}
    rest = tuple(renamed(s, {name: value for name in dropped}) for s in _without(second_inner, dropped))
    body = (*computed, *rest)
    for var, extent in reversed(free):
        body = (Loop(var, extent, body),)
    merged = Kernel(second.name, second.output, second.type, body, (*second.more_outputs, (first.output, first.type)))
    check_defined_before_use(merged.name, merged.body)
    return merged


def _twisted(body) -> bool:
    return any(isinstance(s, Update) for s in statements(body))


def _without(body: tuple, names: set[str]) -> tuple:
    """`body` without the assignments of `names` (loops searched)."""
    out = []
    for s in body:
        if isinstance(s, Loop):
            out.append(dataclasses.replace(s, body=_without(s.body, names)))
        elif not (isinstance(s, Assign) and s.name in names):
            out.append(s)
    return tuple(out)
