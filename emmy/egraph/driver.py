"""Run rulesets in phases, one iteration at a time, under budgets.

egglog has no node or time limit of its own, so each phase runs single
iterations and checks the e-node count and the clock between them. One
back-off scheduler (`BackOff`, egg's BackoffScheduler) lives for the whole
phase: a rule that matches more than its limit in an iteration is not
applied and is banned for a while; each ban doubles both its limit and the
next ban's length, so a rule that matches once per op of a big program
fires after a few bans, while an exploding rule (associativity with
commutativity) keeps being held back. When no rule changes anything but
some are banned, the bans are fast-forwarded rather than the phase ending:
a phase is saturated only when nothing is banned and nothing changed.

egglog's own back-off scheduler lives for one `run` command only, so the
ban state is kept here and each iteration runs the rules that are not
banned, grouped by their current limit, each group under an egglog back-off
of that limit (which refuses the group's rules that match more than it).

A budget that runs out stops the phase and says so in its report; the
reports reach `Program.saturation`, `emmy explain` and `-v` output.
"""

from __future__ import annotations

import itertools
import logging
import time
from dataclasses import dataclass, field

from egglog import EGraph, back_off, ruleset, run, seq

log = logging.getLogger("emmy.egraph")
# Names for the rulesets saturate combines. egglog names an unnamed ruleset `ruleset_<id>`, and
# Python reuses an id once its object is collected: a later phase's ruleset could then take the
# name, and so the rules, of an earlier phase's on the same e-graph.
_RULESET_NUMBERS = itertools.count()


@dataclass(frozen=True)
class Budget:
    """Per saturation phase. `enodes` and `seconds` are for a program of up to SCALE e-nodes and
    grow in proportion beyond it (a model ten times bigger gets ten times the room)."""
    iterations: int = 30
    enodes: int = 20_000  # e-nodes a phase may add to the e-graph it starts from
    seconds: float = 0.5
    match_limit: int = 2_000  # matches per rule per iteration before its first ban
    ban_length: int = 5  # iterations of the first ban (doubling with each ban)

    def scaled(self, program_enodes: int) -> tuple[int, float]:
        """(e-nodes a phase may add, seconds it may take) for a program of this many e-nodes."""
        factor = max(1.0, program_enodes / SCALE)
        return int(self.enodes * factor), self.seconds * factor


SCALE = 10_000  # e-nodes of a program the budgets are stated for
BAN_ITERATIONS_PER_BUDGETED = 4  # the cap on all iterations, per iteration of the budget


@dataclass
class PhaseReport:
    phase: str
    iterations: int = 0
    enodes: int = 0
    seconds: float = 0.0
    saturated: bool = False
    stopped_by: str = ""  # "iterations", "e-nodes" or "seconds" when a budget ran out
    changed: bool = False  # some rewrite changed the e-graph
    matches: dict[str, int] = field(default_factory=dict)  # matches applied, by rule
    bans: dict[str, int] = field(default_factory=dict)  # times each rule was banned

    def render(self) -> str:
        state = "saturated" if self.saturated else f"stopped by its {self.stopped_by} budget"
        head = f"phase {self.phase}: {self.iterations} iterations, {self.enodes} e-nodes, {self.seconds:.3f} s, {state}"
        lines = [head] + [f"  {count:6d}  {rule}" + (f"  (banned {self.bans[rule]}x)" if self.bans.get(rule) else "")
                          for rule, count in sorted(self.matches.items(), key=lambda t: -t[1])
                          if count or self.bans.get(rule)]
        return "\n".join(lines)

    def warning(self) -> str:
        """One line when a budget ran out, else ""."""
        if self.saturated:
            return ""
        return (f"saturation phase {self.phase} stopped by its {self.stopped_by} budget after {self.iterations} "
                f"iterations ({self.enodes} e-nodes, {self.seconds:.2f} s): extraction used the e-graph as it was")


@dataclass
class _RuleState:
    banned_until: int = 0
    times_banned: int = 0


