"""Extraction: one term per e-class, then the kernel boundaries.

1. Representatives. Every e-class gets one non-`mat` node, the cheapest by a
   small tree cost (weights per op); ties go to the smallest structural key,
   so the choice never depends on e-class numbering or insertion order: this
   is what makes `x+x+y` and `y+(x+x)` print the same (commutative operands
   come out in one canonical order).
2. Boundaries. A class whose fused form is equal to its `mat` form may be
   materialized or fused into its consumers. Starting from the fewest kernels
   (outputs and forced boundaries only), we add the boundary that lowers the
   program's cost most, until none does. The cost is measured on the lowered
   Loop IR, so recomputation and hoisting are counted as they will run.
"""

from __future__ import annotations

import hashlib
import random
from dataclasses import dataclass

from emmy.egraph.view import ClassRef, EGraphView, ENode
from emmy.loop_ir.lower import KernelLowering
from emmy.loop_ir.nodes import LoopProgram
from emmy.tensor_ir.nodes import TensorType

_WEIGHTS = {"divide": 4.0, "power": 8.0, "exp": 2.0, "log": 2.0, "cast": 0.5}


def node_weight(node: ENode) -> float:
    if node.kind == "literal":
        return 0.0
    if node.kind in ("unary", "binary"):
        return _WEIGHTS.get(node.args[0], 1.0)
    return 1.0


def choose_representatives(view: EGraphView, weight=node_weight) -> dict[str, ENode]:
    """Cheapest non-mat node per class (a mat node only where a class has nothing else)."""
    inf = float("inf")
    cost = {cid: inf for cid in view.classes}
    changed = True
    while changed:  # Bellman-Ford: weights are positive except literal leaves
        changed = False
        for cid, nodes in view.classes.items():
            for node in nodes:
                penalty = 1e9 if node.kind == "mat" else 0.0
                c = weight(node) + penalty + sum(cost[ch] for ch in node.children)
                if c < cost[cid] - 1e-12:
                    cost[cid] = c
                    changed = True
    keys: dict[str, str] = {}
    choice: dict[str, ENode] = {}

    def key_of(cid: str) -> str:
        if cid not in keys:
            best = [n for n in view.classes[cid] if _node_cost(n, cost, weight) <= cost[cid] + 1e-9]
            scored = sorted((_node_key(n, key_of), n) for n in best)
            keys[cid], choice[cid] = scored[0][0], scored[0][1]
        return keys[cid]

    for cid in view.classes:
        if cost[cid] < inf:
            key_of(cid)
    return choice


def _node_cost(node: ENode, cost, weight) -> float:
    return weight(node) + (1e9 if node.kind == "mat" else 0.0) + sum(cost[c] for c in node.children)


def _node_key(node: ENode, key_of) -> str:
    parts = [node.kind] + [key_of(arg) if isinstance(arg, ClassRef) else repr(arg) for arg in node.args]
    return hashlib.sha1("|".join(parts).encode()).hexdigest()


def random_weights(seed: int):
    """Node weights that make extraction pick other (equal) terms: for soundness checks."""
    rng = random.Random(seed)
    table: dict[str, float] = {}

    def weight(node: ENode) -> float:
        if node.id not in table:
            table[node.id] = 0.0 if node.kind == "literal" else rng.uniform(0.5, 3.0)
        return table[node.id]

    return weight


def reachable(choice: dict[str, ENode], roots) -> list[str]:
    seen: list[str] = []
    stack = list(roots)
    visited = set()
    while stack:
        cid = stack.pop()
        if cid in visited:
            continue
        visited.add(cid)
        seen.append(cid)
        stack.extend(choice[cid].children)
    return seen


def contains_reduction(choice: dict[str, ENode]) -> dict[str, bool]:
    memo: dict[str, bool] = {}

    def visit(cid: str) -> bool:
        if cid not in memo:
            memo[cid] = False  # guards against (impossible) cycles
            node = choice[cid]
            memo[cid] = node.kind == "reduce" or any(visit(c) for c in node.children)
        return memo[cid]

    for cid in choice:
        visit(cid)
    return memo


@dataclass(frozen=True)
class Extraction:
    program: LoopProgram
    cost: float  # predicted seconds, from extract.loop_cost
    kernel_costs: tuple
    boundaries: frozenset


