"""Which loads of a row's sweep (or later fold) read again what its fold loaded.

A row kernel folds its row (a mean, a maximum), then sweeps it to write the
result, loading the same elements again. Under STAGE=regs the fold keeps
those elements in registers and the sweep takes them from there: the row is
read from memory once. One function says which loads those are, for the
three places that must agree on it: the schedule rules (a row is offered
STAGE=regs only when it has one, emmy.schedule.shape's `held` flag), the
cost model (the re-reads it no longer prices, emmy/schedule/loop_cost.py)
and the lowering (the loads it keeps, emmy/kernel_ir/lower.py).
"""

from __future__ import annotations

from emmy.affine import Affine
from emmy.loop_ir.nodes import Assign, Load, Loop, statements


def held_loads(body) -> dict[str, str]:
    """Later load name -> fold load name, for every unguarded load directly in a loop that follows
    a fold in the same statement list, has the fold's extent and loads the buffer at the index an
    unguarded load directly in the fold does (the later loop's variable standing for the fold's):
    a sweep, or a second fold (a variance after its mean). `body`: a Loop IR kernel's statements."""
    extents: dict[int, int] = {}
    for stmt in statements(body):
        if isinstance(stmt, Loop):
            extents[stmt.var] = stmt.extent
    walker = max(extents, default=0) + 1  # one variable every compared loop's stands for
    found: dict[str, str] = {}
    lists = [body] + [s.body for s in statements(body) if isinstance(s, Loop)]
    # built once: a kernel of many loops (an unrolled recurrence) would otherwise pay loops x variables
    identity = [Affine.dim(v) for v in range(walker + 1)]
    bounds = [extents.get(v, 1) for v in range(walker)] + [1]
    for stmts in lists:
        seen: dict[tuple, str] = {}  # (extent, buffer, index over `walker`) -> the fold load that reads it
        for loop in (s for s in stmts if isinstance(s, Loop)):
            bounds[walker] = loop.extent
            mapping = list(identity)  # pointers copied: the Affines themselves are built once
            mapping[loop.var] = identity[walker]
            for stmt in _plain_loads(loop.body):
                key = (loop.extent, stmt.expr.buffer, tuple(e.substitute(mapping, bounds) for e in stmt.expr.index))
                if key in seen:
                    found[stmt.name] = seen[key]
                elif loop.reduction:
                    seen[key] = stmt.name
    return found


def _plain_loads(stmts):
    return [s for s in stmts if isinstance(s, Assign) and isinstance(s.expr, Load) and not s.expr.guards]


def invariant_loads(body) -> list[str]:
    """The loads directly in a row's sweep (a free loop following a fold) whose index names none of
    the row's variables: every row reads the same elements (a LayerNorm's weight and bias), so a
    grid-synced block, whose slice of the row is the same every row, can keep its share of them
    in shared memory (STAGE=regs/w<N>: the first N). One per (buffer, index), in program order."""
    found: list[str] = []
    seen: set = set()

    def walk(stmts, row_vars: frozenset) -> None:
        folded = False
        for stmt in stmts:
            if not isinstance(stmt, Loop):
                continue
            if stmt.reduction:
                folded = True
            elif folded:
                for load in _plain_loads(stmt.body):
                    key = (load.expr.buffer, load.expr.index)
                    named = set().union(*(e.dims() for e in load.expr.index)) if load.expr.index else set()
                    if not named & row_vars and key not in seen:
                        seen.add(key)
                        found.append(load.name)
            walk(stmt.body, row_vars | {stmt.var} if not stmt.reduction and not folded else row_vars)

    walk(body, frozenset())
    return found
