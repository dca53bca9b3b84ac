"""One representative node per e-class: the cheapest by a small tree cost.

A class's cost is its cheapest node's weight plus its children's costs
(shared children counted once per use: a tree cost, context-free), as a
tuple compared in order: mat nodes used, then (for the multi-pass forms)
twisted folds used, then folds (each a pass over its operand: one fold over
two merged axes beats a fold of a fold, whatever layouts the merge reads
through), then the work, in exact integers. The
representatives are settled cheapest first, as in Dijkstra's algorithm
generalised to and-or graphs (Knuth, "A generalization of Dijkstra's
algorithm", 1977): a node is priced once every class it reads is settled,
so the walk is a loop over a heap, never a recursion, and cycles in the
e-graph are never followed.

Ties are broken by a rule a rule author can read off the printed terms, not
by a hash: among nodes of equal cost, the one whose operator sorts first
(kind, then its literal arguments: op name, dtype, axis, layout), then the
one whose operand classes were settled first (cheaper operands first; among
equal operands, by the same rule recursively). Settling order is a total
order that does not depend on e-class ids, so `x+x+y` and `y+(x+x)` extract
to the same term.
"""

from __future__ import annotations

import heapq
import random

from emmy.egraph.view import ClassRef, EGraphView, ENode

# Integer weights (half-units), so that costs stay exact however deep the program: a tree cost
# counts a shared value once per use, so it grows exponentially with depth, past what a float
# can tell apart from one more.
_WEIGHTS = {"divide": 8, "power": 16, "exp": 4, "log": 4, "cast": 1}
TWISTED = ("online_sum", "welford_m2", "softmax_wsum")
HEAVY = ("reduce", *TWISTED)  # nodes that carry a loop of their own


def node_weight(node: ENode) -> tuple:
    """(mat nodes, twisted folds avoided, folds, work): compared in that order. A mat node stands
    for its class only where nothing else can."""
    folds = 1 if node.kind in HEAVY else 0
    if node.kind == "mat":
        return (1, 0, 0, 2)
    if node.kind == "literal":
        return (0, 0, 0, 0)
    if node.kind in ("unary", "binary"):
        return (0, 0, 0, _WEIGHTS.get(node.args[0], 2))
    return (0, 0, folds, 2)


def without_twists(node: ENode) -> tuple:
    """Weights under which the multi-pass (untwisted) forms win: the other form of each fold."""
    mats, _, folds, work = node_weight(node)
    return (mats, 1 if node.kind in TWISTED else 0, folds, work)


def random_weights(seed: int):
    """Node weights that make extraction pick other (equal) terms: for soundness checks."""
    rng = random.Random(seed)
    table: dict[str, tuple] = {}

    def weight(node: ENode) -> tuple:
        if node.id not in table:
            table[node.id] = (1 if node.kind == "mat" else 0, 0, 0,
                              0.0 if node.kind == "literal" else rng.uniform(0.5, 3.0))
        return table[node.id]

    return weight


def choose_representatives(view: EGraphView, weight=node_weight) -> dict[str, ENode]:
    """Cheapest non-mat node per class (a mat node only where a class has nothing else)."""
    waiting: dict[str, list[ENode]] = {}  # class -> nodes that read it
    missing: dict[str, int] = {}  # node id -> operand classes not settled yet
    owner: dict[str, str] = {}  # node id -> its class
    heap: list = []
    cost: dict[str, tuple] = {}
    rank: dict[str, int] = {}  # class -> settling position (the tie-break among operands)
    choice: dict[str, ENode] = {}

    def push(cid: str, node: ENode) -> None:
        total = weight(node)
        for child in node.children:
            total = tuple(t + c for t, c in zip(total, cost[child]))
        heapq.heappush(heap, (total, _order_key(node, rank), cid, node.id, node))

    for cid, nodes in view.classes.items():
        for node in nodes:
            owner[node.id] = cid
            distinct = set(node.children)
            missing[node.id] = len(distinct)
            for child in distinct:
                waiting.setdefault(child, []).append(node)
            if not distinct:
                push(cid, node)
    while heap:
        total, _, cid, _, node = heapq.heappop(heap)
        if cid in choice:
            continue
        choice[cid], cost[cid], rank[cid] = node, total, len(rank)
        for parent in waiting.get(cid, ()):
            missing[parent.id] -= 1
            if missing[parent.id] == 0 and owner[parent.id] not in choice:
                push(owner[parent.id], parent)
    return choice


def _order_key(node: ENode, rank: dict[str, int]) -> tuple:
    """The tie-break among nodes of equal cost (see the module docstring)."""
    literals = tuple(repr(a) for a in node.args if not isinstance(a, ClassRef))
    return node.kind == "mat", node.kind, literals, tuple(rank[c] for c in node.children)


def heavy(node: ENode) -> bool:
    """A node that carries a reduction loop of its own (a plain or a twisted fold)."""
    return node.kind in HEAVY
