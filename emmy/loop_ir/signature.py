"""A kernel's canonical signature: what its price and its measured times are keyed by.

Two kernels with the same signature compute the same thing the same way on buffers of the
same types: the same loop nest, operations, dtypes, index maps (layouts) and extents, reading
and writing buffers of the same shapes and dtypes in the same roles. Buffer and kernel names
do not count (they are renamed `b0, b1, ...` in order of first use), so the kernels of
repeated layers share one signature and are priced once. Loop IR numbers its loop variables
and values canonically already, so nothing else needs renaming.
"""

from __future__ import annotations

import dataclasses
import hashlib

from emmy.loop_ir.nodes import Assign, Kernel, Load, Loop, Store
from emmy.tensor_ir.nodes import TensorType


def buffers_of(kernel: Kernel) -> list[str]:
    """The buffers a kernel touches, in order of first use (loads, then stores, as they appear)."""
    seen: dict[str, None] = {}
    stack = [iter(kernel.body)]
    while stack:
        stmt = next(stack[-1], None)
        if stmt is None:
            stack.pop()
        elif isinstance(stmt, Loop):
            stack.append(iter(stmt.body))
        elif isinstance(stmt, Assign) and isinstance(stmt.expr, Load):
            seen.setdefault(stmt.expr.buffer, None)
        elif isinstance(stmt, Store):
            seen.setdefault(stmt.buffer, None)
    for name, _ in kernel.outputs:
        seen.setdefault(name, None)
    return list(seen)


def canonical(kernel: Kernel, types: dict[str, TensorType]) -> tuple:
    """The kernel with its buffers renamed by first use, and their types: a hashable key."""
    names = buffers_of(kernel)
    rename = {name: f"b{i}" for i, name in enumerate(names)}

    def body(stmts: tuple) -> tuple:
        out = []
        for stmt in stmts:
            if isinstance(stmt, Loop):
                stmt = dataclasses.replace(stmt, body=body(stmt.body))
            elif isinstance(stmt, Assign) and isinstance(stmt.expr, Load):
                stmt = dataclasses.replace(stmt, expr=dataclasses.replace(stmt.expr, buffer=rename[stmt.expr.buffer]))
            elif isinstance(stmt, Store):
                stmt = dataclasses.replace(stmt, buffer=rename[stmt.buffer])
            out.append(stmt)
        return tuple(out)

    renamed = Kernel("k", rename[kernel.output], kernel.type, body(kernel.body),
                     tuple((rename[name], t) for name, t in kernel.more_outputs))
    return renamed, tuple(types[name] for name in names)


def signature_of(key: tuple) -> str:
    """A short stable text for a canonical key (measurement files and `emmy explain` show it)."""
    return hashlib.sha1(repr(key).encode()).hexdigest()[:16]


def signature(kernel: Kernel, types: dict[str, TensorType]) -> str:
    return signature_of(canonical(kernel, types))
