"""Guards: numbers a program read from its inputs and was compiled for, checked on every call.

A program that reads an integer from an input into Python (`int(lengths.max())`) is compiled for the
value the example inputs gave (emmy.capture.guarded_reads). What it was read from stays as a small
Tensor IR graph over the inputs; each call evaluates it (in numpy, before any kernel runs) and a
call whose value differs is refused with the line that read it and both values.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping

import numpy as np

from emmy.tensor_ir.nodes import Input, TensorGraph, Weight, operands_of


@dataclass(frozen=True)
class GuardedRead:
    """A number the program read from its inputs and was compiled for."""

    expected: int
    where: str  # the line that read it (emmy.capture.source.Location's text)


@dataclass(frozen=True)
class Guards:
    graph: TensorGraph  # one rank-0 output per read, in order, over the program's inputs and weights
    reads: tuple[GuardedRead, ...]
    weights: dict = field(compare=False)  # the weights the graph reads: name -> numpy array

    @classmethod
    def of(cls, nodes, values: list[str], reads: list[GuardedRead], weights: Mapping) -> Guards | None:
        """The guards computing `values` (Tensor IR names among `nodes`, in graph order; `weights`:
        the arrays of their weights): only the nodes they stand on are kept. None without any."""
        if not values:
            return None
        needed = set(values)
        for node in reversed(nodes):
            if node.name in needed:
                needed.update(operands_of(node))
        kept = tuple(node for node in nodes if node.name in needed)
        read = {node.name: weights[node.name] for node in kept if isinstance(node, Weight)}
        return cls(TensorGraph(kept, tuple(values)).validate(), tuple(reads), read)

    @property
    def input_names(self) -> tuple[str, ...]:
        return tuple(node.name for node in self.graph.nodes if isinstance(node, Input))

    def violation(self, inputs: Mapping[str, np.ndarray]) -> str | None:
        """What the first read that differs on these inputs (interpreter storage, by input name) says,
        or None where every read gives the value the program was compiled for."""
        from emmy.tensor_ir.interpreter import evaluate

        for read, value in zip(self.reads, evaluate(self.graph, inputs, self.weights)):
            got = int(np.asarray(value).reshape(()))
            if got != read.expected:
                return (f"a number read from the inputs at {read.where} is compiled in as the example inputs' value, "
                        f"{read.expected}; these inputs give {got} (compile again for them)")
        return None
