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
BUILTIN_MODULES = ("emmy.rules.algebra", "emmy.rules.fusion", "emmy.rules.twist")


@dataclass(frozen=True)
class Rule:
    name: str
    description: str
    ruleset: Ruleset  # this rule alone, so a soundness check can run it by itself
    group: str


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

    def rule(self, name: str, description: str, *rewrites) -> None:
        """Add one named rule (one or more egglog rewrites that state the same fact)."""
        label = f"{self.name}.{name}"
        alone = ruleset(*rewrites, name=f"emmy.{self.name}.{name}")
        for index, rewrite in enumerate(rewrites):
            self.ruleset.append(rewrite)
            decls = ruleset(rewrite, name=f"emmy.{self.name}.{name}.{index}").__egg_ruleset__.rules
            self.units.append((label, rewrite, tuple(decls)))
        for decl in alone.__egg_ruleset__.rules:
            self.labels[decl] = label
        self.rules.append(Rule(name, description, alone, self.name))


def builtin_groups() -> list[RuleGroup]:
    groups: list[RuleGroup] = []
    for module in BUILTIN_MODULES:
        groups.extend(importlib.import_module(module).RULESETS)
    return groups


def load_rules_file(path: str) -> list[RuleGroup]:
    """A user's rules module: a Python file defining RULESETS."""
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
    if not isinstance(groups, list) or not all(isinstance(g, RuleGroup) for g in groups):
        raise EmmyError(f"--rules {path}: the module must define RULESETS, a list of emmy.rules.RuleGroup")
    return groups
