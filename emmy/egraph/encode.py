"""Tensor IR -> e-graph terms, unfused: every computed value starts as mat(...),
a kernel of its own. Each value's name is recorded with a Named fact, so the
extractor finds the outputs' e-classes and names temporary buffers after the
Tensor IR values they came from.

Every node is bound to a global let of our own naming, one node per let, so
that egglog-python never invents its own `$__expr_N` lets. It invents them
for any shared subterm, and egglog 13.2 confuses globals whose names differ
by trailing digits (`$__expr_31` read back as the value of `$__expr_3`;
found as a reduce whose op came back "up_weight"). Our names end in "_", so
no name is another plus digits, and no expression we send shares a subterm.
"""

from __future__ import annotations

from egglog import EGraph, let
from egglog.declarations import LetRefDecl, TypedExprDecl
from egglog.egraph import to_runtime_expr
from egglog.runtime import RuntimeExpr

from emmy.egraph.layout import Layout, encode_layout
from emmy.egraph.terms import Named, Term
from emmy.tensor_ir.nodes import Constant, Elementwise, IndexMap, Input, Reduce, TensorGraph, Weight

def shape_text(shape: tuple[int, ...]) -> str:
    return ",".join(str(s) for s in shape)


def literal_value(value) -> float:
    return float(value)  # booleans and integers ride as floats; the dtype literal says which


def encode(egraph: EGraph, graph: TensorGraph) -> dict[str, Term]:
    """Add `graph` to `egraph`; returns the term of every Tensor IR value by name. The lets are
    sent in batches (one egglog command per node costs more than the rules that follow)."""
    terms: dict[str, Term] = {}
    pending: list = []
    for index, node in enumerate(graph.nodes):
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
        name = let_name("t", index)
        pending.append(let(name, term))
        term = _let_ref(name, term)
        pending.append(let(let_name("n", index), Named(node.name, term)))
        terms[node.name] = term
        if len(pending) >= BATCH:
            egraph.register(*pending)
            pending = []
    if pending:
        egraph.register(*pending)
    return terms


BATCH = 512  # lets per egglog command batch


def _let_ref(name: str, term: Term) -> Term:
    """A reference to the global `name` bound to `term` (what EGraph.let returns, without sending
    the let now), carrying only the declarations `term` needs."""
    runtime = to_runtime_expr(term)
    return RuntimeExpr.__from_values__(runtime.__egg_decls__,
                                       TypedExprDecl(runtime.__egg_typed_expr__.tp, LetRefDecl(name)))


def let_name(kind: str, index: int) -> str:
    """A global's name that is never another global's name plus digits (see above)."""
    return f"emmy_{kind}{index}_"
