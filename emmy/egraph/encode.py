"""Tensor IR -> e-graph terms, unfused: every computed value starts as mat(...),
a kernel of its own. Each value's name is recorded with a Named fact, so the
extractor finds the outputs' e-classes and names temporary buffers after the
Tensor IR values they came from."""

from __future__ import annotations

from egglog import EGraph

from emmy.egraph.layout import Layout, encode_layout
from emmy.egraph.terms import Named, Term
from emmy.tensor_ir.nodes import Constant, Elementwise, IndexMap, Input, Reduce, TensorGraph, Weight

def shape_text(shape: tuple[int, ...]) -> str:
    return ",".join(str(s) for s in shape)


def literal_value(value) -> float:
    return float(value)  # booleans and integers ride as floats; the dtype literal says which


def encode(egraph: EGraph, graph: TensorGraph) -> dict[str, Term]:
    """Add `graph` to `egraph`; returns the term of every Tensor IR value by name."""
    terms: dict[str, Term] = {}
    for node in graph.nodes:
        dtype = str(node.type.dtype)
        if isinstance(node, (Input, Weight)):
            term = Term.buffer(node.name, shape_text(node.type.shape), dtype)
        elif isinstance(node, Constant):
            term = Term.literal(literal_value(node.value), dtype)
        elif isinstance(node, Elementwise):
            args = [terms[o] for o in node.operands]
            if node.op == "where":
                term = Term.select(dtype, *args)
            elif len(args) == 1:
                term = Term.unary(node.op, dtype, *args)
            else:
                term = Term.binary(node.op, dtype, *args)
        elif isinstance(node, Reduce):
            term = Term.reduce(node.op, node.axis, terms[node.operand])
        elif isinstance(node, IndexMap):
            layout = Layout(node.type.shape, node.index, node.guards, node.fill)
            term = Term.reindex(terms[node.operand], encode_layout(layout))
        else:  # pragma: no cover - closed set of node kinds
            raise TypeError(node)
        if not isinstance(node, (Input, Weight, Constant)):
            term = Term.mat(term)
        egraph.register(Named(node.name, term))
        terms[node.name] = term
    return terms
