"""Checks that a Loop IR kernel means the same run element by element (CUDA) and run a loop at a time
(the numpy interpreter), and that each value is defined before it is read, where the read can see it.

The interpreter evaluates a plain loop's statements over all its elements at once, so a statement in
the loop that reads an accumulator the same loop folds sees the fold's final value, while the CUDA a
thread runs sees the running one. A kernel that does this is a lowering bug (softmax's sum placed in
the loop that folds its max, say); it is refused here rather than compiled to a wrong kernel that
the interpreter would vouch for.
"""

from __future__ import annotations

from emmy.loop_ir.nodes import Accumulate, Assign, Init, Loop, Store, Update, values_read


class FoldReadError(RuntimeError):
    """A Loop IR statement reads an accumulator inside the plain loop that folds it (an emmy bug)."""


def check_fold_reads(kernel_name: str, body: tuple) -> None:
    """Raise FoldReadError where a statement in a plain loop reads an accumulator that loop (or a
    plain loop around it) is still folding. Loops holding Update statements run in order in both
    readings, so their own state may be read inside them."""
    _walk(kernel_name, body, frozenset())


def _walk(kernel_name: str, body: tuple, folding: frozenset) -> None:
    for stmt in body:
        if isinstance(stmt, Loop):
            in_order = any(isinstance(s, Update) for s in stmt.body)
            here = frozenset() if in_order else frozenset(s.acc for s in stmt.body if isinstance(s, Accumulate))
            _walk(kernel_name, stmt.body, folding | here)
            continue
        read = folding.intersection(values_read(stmt))
        if read:
            raise FoldReadError(f"kernel {kernel_name}: {_describe(stmt)} reads {', '.join(sorted(read))} inside "
                                f"the loop that folds it (an emmy lowering bug)")


class UndefinedValueError(RuntimeError):
    """A Loop IR statement reads a value not yet defined where it stands (an emmy bug): statements
    out of order, or a value defined inside a loop read outside it."""


def check_defined_before_use(kernel_name: str, body: tuple) -> None:
    """Raise UndefinedValueError where a statement reads a value (or steps an accumulator) that no
    statement before it, in its loop or a loop around it, defines: C scopes a loop's values to its
    body, and a kernel's statements run in their order."""
    pending = [(iter(body), set())]  # loops being walked, each with the names visible in it
    while pending:
        stmts, visible = pending[-1]
        stmt = next(stmts, None)
        if stmt is None:
            pending.pop()
            continue
        if isinstance(stmt, Loop):
            pending.append((iter(stmt.body), set(visible)))
            continue
        needed = values_read(stmt) | ({stmt.acc} if isinstance(stmt, (Accumulate, Update)) else set())
        missing = needed - visible
        if missing:
            raise UndefinedValueError(f"kernel {kernel_name}: {_describe(stmt)} reads {', '.join(sorted(missing))} "
                                      f"before it is defined where it stands (an emmy lowering bug)")
        if isinstance(stmt, Assign):
            visible.add(stmt.name)
        elif isinstance(stmt, Init):
            visible.add(stmt.acc)


def _describe(stmt) -> str:
    if isinstance(stmt, Assign):
        return f"the value {stmt.name}"
    if isinstance(stmt, Store):
        return f"the store to {stmt.buffer}"
    return f"the step of {stmt.acc}"
