"""Helpers for people who write rules: check a ruleset for soundness.

`check_ruleset(group)` runs each rule of the group alone on a corpus of
programs, extracts several different terms from the resulting e-graph (with
random extraction weights, so terms the rule added get chosen, not only the
cheapest), lowers each to Loop IR and runs it, and compares the results with
the Tensor IR interpreter on the original program. A rule that never fires
on the corpus is reported too: a check that exercised nothing proves nothing.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from emmy.checking import compare

# Small programs on which the built-in rules fire; user rules may bring their own.
DEFAULT_CORPUS = (
    "x=torch.randn(3,5); y=torch.randn(3,5); (x + y) * (x * 1.0) - x / 4.0 + (y + 0.0)",
    "x=torch.randn(4,6); w=torch.randn(6); (torch.maximum(x, w) + torch.minimum(w, x)) / 1.0 - 0.0",
    "x=torch.randn(2,3,4); x.permute(2,0,1).transpose(0,1).reshape(3,8).t().sum(0) "
    "+ (torch.scalar_tensor(2.0) * 3.0 - torch.scalar_tensor(1.0) + torch.scalar_tensor(0.5))",
    "x=torch.randn(2,8); F.rms_norm(x, (8,)) + torch.softmax(x, -1)",
    "x=torch.randn(4,6); y=torch.randn(6,5); F.gelu(x @ y) * 0.5 + (1.0 - 0.25)",
    "x=torch.randn(3,4); torch.cat([x, x * 2], 1)[:, 2:6].exp() - x.sum(-1, keepdim=True)",
    # softmax at large magnitudes (the max must be subtracted) and with masked (-inf) entries and rows
    "x=torch.randn(4,16); torch.log_softmax(x * 1000, -1) + torch.softmax(x * 1000, 0)",
    "x=torch.randn(4,8); r=torch.arange(4).unsqueeze(1); m=(torch.randn(4,8) > 0) & (r > 0); "
    "torch.softmax(torch.where(m, x, float('-inf')), -1)",
    "q=torch.randn(1,2,6,4); F.scaled_dot_product_attention(q, q * 2, q, is_causal=True)",
    # attention's weighted sum at large scores, with masked entries and a fully masked row (NaN, as torch)
    "q=torch.randn(1,2,6,4); k=torch.randn(1,2,6,4); v=torch.randn(1,2,6,4); r=torch.arange(6).unsqueeze(1); "
    "m=(torch.randn(6,6) > 0) & (r > 0); "
    "torch.softmax(torch.where(m, q @ k.transpose(-1, -2) * 30, float('-inf')), -1) @ v",
    # half-precision attention written out: the probabilities round to f16 between the two products
    "q=torch.randn(1,2,6,8,dtype=torch.float16); k=torch.randn(1,2,6,8,dtype=torch.float16); "
    "v=torch.randn(1,2,6,8,dtype=torch.float16); torch.softmax(q @ k.transpose(-1, -2) / 8, -1) @ v",
    # variance far from zero: where a one-pass E[x^2] - E[x]^2 would cancel catastrophically
    "x=torch.randn(3,16); y=x * 100 + 1000; F.layer_norm(y, (16,)) + y.var(-1, keepdim=True)",
)


@dataclass
class RulesetCheck:
    checked: int = 0  # extracted variants compared
    fired: dict[str, int] = field(default_factory=dict)  # rule -> matches over the corpus
    failures: list[str] = field(default_factory=list)

    @property
    def never_fired(self) -> list[str]:
        return [rule for rule, count in self.fired.items() if not count]

    @property
    def ok(self) -> bool:
        return not self.failures and not self.never_fired


def check_ruleset(group, corpus=DEFAULT_CORPUS, variants: int = 4, seed: int = 0, context=None) -> RulesetCheck:
    """Check every rule of `group` (an emmy.rules.RuleGroup); see the module docstring.

    `context` groups run first (by default every built-in group), so a rule
    that needs another's work (layout composition needs fusion to remove
    kernel boundaries) gets terms to fire on; then the checked rule runs
    alone, and its matches in that run are what counts as firing.
    """
    import emmy
    from emmy.egraph import saturate
    from emmy.egraph.driver import Budget, run_phase
    from emmy.egraph.extract import program_with
    from emmy.egraph.representatives import choose_representatives, random_weights
    from emmy.egraph.view import EGraphView
    from emmy.loop_ir.interpreter import run_program
    from emmy.rules import builtin_groups
    from emmy.tensor_ir.interpreter import evaluate

    if context is None:
        context = builtin_groups()
    result = RulesetCheck(fired={r.name: 0 for r in group.rules})
    budget = Budget(iterations=6, enodes=5_000, seconds=2.0)
    for index, code in enumerate(corpus):
        program = emmy.optimize(code) if isinstance(code, str) else code
        graph = program.tensor_ir
        inputs = _inputs(graph, seed + index)
        expected = evaluate(graph, inputs, program.weights)
        # The context is saturated once per program; each rule then runs on a copy (push/pop).
        egraph, _, _ = saturate(graph, list(context), budget)
        for rule in group.rules:
            egraph.push()
            label = f"{group.name}.{rule.name}"
            report = run_phase(egraph, "check", [u for u in group.units if u[0] == label], budget)
            result.fired[rule.name] += sum(report.matches.values())
            view = EGraphView.of(egraph)
            egraph.pop()
            for k in range(variants):
                weight = random_weights(seed * 1000 + index * 10 + k) if k else None
                choice = choose_representatives(view, weight) if weight else choose_representatives(view)
                actual = run_program(program_with(view, graph, choice), inputs, program.weights)
                result.checked += 1
                for name, a, e in zip(graph.outputs, actual, expected):
                    cmp = compare(a, e, graph[name].type.dtype)
                    if not cmp.ok:
                        result.failures.append(
                            f"rule {group.name}.{rule.name} on program {index}: output {name} differs "
                            f"(max abs {cmp.max_abs:.3g}) in extracted variant {k}")
    return result


def _inputs(graph, seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    from emmy.tensor_ir.nodes import Input

    return {n.name: rng.standard_normal(n.type.shape).astype(np.float32)
            for n in graph.nodes if isinstance(n, Input)}
