"""The e-graph bridge: the only package that knows egglog.

`optimize_loops` loads Tensor IR as terms, runs the rule phases under
budgets, and extracts a Loop IR program.
"""

from __future__ import annotations

from dataclasses import dataclass

from emmy.egraph.driver import Budget, PhaseReport


@dataclass(frozen=True)
class ProgramForm:
    """One whole-program extraction weighed: which folds and boundaries, and its price."""
    label: str  # e.g. "one-pass folds, rms_norm_sum materialized"
    seconds: float  # predicted (or measured) total over its kernels
    program: object  # emmy.loop_ir.nodes.LoopProgram


@dataclass(frozen=True)
class LoopResult:
    program: object  # emmy.loop_ir.nodes.LoopProgram
    reports: tuple[PhaseReport, ...]
    predicted_seconds: float
    egraph: object = None  # the saturated e-graph: schedules attach rows to kernels' e-classes in it
    terms: dict | None = None  # Tensor IR value name -> its Term in `egraph`
    # The program forms weighed against each other, cheapest (the chosen one) first.
    alternatives: tuple[ProgramForm, ...] = ()

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
    """Saturate, then extract. Without `score` the representatives' tree cost and the loop cost's
    greedy boundaries decide (the one-pass form). With `score` (LoopPrograms -> predicted seconds
    each, None where no schedule fits, e.g. the analytic model over each kernel's best row), the
    programs weighed are the one-pass and the multi-pass (untwisted) forms and, for each, every
    program one reduction boundary away from it; the cheapest is kept."""
    from emmy.egraph.extract import boundary_neighbours, choose_representatives, extract_program, node_weight
    from emmy.egraph.view import EGraphView

    egraph, terms, reports = saturate(graph, groups, budget)
    view = EGraphView.of(egraph)
    extraction = extract_program(view, graph)
    if score is None:
        return LoopResult(extraction.program, reports, extraction.cost, egraph, terms)

    def without_twists(node):
        return node_weight(node) + (1e6 if node.kind in TWISTED else 0.0)

    candidates: list[tuple[str, object]] = []
    for form, choice in (("one-pass folds", choose_representatives(view)),
                         ("multi-pass folds", choose_representatives(view, without_twists))):
        found = extraction if not candidates else extract_program(view, graph, choice)
        candidates.append((form, found))
        for name, added, neighbour in boundary_neighbours(view, graph, choice, found):
            candidates.append((f"{form}, {name} {'materialized' if added else 'fused'}", neighbour))
    unique, seen = [], set()
    for label, found in candidates:
        if found.program not in seen:
            seen.add(found.program)
            unique.append((label, found))
    predicted = score([found.program for _, found in unique])
    scored = sorted(((s, i) for i, s in enumerate(predicted) if s is not None))
    if not scored:  # pins no form can take: the Tile IR stage says which kernel and why
        return LoopResult(extraction.program, reports, extraction.cost, egraph, terms)
    best = unique[scored[0][1]][1]
    return LoopResult(best.program, reports, best.cost, egraph, terms,
                      tuple(ProgramForm(unique[i][0], s, unique[i][1].program) for s, i in scored))
