"""Tensor IR -> e-graph terms, unfused: every computed value starts as mat(...),
a kernel of its own.

Each value's term is unioned with `value(name)`, a node that names the
e-class after the Tensor IR value, and its shape is set (terms.shape_of):
operands refer to each other through these names, the extractor finds the
outputs' e-classes by them and names temporary buffers after them, and
`value` nodes are never extracted. Nothing
is bound to a global let: egglog-python invents `$__expr_N` lets for shared
subterms, and egglog 13.2 confuses globals whose names differ by trailing
digits (`$__expr_31` read back as the value of `$__expr_3`; found as a reduce
whose op came back "up_weight"); and a global let costs egglog about half a
millisecond, which a model of thousands of ops would spend many times over.

The union commands are built directly as egglog's command objects and sent
in batches: building each term through egglog-python's expression layer
costs more than the whole saturation of a big program.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np
from egglog import EGraph
from egglog import bindings as egg

from emmy.dtypes import DType
from emmy.egraph.layout import Layout, encode_layout
from emmy.egraph.shapes import shape_text
from emmy.egraph.terms import Term, shape_of
from emmy.errors import UnsupportedOpError
from emmy.tensor_ir.nodes import Constant, Elementwise, IndexMap, Input, Reduce, TensorGraph, Weight, operands_of

BATCH = 1024  # union commands per egglog call
_SPAN = egg.RustSpan("", 0, 0)


def literal_value(node: Constant, graph: TensorGraph | None = None) -> float:
    """The f64 a literal rides as in the e-graph (booleans and integers too: the dtype says which).
    An integer type's extremes (a max or min fold's identity: 2**63 - 1 is no f64) ride as
    infinities, which the lowering reads back as those extremes; any other integer an f64 would
    round is refused, never changed."""
    value = node.value
    if isinstance(value, bool) or not isinstance(value, int) or float(value) == value:
        return float(value)
    info = np.iinfo(node.type.dtype.numpy)
    if value in (int(info.max), int(info.min)):
        return math.inf if value > 0 else -math.inf
    users = [n for n in (graph.nodes if graph is not None else ()) if node.name in operands_of(n)]
    origin = node.origin or next((n.origin for n in users if n.origin), "")
    where = f" in {origin}" if origin else ""
    raise UnsupportedOpError(f"the integer literal {value}{where} needs more than an f64's 53 bits, which "
                             "emmy's optimizer carries literals in; pass it as an input tensor instead")


def literal_of(value: float, dtype: DType):
    """A literal's value read back from its f64: a bool, an int within its type (an infinity
    is the type's extreme), or the float."""
    if dtype is DType.BOOL:
        return bool(value)
    if dtype.is_float:
        return value
    if math.isinf(value):
        info = np.iinfo(dtype.numpy)
        return int(info.max) if value > 0 else int(info.min)
    return int(value)


class ValueTerms(Mapping):
    """Tensor IR value name -> `Term.value(name)`, a term of its e-class (built when asked for:
    most names are never looked up, and each egglog-python term costs a fraction of a millisecond)."""

    def __init__(self, names):
        self._names = list(names)
        self._known = set(self._names)

    def __getitem__(self, name: str) -> Term:
        if name not in self._known:
            raise KeyError(name)
        return Term.value(name)

    def __iter__(self):
        return iter(self._names)

    def __len__(self) -> int:
        return len(self._names)


def encode(egraph: EGraph, graph: TensorGraph) -> ValueTerms:
    """Add `graph` to `egraph`; returns the term of every Tensor IR value by name."""
    fn = {kind: egraph._callable_to_egg(getattr(Term, kind))[1]
          for kind in ("value", "buffer", "literal", "unary", "binary", "select", "reduce", "reindex", "mat")}

    def call(kind: str, *args):
        return egg.Call(_SPAN, fn[kind], list(args))

    def text(value: str):
        return egg.Lit(_SPAN, egg.String(value))

    def ref(name: str):
        return call("value", text(name))

    shape_fn = egraph._callable_to_egg(shape_of)[1]

    commands = []
    for node in graph.nodes:
        dtype = text(str(node.type.dtype))
        if isinstance(node, (Input, Weight)):
            term = call("buffer", text(node.name), text(shape_text(node.type.shape)), dtype)
        elif isinstance(node, Constant):
            term = call("literal", egg.Lit(_SPAN, egg.Float(literal_value(node, graph))), dtype)
        elif isinstance(node, Elementwise):
            args = [ref(o) for o in node.operands]
            if node.op == "where":
                term = call("select", dtype, *args)
            else:
                term = call("unary" if len(args) == 1 else "binary", text(node.op), dtype, *args)
        elif isinstance(node, Reduce):
            term = call("reduce", text(node.op), egg.Lit(_SPAN, egg.Int(node.axis)), ref(node.operand))
        elif isinstance(node, IndexMap):
            layout = Layout(node.type.shape, node.index, node.guards, node.fill)
            term = call("reindex", ref(node.operand), text(encode_layout(layout)))
        else:  # pragma: no cover - closed set of node kinds
            raise TypeError(node)
        if not isinstance(node, (Input, Weight, Constant)):
            term = call("mat", term)
        commands.append(egg.ActionCommand(egg.Union(_SPAN, ref(node.name), term)))
        commands.append(egg.ActionCommand(egg.Set(_SPAN, shape_fn, [ref(node.name)],
                                                  text(shape_text(node.type.shape)))))
    for start in range(0, len(commands), BATCH):
        egraph._egraph.run_program(*commands[start:start + BATCH])
    return ValueTerms(node.name for node in graph.nodes)
