"""The e-graph bridge: the only package that knows egglog.

`optimize_loops` loads Tensor IR as terms, runs the rule phases under
budgets, and extracts a Loop IR program.
"""

from __future__ import annotations

from dataclasses import dataclass

from emmy.egraph.driver import Budget, PhaseReport
from emmy.errors import EmmyError


@dataclass(frozen=True)
class LoopResult:
    program: object  # emmy.loop_ir.nodes.LoopProgram
    reports: tuple[PhaseReport, ...]
    predicted_seconds: float
    egraph: object = None  # the saturated e-graph: schedules attach rows to kernels' e-classes in it
    terms: dict | None = None  # Tensor IR value name -> its Term in `egraph`
    # The forms weighed against each other: (label, predicted seconds), the chosen one first.
    alternatives: tuple = ()

    def kernel_roots(self) -> dict:
        """Kernel name -> the Term of the value it materializes."""
        terms = self.terms or {}
        return {k.name: terms[k.output] for k in self.program.kernels if k.output in terms}


def groups_by_phase(groups):
    from emmy.rules import PHASES

    return [(phase, [g for g in groups if g.phase == phase]) for phase in PHASES]


def saturate(graph, groups, budget: Budget, egraph=None):
    """An e-graph holding `graph`, with every phase run; returns (egraph, terms, reports)."""
    from egglog import EGraph

    from emmy.egraph.driver import run_phase
    from emmy.egraph.encode import encode

    egraph = egraph or EGraph()
    terms = encode(egraph, graph)
    reports = []
    phases = []
    for phase, members in groups_by_phase(groups):
        if members:
            combined = members[0].ruleset
            labels = dict(members[0].labels)
            for g in members[1:]:
                combined = combined | g.ruleset
                labels.update(g.labels)
            phases.append((phase, combined, labels))
    # Later phases expose work for earlier ones (fusion removes the kernel
    # boundaries that kept two layouts from composing), so the sequence runs
    # again until a whole round changes nothing, at most ROUNDS times.
    for round_ in range(ROUNDS):
        changed = False
        for phase, combined, labels in phases:
            name = phase if round_ == 0 else f"{phase} (round {round_ + 1})"
            report = run_phase(egraph, name, combined, budget, labels)
            reports.append(report)
            changed = changed or report.iterations > 1 or not report.saturated
        if not changed:
            break
    return egraph, terms, tuple(reports)


ROUNDS = 3


TWISTED = ("online_sum", "welford_m2", "softmax_wsum")


def optimize_loops(graph, groups, budget: Budget = Budget(), score=None) -> LoopResult:
    """Saturate, then extract. With `score` (LoopProgram, egraph, terms -> predicted seconds, e.g.
    the analytic model over each kernel's best schedule), the one-pass (twisted) and multi-pass
    forms are both extracted and the cheaper one is kept; without it, the representatives'
    tree cost decides (the one-pass form)."""
    from emmy.egraph.extract import choose_representatives, extract_program, node_weight
    from emmy.egraph.view import EGraphView

    egraph, terms, reports = saturate(graph, groups, budget)
    view = EGraphView.of(egraph)
    extraction = extract_program(view, graph)
    if score is None:
        return LoopResult(extraction.program, reports, extraction.cost, egraph, terms)

    def without_twists(node):
        return node_weight(node) + (1e6 if node.kind in TWISTED else 0.0)

    candidates = [("one-pass folds", extraction)]
    multi = extract_program(view, graph, choose_representatives(view, without_twists))
    if multi.program != extraction.program:
        candidates.append(("multi-pass folds", multi))
    scored, errors = [], []
    for label, found in candidates:
        try:
            scored.append((score(found.program, egraph, terms), label, found))
        except EmmyError as err:  # pins no schedule of this form can take: the other form may
            errors.append(err)
    if not scored:
        raise errors[0]
    scored.sort(key=lambda t: t[0])
    seconds, _, best = scored[0]
    return LoopResult(best.program, reports, best.cost, egraph, terms,
                      tuple((label, s) for s, label, _ in scored))
