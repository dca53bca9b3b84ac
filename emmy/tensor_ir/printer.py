"""`--ir tensor`: one `let` per node, constants inlined, provenance as comments."""

from __future__ import annotations

import math

from emmy.tensor_ir.nodes import Constant, Elementwise, IndexMap, Input, Reduce, TensorGraph, Weight


def literal(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        if math.isinf(value):
            return "inf" if value > 0 else "-inf"
        if math.isnan(value):
            return "nan"
        return repr(value)
    return str(value)


def print_tensor_ir(graph: TensorGraph) -> str:
    constants = {n.name: literal(n.value) for n in graph.nodes if isinstance(n, Constant)}
    lines: list[str] = []
    origin = None
    for node in graph.nodes:
        if isinstance(node, Input):
            lines.append(f"input {node.name}: {node.type};")
            continue
        if isinstance(node, Weight):
            lines.append(f"weight {node.name}: {node.type};")
            continue
        if isinstance(node, Constant):
            continue
        if node.origin and node.origin != origin:
            lines.append(f"# {node.origin}")
            origin = node.origin
        lines.append(f"let {node.name}: {node.type} = {_expression(node, graph, constants)};")
    lines.append(f"return {', '.join(graph.outputs)};")
    return "\n".join(lines) + "\n"


def _expression(node, graph: TensorGraph, constants: dict[str, str]) -> str:
    if isinstance(node, Elementwise):
        args = ", ".join(constants.get(o, o) for o in node.operands)
        if node.op == "cast":
            return f"cast<{node.type.dtype}>({args})"
        return f"{node.op}({args})"
    if isinstance(node, Reduce):
        rank = graph[node.operand].type.rank
        return f"{node.op}({node.operand}, axis={node.axis - rank})"
    if isinstance(node, IndexMap):
        if node.operand in constants:
            text = constants[node.operand]
        else:
            text = f"{node.operand}[{', '.join(str(e) for e in node.index)}]"
        if node.guards:
            text += f" if {' and '.join(str(g) for g in node.guards)} else {literal(node.fill)}"
        return text
    raise TypeError(node)  # pragma: no cover