class BackOff:
    """egg's back-off scheduler, kept across the iterations of one phase."""

    def __init__(self, match_limit: int, ban_length: int):
        self.match_limit = match_limit
        self.ban_length = ban_length
        self.rules: dict[str, _RuleState] = {}

    def limit(self, rule) -> int:
        return self.match_limit << self.state(rule).times_banned

    def state(self, rule) -> _RuleState:
        return self.rules.setdefault(rule, _RuleState())

    def allowed(self, rule, iteration: int) -> bool:
        return self.state(rule).banned_until <= iteration

    def observe(self, rule, matches: int, iteration: int) -> bool:
        """Record a rule's matches in an iteration; False when they exceeded its limit (then egglog
        did not apply them, and the rule is banned)."""
        state = self.state(rule)
        if matches <= self.limit(rule):
            return True
        state.banned_until = iteration + (self.ban_length << state.times_banned)
        state.times_banned += 1
        return False

    def fast_forward(self, iteration: int) -> bool:
        """With nothing else to do, bring the earliest ban's end to now (egg's can_stop); False when
        nothing is banned (the phase is saturated)."""
        banned = [s for s in self.rules.values() if s.banned_until > iteration]
        if not banned:
            return False
        step = min(s.banned_until - iteration for s in banned)
        for s in banned:
            s.banned_until -= step
        return True


def enode_count(egraph: EGraph) -> int:
    return sum(size for _, size in egraph.all_function_sizes())


def run_phase(egraph: EGraph, name: str, units, budget: Budget, program_enodes: int = 0) -> PhaseReport:
    """`units`: (rule label, egglog rewrite, its declarations) for every rewrite of
    the phase (RuleGroup.units); the back-off bans each rewrite on its own, the report counts by
    label. `program_enodes`: the encoded program's size, which scales the budget (default: the
    e-graph's size now)."""
    report = PhaseReport(name)
    start = time.perf_counter()
    scheduler = BackOff(budget.match_limit, budget.ban_length)
    unit_of = {decl: index for index, (_, _, decls) in enumerate(units) for decl in decls}
    start_enodes = enode_count(egraph)
    report.enodes = start_enodes
    enode_budget, second_budget = budget.scaled(program_enodes or start_enodes)
    combined_cache: dict = {}
    # The iterations budget counts iterations that changed the e-graph: one in which every matching
    # rule was over its limit (banned, then fast-forwarded) rewrote nothing, and how many of those a
    # big program needs depends on the order bans fall in. A hard cap still bounds them.
    productive = 0
    for iteration in range(budget.iterations * BAN_ITERATIONS_PER_BUDGETED):
        if productive >= budget.iterations:
            report.stopped_by = "iterations"
            break
        groups: dict[int, list[int]] = {}
        for index in range(len(units)):
            if scheduler.allowed(index, iteration):
                groups.setdefault(scheduler.limit(index), []).append(index)
        matches: dict[int, int] = {}
        updated = False
        if groups:
            runs = []
            for limit, members in sorted(groups.items()):
                key = tuple(members)
                if key not in combined_cache:  # one ruleset of the rewrites (a union of rulesets nests)
                    combined_cache[key] = ruleset(*(units[index][1] for index in members),
                                                  name=f"emmy.saturate.{next(_RULESET_NUMBERS)}")
                runs.append(run(combined_cache[key], scheduler=back_off(match_limit=limit,
                                                                         ban_length=budget.ban_length)))
            result = egraph.run(seq(*runs) if len(runs) > 1 else runs[0])
            updated = result.updated
            report.changed = report.changed or updated
            for step in result.iterations:
                for decl, reports in step.rule_set_report.rule_reports.items():
                    if decl in unit_of:
                        index = unit_of[decl]
                        matches[index] = matches.get(index, 0) + sum(r.num_matches for r in reports)
        for index, count in matches.items():
            label = units[index][0]
            if scheduler.observe(index, count, iteration):
                report.matches[label] = report.matches.get(label, 0) + count
            else:
                report.bans[label] = report.bans.get(label, 0) + 1
        report.iterations += 1
        productive += bool(updated)
        report.enodes = enode_count(egraph)
        report.seconds = time.perf_counter() - start
        if not updated and not scheduler.fast_forward(iteration + 1):
            report.saturated = True
            break
        if report.enodes - start_enodes > enode_budget:
            report.stopped_by = "e-nodes"
            break
        if report.seconds > second_budget:
            report.stopped_by = "seconds"
            break
    else:
        report.stopped_by = "iterations"
    if report.stopped_by:
        log.warning("%s", report.warning())
    return report
