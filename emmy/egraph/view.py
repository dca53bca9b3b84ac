"""A read-only view of a saturated e-graph, from egglog's serialized form.

Extraction needs what egglog's tree extractor cannot give: the kernel
boundaries (mat nodes) decided for the whole program at once, with shared
values counted once. So we read every e-class and its nodes here and choose
in Python.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from emmy.dtypes import DType
from emmy.egraph.layout import decode_layout
from emmy.tensor_ir.nodes import TensorType

@dataclass(frozen=True)
class ENode:
    kind: str  # one of terms.CONSTRUCTORS
    args: tuple  # e-class ids (str) for Term children, Python values for literals
    id: str
    children: tuple[str, ...] = field(init=False, compare=False, repr=False)  # the ClassRef args, in order

    def __post_init__(self):
        object.__setattr__(self, "children", tuple(a for a in self.args if isinstance(a, ClassRef)))


class ClassRef(str):
    """An e-class id among a node's arguments (literals are plain values)."""


def _literal(op: str):
    if op.startswith('"'):
        return json.loads(op)
    try:
        return int(op)
    except ValueError:
        return float(op.replace("inf", "Infinity")) if "inf" in op else float(op)


class EGraphView:
    def __init__(self, serialized_json: str):
        data = json.loads(serialized_json)
        nodes = data["nodes"]
        self.classes: dict[str, list[ENode]] = {}
        self.names: dict[str, str] = {}
        self.classes_named: dict[str, str] = {}
        for nid, node in nodes.items():
            op = node["op"]
            if op == "Term.value":  # the Tensor IR value this class holds: a name, not a computation
                name = json.loads(nodes[node["children"][0]]["op"])
                self.classes_named[name] = node["eclass"]
                self.names.setdefault(node["eclass"], name)
                continue
            if not op.startswith("Term."):
                continue
            args = []
            for child in node["children"]:
                child_node = nodes[child]
                if child_node["op"].startswith("Term."):
                    args.append(ClassRef(child_node["eclass"]))
                else:
                    args.append(_literal(child_node["op"]))
            self.classes.setdefault(node["eclass"], []).append(ENode(op[len("Term."):], tuple(args), nid))
        # Before fusion, a named mat(...) class wraps the unnamed class of its computation.
        for cid, name in list(self.names.items()):
            for node in self.classes.get(cid, []):
                if node.kind == "mat" and node.args[0] != cid:
                    self.names.setdefault(node.args[0], name)
        self._types: dict[str, TensorType] = {}

    @classmethod
    def of(cls, egraph) -> "EGraphView":
        return cls(egraph._serialize().to_json())

    def class_of_name(self, name: str) -> str:
        return self.classes_named[name]

    def type(self, cid: str) -> TensorType:
        """Shape and dtype of an e-class (all its nodes agree)."""
        if not self._types:
            self._infer_all()
        found = self._types.get(cid)
        if found is None:
            raise ValueError(f"e-class {cid} has no node whose type can be inferred")
        return found

    def _infer_all(self) -> None:
        """Every class's type, leaves first, without recursion: a node is typed once all its
        children are, and the first typed node of a class types the class."""
        waiting: dict[str, list[ENode]] = {}  # child class -> nodes still waiting on it
        missing: dict[str, int] = {}  # node id -> distinct children not typed yet
        ready: list[tuple[str, ENode]] = []
        for cid, nodes in self.classes.items():
            for node in nodes:
                children = set(node.children)
                missing[node.id] = len(children)
                for child in children:
                    waiting.setdefault(child, []).append((cid, node))
                if not children:
                    ready.append((cid, node))
        while ready:
            cid, node = ready.pop()
            if cid in self._types:
                continue
            self._types[cid] = self._node_type(node)
            for parent_cid, parent in waiting.get(cid, ()):
                missing[parent.id] -= 1
                if missing[parent.id] == 0:
                    ready.append((parent_cid, parent))

    def _node_type(self, node: ENode) -> TensorType:
        a = node.args
        if node.kind == "buffer":
            shape = tuple(int(s) for s in a[1].split(",") if s) if a[1] else ()
            return TensorType(shape, DType(a[2]))
        if node.kind == "literal":
            return TensorType((), DType(a[1]))
        if node.kind in ("unary", "binary", "select"):
            # Literal operands are rank 0; the tensor operands share the result's shape.
            dtype = a[0] if node.kind == "select" else a[1]
            shapes = [self._types[c].shape for c in node.children]
            return TensorType(max(shapes, key=len), DType(dtype))
        if node.kind == "reduce":
            inner = self._types[a[2]]
            shape = list(inner.shape)
            shape[a[1]] = 1
            return TensorType(tuple(shape), inner.dtype)
        if node.kind == "reindex":
            return TensorType(decode_layout(a[1]).shape, self._types[a[0]].dtype)
        if node.kind == "mat":
            return self._types[a[0]]
        if node.kind in ("online_sum", "welford_m2", "softmax_wsum"):
            inner = self._types[a[-1]]
            shape = list(inner.shape)
            shape[a[0]] = 1
            return TensorType(tuple(shape), inner.dtype)
        raise ValueError(node.kind)


def reaches(start: str, goal: str, children) -> bool:
    """Whether `goal` is reachable from `start` through `children(class)` (a depth-first search)."""
    seen, stack = set(), [start]
    while stack:
        cid = stack.pop()
        if cid == goal:
            return True
        if cid not in seen:
            seen.add(cid)
            stack.extend(children(cid))
    return False
