"""Extraction: representatives, then kernel boundaries and fold forms chosen by price.

1. Representatives (`representatives.py`): every e-class's cheapest node by a small tree
   cost, twice: with the one-pass (twisted) folds and without them, so each fold's two
   forms are at hand.
2. Boundaries and forms (`search.py`): a local search over the cut of the program into
   kernels, priced by `price` ([(Kernel, buffer types)] -> [KernelPrice]): the cost model's
   best row per kernel when a target is known (emmy.schedule.pricing), else the provisional
   Loop IR cost (`loop_cost_price`).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from emmy.egraph.kernels import ChosenGraph, Kernels
from emmy.schedule.pricing import KernelPrice
from emmy.egraph.representatives import TWISTED, choose_representatives, without_twists
from emmy.egraph.search import BoundarySearch, Decision, SearchReport
from emmy.egraph.view import EGraphView
from emmy.loop_ir.nodes import LoopProgram


@dataclass(frozen=True)
class Extraction:
    program: LoopProgram
    seconds: float  # the sum of the kernels' prices
    decisions: tuple[Decision, ...] = ()
    search: SearchReport | None = None
    kernel_prices: tuple[KernelPrice, ...] = ()  # in the program's kernel order
    alternative: object = None  # Decision -> the LoopProgram with its alternative taken


def loop_cost_price(items) -> list[KernelPrice]:
    """Prices from the provisional Loop IR cost (emmy/schedule/loop_cost.py): used where no target is given."""
    from emmy.schedule.loop_cost import kernel_cost

    out = []
    for kernel, types in items:
        cost = kernel_cost(kernel, {name: (t.numel, t.dtype.itemsize) for name, t in types.items()})
        out.append(KernelPrice(cost.time, cost.bytes_read + cost.bytes_written, 1, "", "Loop IR cost"))
    return out


def other_forms(view: EGraphView, one_pass: dict, multi_pass: dict) -> dict:
    """Class -> the other form of its fold, for classes whose two representatives differ in
    whether they are a one-pass (twisted) fold."""
    found = {}
    for cid, node in one_pass.items():
        other = multi_pass.get(cid)
        if other is None or other.id == node.id or other.kind == "mat":
            continue
        if (node.kind in TWISTED) != (other.kind in TWISTED):
            found[cid] = other
    return found


def extract(view: EGraphView, graph, price=loop_cost_price, seconds: float = 60.0) -> Extraction:
    one_pass = choose_representatives(view)
    multi_pass = choose_representatives(view, without_twists)
    chosen = ChosenGraph(view, one_pass, graph)
    forms = {cid: (one_pass[cid], other) for cid, other in other_forms(view, one_pass, multi_pass).items()}
    search = BoundarySearch(chosen, price, forms, seconds)
    result = search.run()
    found = _assemble(result.kernels, result.decisions, result.report)
    return dataclasses.replace(found, alternative=search.alternative)


def _assemble(kernels: Kernels, decisions, report) -> Extraction:
    program = kernels.program()
    order = kernels.kernel_order(kernels.live_roots())
    prices = tuple(kernels.prices[root] for root in order)
    return Extraction(program, sum(p.seconds or 0.0 for p in prices), tuple(decisions), report, prices)


def program_with(view: EGraphView, graph, choice, boundaries=()) -> LoopProgram:
    """The program under a given choice of representatives, cut at the boundaries every program
    has (outputs, mat-only classes) and at `boundaries`: the extracted variants a soundness check
    runs."""
    chosen = ChosenGraph(view, choice, graph)
    return Kernels(chosen, chosen.required() | set(boundaries), loop_cost_price).program()


def optional_classes(view: EGraphView, graph, choice) -> list[str]:
    """The live classes that may be materialized or fused, under a choice of representatives."""
    chosen = ChosenGraph(view, choice, graph)
    return sorted(c for c in chosen.refs if chosen.live(c) and chosen.optional(c))
