"""Run rulesets in phases, one iteration at a time, under budgets.

egglog has no node or time limit of its own, so each phase runs single
iterations (each rule capped by a back-off match limit, so one iteration
cannot multiply the e-graph without bound) and checks the e-node count and
the clock between them. A budget that runs out stops the phase with a
warning; extraction proceeds from whatever the e-graph holds.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field

from egglog import EGraph, back_off, run

log = logging.getLogger("emmy.egraph")


@dataclass(frozen=True)
class Budget:
    iterations: int = 30
    enodes: int = 20_000
    seconds: float = 0.5
    match_limit: int = 2_000  # matches per rule per iteration


@dataclass
class PhaseReport:
    phase: str
    iterations: int = 0
    enodes: int = 0
    seconds: float = 0.0
    saturated: bool = False
    stopped_by: str = ""  # "iterations", "e-nodes" or "seconds" when a budget ran out
    matches: dict[str, int] = field(default_factory=dict)

    def render(self) -> str:
        state = "saturated" if self.saturated else f"stopped by its {self.stopped_by} budget"
        head = f"phase {self.phase}: {self.iterations} iterations, {self.enodes} e-nodes, {self.seconds:.3f} s, {state}"
        lines = [head] + [f"  {count:6d}  {rule}" for rule, count in sorted(self.matches.items(), key=lambda t: -t[1])
                          if count]
        return "\n".join(lines)


def enode_count(egraph: EGraph) -> int:
    return sum(size for _, size in egraph.all_function_sizes())


def run_phase(egraph: EGraph, name: str, ruleset, budget: Budget, rule_names: dict[str, str]) -> PhaseReport:
    report = PhaseReport(name)
    start = time.perf_counter()
    for _ in range(budget.iterations):
        result = egraph.run(run(ruleset, scheduler=back_off(match_limit=budget.match_limit)))
        report.iterations += 1
        for iteration in result.iterations:
            for rule, reports in iteration.rule_set_report.rule_reports.items():
                label = rule_names.get(rule, rule)
                count = sum(r.num_matches for r in reports)
                report.matches[label] = report.matches.get(label, 0) + count
        report.enodes = enode_count(egraph)
        report.seconds = time.perf_counter() - start
        if not result.updated:
            report.saturated = True
            break
        if report.enodes > budget.enodes:
            report.stopped_by = "e-nodes"
            break
        if report.seconds > budget.seconds:
            report.stopped_by = "seconds"
            break
    else:
        report.stopped_by = "iterations"
    if report.stopped_by:
        log.warning("phase %s stopped by its %s budget after %d iterations (%d e-nodes, %.2f s); "
                    "extracting from what exists", name, report.stopped_by, report.iterations, report.enodes,
                    report.seconds)
    return report
