"""Run Loop IR with numpy, one kernel after another.

Loops are vectorised rather than iterated: loop variable a<i> is an index
array along axis i, so a value computed inside loops over a0 and a2 is an
array varying along axes 0 and 2, and an accumulation over a loop reduces
along that loop's axis. Scalar ops and reductions reuse the Tensor IR
interpreter's definitions, so the two interpreters agree by construction on
what an op means and differ only in how the program is structured.
"""

from __future__ import annotations

from typing import Mapping

import numpy as np

from emmy.dtypes import to_storage
from emmy.loop_ir.nodes import Accumulate, Assign, Init, Kernel, Lit, Load, Loop, LoopProgram, Masked, Op, Store, Update
from emmy.loop_ir.validate import check_defined_before_use, check_fold_reads
from emmy.tensor_ir.interpreter import apply_scalar, reduce_axis
from emmy.tensor_ir.scalar_ops import REDUCE_OPS


def run_program(program: LoopProgram, inputs: Mapping[str, np.ndarray],
                weights: Mapping[str, np.ndarray] | None = None) -> list[np.ndarray]:
    buffers: dict[str, np.ndarray] = {}
    for name, t in program.inputs:
        buffers[name] = to_storage(np.asarray(inputs[name]), t.dtype)
    for name, t in program.weights:
        buffers[name] = to_storage(np.asarray((weights or {})[name]), t.dtype)
    for kernel in program.kernels:
        buffers |= run_kernel(kernel, buffers)
    return [buffers[name] for name in program.outputs]


def _max_var(body) -> int:
    top = -1
    for stmt in body:
        if isinstance(stmt, Loop):
            top = max(top, stmt.var, _max_var(stmt.body))
    return top