class BoundarySearch:
    """Lower and cost a Tensor IR graph's e-graph for a set of materialized e-classes."""

    def __init__(self, view: EGraphView, choice: dict[str, ENode], graph):
        from emmy.tensor_ir.nodes import Input, Weight

        self.view = view
        self.choice = choice
        # (e-class, output buffer name); an output whose only form is mat(child) is the child's kernel.
        self.outputs = [(_unwrap(choice, view.class_of_name(name)), name) for name in graph.outputs]
        # input/weight buffer name -> "input" | "weight"
        self.buffer_kinds = {n.name: "input" if isinstance(n, Input) else "weight"
                             for n in graph.nodes if isinstance(n, (Input, Weight))}
        self._kernels: dict = {}

    @property
    def roots(self) -> frozenset:
        return frozenset(c for c, _ in self.outputs)

    def live(self) -> list[str]:
        return reachable(self.choice, self.roots)

    def required(self) -> frozenset:
        """Boundaries every program has: the outputs, and classes with no fused form."""
        return self.roots | {self.choice[c].args[0] for c in self.live() if self.choice[c].kind == "mat"}

    def optional(self) -> list[str]:
        """Live classes whose fused and materialized forms are equal: the choices to make."""
        return [c for c in self.live() if _optional(self.view, c)]

    def region(self, root: str, boundaries) -> set[str]:
        seen, stack = set(), [root]
        while stack:
            cid = stack.pop()
            if cid in seen:
                continue
            seen.add(cid)
            if cid != root and cid in boundaries:
                continue
            stack.extend(self.choice[cid].children)
        return seen

    def buffer_names(self, boundaries) -> dict[str, str]:
        names: dict[str, str] = {}
        taken = set(self.buffer_kinds)
        for cid, name in self.outputs:
            if cid in names:
                continue  # two outputs with one value share its buffer
            # An output that is an input (or weight) as it stands still gets a buffer of its own.
            while name in taken:
                name += "_out"
            names[cid] = name
            taken.add(name)
        for cid in sorted(boundaries):
            if cid in names:
                continue
            base = self.view.names.get(cid, "t")
            name, k = base, 1
            while name in taken:
                name, k = f"{base}_{k}", k + 1
            names[cid] = name
            taken.add(name)
        return names

    def lower(self, boundaries: frozenset) -> Extraction:
        from emmy.extract.loop_cost import kernel_cost

        names = self.buffer_names(boundaries)
        order = self._kernel_order(boundaries)
        kernels, costs = [], []
        sizes = self._sizes(names)
        for root in order:
            region = self.region(root, boundaries)
            key = (root, names[root], frozenset((c, names[c]) for c in region & boundaries))
            if key not in self._kernels:
                lowering = KernelLowering(self.view, self.choice, {c: names[c] for c in boundaries})
                kernel = lowering.lower(root, f"k_{names[root]}", names[root])
                self._kernels[key] = (kernel, kernel_cost(kernel, sizes))
            kernel, cost = self._kernels[key]
            kernels.append(kernel)
            costs.append(cost)
        program = LoopProgram(
            tuple(kernels),
            tuple((n, self._buffer_type(n)) for n in self._leaves("input")),
            tuple((n, self._buffer_type(n)) for n in self._leaves("weight")),
            tuple(names[cid] for cid, _ in self.outputs),
        )
        return Extraction(program, sum(c.time for c in costs), tuple(costs), boundaries)

    def _leaves(self, kind: str) -> list[str]:
        found = []
        for cid in self.live():
            node = self.choice[cid]
            if node.kind == "buffer" and self.buffer_kinds.get(node.args[0]) == kind and node.args[0] not in found:
                found.append(node.args[0])
        return sorted(found)

    def _buffer_type(self, name: str) -> TensorType:
        for cid, nodes in self.view.classes.items():
            if any(n.kind == "buffer" and n.args[0] == name for n in nodes):
                return self.view.type(cid)
        raise KeyError(name)

    def _sizes(self, names: dict[str, str]) -> dict[str, tuple[int, int]]:
        sizes = {}
        for cid, name in names.items():
            t = self.view.type(cid)
            sizes[name] = (t.numel, t.dtype.itemsize)
        for name in self.buffer_kinds:
            try:
                t = self._buffer_type(name)
            except KeyError:
                continue
            sizes[name] = (t.numel, t.dtype.itemsize)
        return sizes

    def _kernel_order(self, boundaries) -> list[str]:
        order: list[str] = []
        state: dict[str, int] = {}

        def visit(root: str) -> None:
            if state.get(root) == 2:
                return
            state[root] = 1
            for dep in sorted(self.region(root, boundaries) & boundaries):
                if dep != root and state.get(dep) != 1:
                    visit(dep)
            state[root] = 2
            order.append(root)

        for cid, _ in self.outputs:
            visit(cid)
        return order


def extract_program(view: EGraphView, graph, choice: dict[str, ENode] | None = None) -> Extraction:
    choice = choice or choose_representatives(view)
    search = BoundarySearch(view, choice, graph)
    current = search.required()
    candidates = _boundary_choices(search)
    best = search.lower(current)
    while candidates:
        trials = [(search.lower(current | {c}), c) for c in candidates]
        trial, chosen = min(trials, key=lambda t: (t[0].cost, t[1]))
        if trial.cost >= best.cost * (1 - 1e-9):
            break
        best, current = trial, current | {chosen}
        candidates.remove(chosen)
    return best


def boundary_neighbours(view: EGraphView, graph, choice: dict[str, ENode], found: Extraction):
    """The programs one boundary away from `found` (a reduction's result materialized that was
    fused, or fused that was materialized): (e-class name, added?, Extraction) each. These are
    what the schedule-aware model weighs against the greedy choice."""
    search = BoundarySearch(view, choice, graph)
    required = search.required()
    for cid in _boundary_choices(search):
        if cid in required:
            continue
        added = cid not in found.boundaries
        yield view.names.get(cid, cid), added, search.lower(found.boundaries ^ {cid})


def _boundary_choices(search: BoundarySearch) -> list[str]:
    """Optional boundaries worth a kernel of their own: results of reductions (a fused elementwise
    producer is recomputed for nearly nothing, so cutting there never pays)."""
    reduces = contains_reduction(search.choice)
    required = search.required()
    return [c for c in search.optional() if c not in required and reduces[c]]


def _unwrap(choice: dict[str, ENode], cid: str) -> str:
    """An output whose only form is mat(child) is computed by the child's kernel."""
    while choice[cid].kind == "mat":
        cid = choice[cid].args[0]
    return cid


def _optional(view: EGraphView, cid: str) -> bool:
    """A boundary is a choice where the class holds mat(itself): fused and unfused are equal."""
    return any(n.kind == "mat" and n.args[0] == cid for n in view.classes[cid])
