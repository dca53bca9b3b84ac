"""An FX graph that is already ATen, with a value on every node: what torch.compile's AOTAutograd
hands a backend (emmy.dynamo), captured without running torch.export again.

It stands in for the ExportedProgram that emmy.capture.Captured holds, with the few parts emmy
reads: the graph, an input signature in which every placeholder is a user input, no weights (the
backend passes parameters as inputs) and the nesting of the outputs.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass


class Kind(enum.Enum):
    USER_INPUT = "user_input"
    USER_OUTPUT = "user_output"


@dataclass(frozen=True)
class Arg:
    name: str


@dataclass(frozen=True)
class Spec:
    kind: Kind
    arg: Arg
    target: str | None = None


@dataclass(frozen=True)
class GraphSignature:
    input_specs: tuple[Spec, ...]
    output_specs: tuple[Spec, ...]

    @property
    def user_outputs(self) -> tuple[str, ...]:
        return tuple(s.arg.name for s in self.output_specs)


@dataclass(frozen=True)
class CallSpec:
    out_spec: object  # torch.utils._pytree.TreeSpec


class AtenGraph:
    """An ATen fx.GraphModule whose placeholders and ops carry `meta["val"]`, as emmy.optimize's input."""

    def __init__(self, graph_module):
        import torch.utils._pytree as pytree

        from emmy.errors import EmmyError

        self.graph_module = graph_module
        self.graph = graph_module.graph
        placeholders = [n for n in self.graph.nodes if n.op == "placeholder"]
        for node in placeholders + [n for n in self.graph.nodes if n.op == "call_function"]:
            if "val" not in node.meta:
                raise EmmyError(f"the ATen graph's node {node.name} carries no value (meta['val']): "
                                "emmy captures such a graph only as torch.compile hands it over")
        (output,) = [n for n in self.graph.nodes if n.op == "output"]
        leaves, spec = pytree.tree_flatten(output.args[0])
        self.graph_signature = GraphSignature(tuple(Spec(Kind.USER_INPUT, Arg(n.name)) for n in placeholders),
                                              tuple(Spec(Kind.USER_OUTPUT, Arg(getattr(n, "name", str(n))))
                                                    for n in leaves))
        self.call_spec = CallSpec(spec)
        self.state_dict: dict = {}
        self.constants: dict = {}

    def module(self):
        return self.graph_module