def run_kernel(kernel: Kernel, buffers: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Every output the kernel stores, by buffer name."""
    check_fold_reads(kernel.name, kernel.body)  # else this reading and CUDA's could differ
    check_defined_before_use(kernel.name, kernel.body)
    rank = _max_var(kernel.body) + 1
    outs = {name: np.zeros(t.shape, dtype=t.dtype.numpy) for name, t in kernel.outputs}
    state = _State(rank, buffers, outs)
    state.run(kernel.body, {})
    return outs


class _State:
    def __init__(self, rank: int, buffers, out):
        self.rank = rank
        self.buffers = buffers
        self.out = out
        self.values: dict[str, np.ndarray] = {}
        self.dtypes: dict[str, object] = {}

    def coords(self, bound: dict[int, int], step: tuple[int, int] | None = None) -> list:
        """Index arrays for the bound loop variables; `step` = (var, k) pins a sequential loop at k."""
        coords = []
        for v in range(self.rank):
            shape = [1] * self.rank
            if step is not None and v == step[0]:
                coords.append(np.full(shape, step[1], dtype=np.int64))
            elif v in bound:
                shape[v] = bound[v]
                coords.append(np.arange(bound[v]).reshape(shape))
            else:
                coords.append(np.zeros(shape, dtype=np.int64))
        return coords

    def operand(self, value):
        if isinstance(value, Lit):
            return np.asarray(value.value, dtype=value.dtype.numpy)
        return self.values[value]

    def run(self, body, bound: dict[int, int], step: tuple[int, int] | None = None, in_order: bool = False) -> None:
        """Run statements; `step` pins a loop being run in order, `in_order` marks its own body."""
        coords = self.coords(bound, step)
        for stmt in body:
            if isinstance(stmt, Loop):
                if any(isinstance(s, Update) for s in stmt.body):
                    self.run_in_order(stmt, bound)
                else:
                    self.run(stmt.body, {**bound, stmt.var: stmt.extent}, step)
                continue
            if in_order and isinstance(stmt, Accumulate):
                # One element of a loop run in order: combine it into the running value.
                self.values[stmt.acc] = reduce_axis(stmt.op, np.stack(np.broadcast_arrays(
                    self.values[stmt.acc], self.operand(stmt.value))), 0, self.dtypes[stmt.acc].dtype)[0]
                continue
            if isinstance(stmt, Update):
                self.values[stmt.acc] = self.operand(stmt.value)
                continue
            if isinstance(stmt, Assign):
                self.values[stmt.name] = self.evaluate(stmt, coords)
            elif isinstance(stmt, Init):
                self.values[stmt.acc] = _identity(stmt.op, stmt.dtype.numpy)
                self.dtypes[stmt.acc] = stmt
            elif isinstance(stmt, Accumulate):
                self.accumulate(stmt, bound)
            elif isinstance(stmt, Store):
                if not stmt.index:  # a rank-0 output
                    self.out[stmt.buffer][()] = np.asarray(self.operand(stmt.value)).reshape(())
                    continue
                index = tuple(np.asarray(e.evaluate(coords, self.buffers)) for e in stmt.index)
                shape = np.broadcast_shapes(*(i.shape for i in index), np.shape(self.operand(stmt.value)))
                target = tuple(np.broadcast_to(i, shape) for i in index)
                self.out[stmt.buffer][target] = np.broadcast_to(self.operand(stmt.value), shape)

    def run_in_order(self, loop: Loop, bound: dict[int, int]) -> None:
        """A loop whose state is updated in place (Update) runs element by element."""
        inner = {**bound, loop.var: 1}
        for k in range(loop.extent):
            self.run(loop.body, inner, (loop.var, k), in_order=True)

    def accumulate(self, stmt: Accumulate, bound: dict[int, int]) -> None:
        init = self.dtypes[stmt.acc]
        # The accumulation runs over the innermost loop it sits in: the last variable bound.
        var = list(bound)[-1]
        value = self.operand(stmt.value)
        shape = [1] * self.rank
        for v, extent in bound.items():
            shape[v] = extent
        value = np.broadcast_to(value, np.broadcast_shapes(np.shape(value), tuple(shape)))
        self.values[stmt.acc] = reduce_axis(stmt.op, value, var, init.dtype)

    def evaluate(self, stmt: Assign, coords):
        expr = stmt.expr
        if isinstance(expr, Load):
            source = self.buffers[expr.buffer]
            index = [np.asarray(e.evaluate(coords, self.buffers)) for e in expr.index]
            # Masked reads may point outside the buffer; the mask discards those lanes.
            index = [np.clip(i, 0, max(n - 1, 0)) for i, n in zip(index, source.shape)]
            if not index:
                return source.reshape([1] * self.rank)
            shape = np.broadcast_shapes(*(i.shape for i in index))
            value = source[tuple(np.broadcast_to(i, shape) for i in index)]
            if expr.guards:  # where a guard fails the load does not happen: the element is 0
                valid = np.asarray(True)
                for g in expr.guards:
                    valid = valid & g.holds(coords, self.buffers)
                value = np.where(valid, value, np.zeros((), value.dtype))
            return value
        if isinstance(expr, Op):
            return apply_scalar(expr.op, stmt.dtype, [self.operand(a) for a in expr.args])
        if isinstance(expr, Masked):
            valid = np.asarray(True)
            for g in expr.guards:
                valid = valid & g.holds(coords, self.buffers)
            return to_storage(np.where(valid, self.operand(expr.value), np.asarray(expr.fill)), stmt.dtype)
        raise TypeError(expr)


def _identity(op: str, dtype) -> np.ndarray:
    """A fold's starting value in its dtype: an integer max (min) starts at the type's least (greatest)
    value, as the emitted CUDA does, not at an infinity integers cannot hold."""
    value = REDUCE_OPS[op]
    if dtype == np.bool_ and np.isinf(value):  # a bool max starts at False, a min at True (not bool(-inf))
        return np.asarray(value > 0)
    if np.issubdtype(dtype, np.integer) and np.isinf(value):
        info = np.iinfo(dtype)
        value = info.max if value > 0 else info.min
    return np.asarray(value, dtype=dtype)
