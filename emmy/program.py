"""A compiled program: every pipeline stage built so far, printable by name."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import numpy as np

from emmy.errors import EmmyError, StageNotBuiltError

STAGES = ("torch", "tensor", "loop", "tile", "kernel", "cuda")
BUILT_STAGES = ("torch", "tensor")


@dataclass(frozen=True)
class Program:
    captured: object  # emmy.capture.Captured
    target: object  # emmy.extract.targets.Target

    @cached_property
    def tensor_program(self):
        from emmy.decompose import to_tensor_ir

        return to_tensor_ir(self.captured)

    @property
    def tensor_ir(self):
        return self.tensor_program.graph

    @property
    def weights(self) -> dict[str, np.ndarray]:
        return self.tensor_program.weights

    @property
    def example_inputs(self) -> tuple | None:
        return self.captured.example_inputs

    def ir(self, stage: str) -> str:
        """The text of one stage (`torch`, `tensor`, ...)."""
        if stage not in STAGES:
            raise EmmyError(f"unknown IR stage {stage!r}; stages are {', '.join(STAGES)}")
        if stage == "torch":
            from emmy.capture.printer import print_torch_ir

            return print_torch_ir(self.captured)
        if stage == "tensor":
            from emmy.tensor_ir.printer import print_tensor_ir

            return print_tensor_ir(self.tensor_ir)
        raise StageNotBuiltError(f"the {stage} stage is not built yet; stages so far: {', '.join(BUILT_STAGES)}")

    def interpret(self, *inputs) -> list:
        """Run the Tensor IR reference interpreter; inputs and outputs are torch tensors."""
        from emmy.dtypes import from_numpy, to_numpy
        from emmy.tensor_ir.interpreter import evaluate

        graph = self.tensor_ir
        given = inputs or self.example_inputs
        if given is None or len(given) != len(graph.inputs):
            raise EmmyError(f"the program takes {len(graph.inputs)} inputs, got {0 if given is None else len(given)}")
        arrays = {node.name: to_numpy(t)[0] for node, t in zip(graph.inputs, given)}
        results = evaluate(graph, arrays, self.weights)
        return [from_numpy(r, graph[name].type.dtype) for r, name in zip(results, graph.outputs)]
