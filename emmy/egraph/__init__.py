"""The e-graph bridge: the only package that knows egglog.

`optimize_loops` loads Tensor IR as terms, runs the rule phases under
budgets, and extracts a Loop IR program.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable

from emmy.egraph.driver import Budget, PhaseReport
from emmy.loop_ir.nodes import LoopProgram
from emmy.schedule.pricing import KernelPrice

if TYPE_CHECKING:  # annotations only: the search and egglog load when optimize_loops runs
    from egglog import EGraph

    from emmy.egraph.search import Decision, SearchReport


@dataclass(frozen=True)
class LoopResult:
    program: LoopProgram
    reports: tuple[PhaseReport, ...]
    predicted_seconds: float | None  # the sum of `program`'s kernel prices (None: one is unpriceable)
    egraph: EGraph | None = None  # the saturated e-graph
    terms: dict | None = None  # Tensor IR value name -> its Term in `egraph`
    # What extraction chose and what each alternative would have cost.
    decisions: tuple[Decision, ...] = ()
    search: SearchReport | None = None  # rounds, moves priced, budget
    kernel_prices: tuple[KernelPrice, ...] = ()  # per kernel of `program`, in its order
    alternative_of: Callable[[Decision], LoopProgram] | None = None  # see `alternative`

    def alternative(self, decision):
        """The Loop IR program extraction would have made with `decision`'s alternative taken."""
        return self.alternative_of(decision)

    def warnings(self) -> list[str]:
        """One line per budget that ran out (saturation phases, the boundary search)."""
        lines = [r.warning() for r in self.reports if not r.saturated]
        if self.search is not None and self.search.warning():
            lines.append(self.search.warning())
        return lines


def groups_by_phase(groups):
    from emmy.rules import PHASES

    return [(phase, [g for g in groups if g.phase == phase]) for phase in PHASES]


def saturate(graph, groups, budget: Budget, egraph=None):
    """An e-graph holding `graph`, with every phase run; returns (egraph, terms, reports)."""
    from egglog import EGraph

    from emmy.egraph.driver import run_phase
    from emmy.egraph.encode import encode

    from emmy.egraph.driver import enode_count
    from emmy.egraph.shapes import units as shape_units

    egraph = egraph or EGraph()
    terms = encode(egraph, graph)
    encoded = enode_count(egraph)
    reports = []
    phases = []
    for phase, members in groups_by_phase(groups):
        units = [unit for g in members for unit in g.units]
        if units:
            phases.append((phase, units))
    if phases:  # the shape analysis runs with the first phase, so every later one finds shapes set
        phases[0] = (phases[0][0], shape_units() + phases[0][1])
    # Later phases expose work for earlier ones (fusion removes the kernel
    # boundaries that kept two layouts from composing), so the sequence runs
    # again until a whole round changes nothing, at most ROUNDS times.
    for round_ in range(ROUNDS):
        changed = False
        for phase, units in phases:
            name = phase if round_ == 0 else f"{phase} (round {round_ + 1})"
            report = run_phase(egraph, name, units, budget, encoded)
            reports.append(report)
            changed = changed or report.changed or not report.saturated
        if not changed:
            break
    return egraph, terms, tuple(reports)


ROUNDS = 3


def optimize_loops(graph, groups, budget: Budget = Budget(), price=None, search_seconds: float = 60.0) -> LoopResult:
    """Saturate, then extract. `price` ([(Kernel, buffer types)] -> [KernelPrice]; e.g. the cost
    model's best row per kernel, emmy.schedule.pricing.KernelPricer) decides kernel boundaries and
    fold forms; without it the provisional Loop IR cost does (emmy.egraph.extract)."""
    from emmy.egraph.extract import extract, loop_cost_price
    from emmy.egraph.view import EGraphView
    from emmy.loop_ir.into_reader import merge_into_readers
    from emmy.loop_ir.nodes import buffer_types
    from emmy.loop_ir.siblings import merge_sibling_folds

    egraph, terms, reports = saturate(graph, groups, budget)
    view = EGraphView.of(egraph)
    price = price or loop_cost_price
    found = extract(view, graph, price, search_seconds)
    program = merge_sibling_folds(found.program, _cheaper_merged(found.program, price))
    program = merge_into_readers(program, _cheaper_merged(program, price))
    seconds, prices = found.seconds, found.kernel_prices
    if program is not found.program:  # merged kernels: priced again (the pricer's memo has the rest)
        types = buffer_types(program)
        prices = tuple(price([(k, types) for k in program.kernels]))
        seconds = None if any(p.seconds is None for p in prices) else sum(p.seconds for p in prices)
    return LoopResult(program, reports, seconds, egraph, terms, found.decisions, found.search, prices,
                      found.alternative)


def _cheaper_merged(program, price):
    """Whether a kernel merged into its reader is priced (by `price`) no dearer than the two."""
    from emmy.loop_ir.nodes import buffer_types

    types = buffer_types(program)

    def accept(first, second, merged) -> bool:
        apart_first, apart_second, together = price([(first, types), (second, types), (merged, types)])
        known = (apart_first.seconds, apart_second.seconds, together.seconds)
        return None not in known and together.seconds <= apart_first.seconds + apart_second.seconds

    return accept
