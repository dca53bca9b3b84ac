"""Tensor IR -> e-graph encoding: every value arrives intact, under names egglog keeps apart."""

import pytest
from egglog import EGraph

import emmy
from emmy.egraph.encode import encode
from emmy.egraph.layout import decode_layout
from emmy.egraph.view import EGraphView
from emmy.tensor_ir.nodes import Constant, Elementwise, IndexMap, Input, Reduce, Weight
from emmy.workloads import WORKLOADS


def _expected(node, class_of):
    """The one e-node a Tensor IR node must encode to (kind, literals and child classes)."""
    dtype = str(node.type.dtype)
    if isinstance(node, (Input, Weight)):
        return ("buffer", (node.name, ",".join(map(str, node.type.shape)), dtype))
    if isinstance(node, Constant):
        return ("literal", (float(node.value), dtype))
    if isinstance(node, Elementwise):
        children = tuple(class_of[o] for o in node.operands)
        if node.op == "where":
            return ("select", (dtype, *children))
        return ("unary" if len(children) == 1 else "binary", (node.op, dtype, *children))
    if isinstance(node, Reduce):
        return ("reduce", (node.op, node.axis, class_of[node.operand]))
    assert isinstance(node, IndexMap)
    return ("reindex", (class_of[node.operand],))


@pytest.mark.parametrize("workload", WORKLOADS, ids=[w.name for w in WORKLOADS])
def test_every_value_round_trips_through_the_egraph(workload):
    graph = emmy.optimize(workload.code).tensor_ir
    egraph = EGraph()
    encode(egraph, graph)
    view = EGraphView.of(egraph)
    class_of = {}
    for node in graph.nodes:
        cid = view.class_of_name(node.name)
        (enode,) = view.classes[cid]
        if not isinstance(node, (Input, Weight, Constant)):
            assert enode.kind == "mat", node.name
            (enode,) = view.classes[enode.args[0]]
        kind, args = _expected(node, class_of)
        got = enode.args[:1] if kind == "reindex" else enode.args
        assert (enode.kind, tuple(got)) == (kind, args), node.name
        if kind == "reindex":
            layout = decode_layout(enode.args[1])
            assert (layout.shape, layout.index) == (node.type.shape, node.index), node.name
        class_of[node.name] = cid


def test_encoding_binds_no_global_lets():
    # egglog-python names the lets it invents `$__expr_N`, and egglog 13.2
    # mixes up globals that differ by trailing digits: a reduce's op "sum"
    # once came back as "up_weight" (MLP, one run in six). The encoder binds
    # no global at all: each value is a union of its term with value(name).
    graph = emmy.optimize(next(w.code for w in WORKLOADS if w.name == "mlp")).tensor_ir
    egraph = EGraph()
    terms = encode(egraph, graph)
    assert egraph._state.expr_to_let_counter == 0
    view = EGraphView.of(egraph)
    assert set(terms) == {n.name for n in graph.nodes} == set(view.classes_named)
    # value nodes name classes; they are not among the nodes extraction chooses from
    assert all(n.kind != "value" for nodes in view.classes.values() for n in nodes)


def test_a_gather_composed_with_itself_stops_at_a_bounded_depth():
    """A one-element position table makes its gather an identity, so the e-graph can compose the
    reindex with itself without end: nested texts once grew past what Python's parser reads
    (as_strided_scatter of a one-element tensor). Composition stops at MAX_GATHER_NESTING."""
    from emmy.affine import Affine, Dim, Gathered
    from emmy.egraph.layout import MAX_GATHER_NESTING, Layout, compose, encode_layout

    read = Affine(((Gathered("table", (Affine(((Dim(0), 1),)),), (1,), 1), 1),))
    gather = encode_layout(Layout((1,), (read,)))
    composed, depth = gather, 1
    while True:
        nxt = compose(composed, gather)
        if not nxt:
            break
        composed, depth = nxt, depth + 1
        assert decode_layout(composed).index[0].terms[0][0].index[0].terms[0][0].buffer == "table"
    assert depth == MAX_GATHER_NESTING
