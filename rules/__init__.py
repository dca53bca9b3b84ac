"""emmy.rules: the e-graph rulesets (installed as emmy.rules).

A rules module exports `RULESETS`, a list of RuleGroup. Each group belongs to
a phase (the saturation driver runs phases in PHASES order) and holds named
rules with one-line descriptions; `emmy rules` lists them, and
`emmy compile --rules FILE` loads a user's module the same way.
"""

from __future__ import annotations

import importlib
import importlib.util
from dataclasses import dataclass, field
from pathlib import Path

from egglog import Ruleset, ruleset

from emmy.errors import EmmyError

PHASES = ("algebra", "fusion", "twist")
BUILTIN_MODULES = ("emmy.rules.algebra", "emmy.rules.reductions", "emmy.rules.fusion", "emmy.rules.twist")


@dataclass(frozen=True)
class Rule:
    """A named rule. `exact`: both sides give the same bits on every input (NaN for NaN) in the
    dtype they compute in; otherwise `bound` says what may differ and `ulps` how far the right side
    may stray beyond the left side's own rounding error (emmy.testing.check_ruleset checks it)."""
    name: str
    description: str
    ruleset: Ruleset  # this rule alone, so a soundness check can run it by itself
    group: str
    rewrites: tuple = ()  # the egglog rewrites, one or more
    bound: str = ""  # "" for an exact rule; else what the right side may change
    ulps: float = 0.0

    @property
    def exact(self) -> bool:
        return not self.bound

    @property
    def mark(self) -> str:
        """How `emmy rules` labels the rule."""
        return "exact" if self.exact else f"approximate ({self.bound})"


@dataclass
class RuleGroup:
    name: str
    phase: str
    description: str
    rules: list[Rule] = field(default_factory=list)

    def __post_init__(self):
        if self.phase not in PHASES:
            raise EmmyError(f"ruleset {self.name!r}: unknown phase {self.phase!r}; phases are {', '.join(PHASES)}")
        self.ruleset = ruleset(name=f"emmy.{self.name}")
        self.labels: dict = {}  # egglog rule declaration -> "group.rule", for reports
        # One entry per egglog rewrite: ("group.rule", the rewrite, its declarations). The
        # saturation driver's back-off bans rewrites one by one, as egg's does.
        self.units: list[tuple[str, object, tuple]] = []

    def rule(self, name: str, description: str, *rewrites, approximate: str = "", ulps: float = 0.0) -> None:
        """Add one named rule (one or more egglog rewrites that state the same fact). A rule is exact
        unless `approximate` says what its right side may change (one more rounding, the sign of a
        zero, a reassociated sum); `ulps` then bounds the extra error, in units in the last place of
        the dtype, beyond the left side's own."""
        if ulps and not approximate:
            raise EmmyError(f"rule {self.name}.{name}: ulps={ulps} given for an exact rule; say what it "
                            f"approximates with approximate=...")
        label = f"{self.name}.{name}"
        alone = ruleset(*rewrites, name=f"emmy.{self.name}.{name}")
        for index, rewrite in enumerate(rewrites):
            self.ruleset.append(rewrite)
            decls = ruleset(rewrite, name=f"emmy.{self.name}.{name}.{index}").__egg_ruleset__.rules
            self.units.append((label, rewrite, tuple(decls)))
        for decl in alone.__egg_ruleset__.rules:
            self.labels[decl] = label
        self.rules.append(Rule(name, description, alone, self.name, tuple(rewrites), approximate, ulps))

    def exact_only(self) -> "RuleGroup":
        """This group with its approximate rules left out (`--exact`)."""
        group = RuleGroup(self.name, self.phase, self.description)
        for rule in self.rules:
            if rule.exact:
                group.rule(rule.name, rule.description, *rule.rewrites)
        return group


@dataclass(frozen=True, eq=False)
class ScheduleRuleGroup:
    """Schedule rules a user adds: an egglog ruleset of `rule(...).then(legal_row(...))` over the
    relations of emmy.rules.schedules (docs/rules.md). They run beside the built-in schedule rules,
    so they can offer more rows; every row still has to pass the lowering's own checks."""
    name: str
    description: str
    ruleset: Ruleset


def builtin_groups() -> list[RuleGroup]:
    groups: list[RuleGroup] = []
    for module in BUILTIN_MODULES:
        groups.extend(importlib.import_module(module).RULESETS)
    return groups


def load_rules_file(path: str) -> list:
    """A user's rules module: a Python file defining RULESETS, a list of RuleGroup (rewrites) and
    ScheduleRuleGroup (schedule rules)."""
    file = Path(path)
    if not file.is_file():
        raise EmmyError(f"--rules {path}: no such file")
    spec = importlib.util.spec_from_file_location(f"emmy_user_rules_{abs(hash(file.resolve()))}", file)
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except EmmyError:
        raise
    except Exception as err:
        raise EmmyError(f"--rules {path}: the module failed to load: {type(err).__name__}: {err}") from err
    groups = getattr(module, "RULESETS", None)
    if not isinstance(groups, list) or not all(isinstance(g, (RuleGroup, ScheduleRuleGroup)) for g in groups):
        raise EmmyError(f"--rules {path}: the module must define RULESETS, a list of emmy.rules.RuleGroup "
                        f"or emmy.rules.ScheduleRuleGroup")
    return groups
