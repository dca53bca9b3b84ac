"""An FX graph that is already ATen, with a value on every node: what torch.compile's AOTAutograd
hands a backend (emmy.dynamo), captured without running torch.export again.

It stands in for the ExportedProgram that emmy.capture.Captured holds, with the few parts emmy
reads: the graph, an input signature (user inputs; the backend passes parameters as inputs too, a
program that takes gradients has its module's weights first: emmy.capture.gradients) and the
nesting of the outputs.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass


class Kind(enum.Enum):
    USER_INPUT = "user_input"
    PARAMETER = "parameter"
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

    def __init__(self, graph_module, weights: dict | None = None):
        """`weights`: placeholder name -> (the module's name for it, its tensor), for placeholders
        that hold weights rather than the caller's inputs."""
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
        weights = dict(weights or {})
        self.graph_signature = GraphSignature(tuple(Spec(Kind.PARAMETER, Arg(n.name), weights[n.name][0])
                                                    if n.name in weights else Spec(Kind.USER_INPUT, Arg(n.name))
                                                    for n in placeholders),
                                              tuple(Spec(Kind.USER_OUTPUT, Arg(getattr(n, "name", str(n))))
                                                    for n in leaves))
        self.call_spec = CallSpec(spec)
        self.state_dict: dict = {target: tensor for target, tensor in weights.values()}
        self.constants: dict = {}

    def module(self):
        return self.graph_module
