"""Helpers for people who write rules: check a ruleset for soundness.

`check_ruleset(group)` checks every rule two ways.

- Its two sides, directly: each rewrite's left side is instantiated (with
  bindings synthesized from its variables' roles, and with the matches it has
  in the corpus's e-graphs), every Term variable filled with values of its
  dtype, f32, f16 and bf16, that include 0, -0.0, +-inf, NaN, subnormals and
  the largest magnitudes; both sides are evaluated (emmy.egraph.patterns).
  An exact rule must give the same bits (any NaN for NaN); an approximate one
  may stray from the exactly computed left side by at most its `ulps` beyond
  the left side's own rounding error, and never where the left side is NaN
  or infinite. A right side the extractor never picks is checked all the same.
- End to end: each rule runs alone on a corpus of programs; several
  different terms are extracted from the e-graph (random extraction weights,
  so terms the rule added get chosen, not only the cheapest), lowered to Loop
  IR and run, and compared with the Tensor IR interpreter.

A rule that never fires on the corpus, or that no binding could instantiate,
is reported too: a check that exercised nothing proves nothing.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from emmy.checking import compare
from emmy.dtypes import DType, to_storage
from emmy.egraph.patterns import Unfit, Value, evaluate, holds, matches, pattern_variables, synthesized

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
    # folds chained over adjacent axes (keepdim=False drops an axis between them; a transpose before)
    "x=torch.randn(2,3,4,5); x.sum(-1).sum(-1).sum(-1) + x.amax(1).amax(1).amin(-1) "
    "+ x.transpose(1, 3).prod(1).prod(1).sum(-1) + x.amin(-1).amin(-1).amax(-1)",
    # variance far from zero: where a one-pass E[x^2] - E[x]^2 would cancel catastrophically
    "x=torch.randn(3,16); y=x * 100 + 1000; F.layer_norm(y, (16,)) + y.var(-1, keepdim=True)",
)


@dataclass
class RulesetCheck:
    checked: int = 0  # extracted variants compared
    fired: dict[str, int] = field(default_factory=dict)  # rule -> matches over the corpus
    failures: list[str] = field(default_factory=list)
    instantiated: dict[str, int] = field(default_factory=dict)  # rule -> bindings both sides were evaluated on

    @property
    def never_fired(self) -> list[str]:
        return [rule for rule, count in self.fired.items() if not count]

    @property
    def never_instantiated(self) -> list[str]:
        return [rule for rule, count in self.instantiated.items() if not count]

    @property
    def ok(self) -> bool:
        return not self.failures and not self.never_fired and not self.never_instantiated


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
    result = RulesetCheck(fired={r.name: 0 for r in group.rules}, instantiated={r.name: 0 for r in group.rules})
    budget = Budget(iterations=6, enodes=5_000, seconds=2.0)
    views = []
    for index, code in enumerate(corpus):
        program = emmy.optimize(code) if isinstance(code, str) else code
        graph = program.tensor_ir
        inputs = _inputs(graph, seed + index)
        expected = evaluate(graph, inputs, program.weights)
        # The context is saturated once per program; each rule then runs on a copy (push/pop).
        egraph, _, _ = saturate(graph, list(context), budget)
        views.append(EGraphView.of(egraph))
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
    for rule in group.rules:
        count, failures = check_rule_sides(rule, views, seed)
        result.instantiated[rule.name] += count
        result.failures += failures
    return result


DTYPES = ("f32", "f16", "bf16", "f64")
SYNTHESIZED = 48  # bindings a rewrite is tried on from its variables' roles
MATCHED = 16  # bindings taken from each corpus e-graph's matches
DRAWS = 3  # fillings of a binding's Term variables


def check_rule_sides(rule, views=(), seed: int = 0) -> tuple[int, list[str]]:
    """Evaluate each rewrite of `rule` (an emmy.rules.Rule) on both sides; see the module
    docstring. Returns (bindings evaluated, failures): a failure names the rule, the dtype and the
    first element that differs."""
    rng = np.random.default_rng(seed)
    count, failures = 0, []
    for number, rewrite in enumerate(rule.rewrites):
        decl = rewrite.decl
        variables = pattern_variables(decl.lhs)
        jobs = [(binding, None) for binding in synthesized(variables, DTYPES, rng, SYNTHESIZED)]
        for view in views:
            jobs += [(binding, view) for binding in matches(view, decl.lhs, MATCHED)]
        for binding, view in jobs:
            for _ in range(DRAWS):
                env = _filled(binding, variables, view, rng)
                if env is None:
                    break
                try:
                    with np.errstate(all="ignore"):  # NaN and infinities are meant
                        if not holds(decl.conditions, env):
                            break
                        lhs = evaluate(decl.lhs, env)
                        rhs = evaluate(decl.rhs, env)
                        reference = evaluate(decl.lhs, env, exact=True) if not rule.exact else None
                except Unfit:
                    break
                count += 1
                with np.errstate(all="ignore"):  # an exact reference beyond the dtype's range is its infinity
                    why = _differs(rule, lhs, rhs, reference, env, variables)
                if why:
                    where = "a corpus match" if view is not None else "a synthesized binding"
                    failures.append(f"rule {rule.group}.{rule.name} (rewrite {number + 1}) on {where}: {why}")
                    break
            if failures:
                break
    return count, failures


def _filled(binding: dict, variables, view, rng) -> dict | None:
    """`binding` with every Term variable given values: a matched e-class's own type, else the
    rewrite's dtype variable's dtype (bool for a select's condition) and a shape of 24."""
    env = dict(binding)
    dtype = next((binding[n] for n, (sort, role) in variables.items() if role == "dtype" and n in binding), "f32")
    for name, (sort, role) in variables.items():
        if sort != "Term":
            continue
        if view is not None:
            try:
                kind = view.type(binding[name])
            except ValueError:
                return None
            env[name] = Value(leaf_values(kind.dtype, kind.shape, rng), kind.dtype)
        else:
            kind = DType.BOOL if role == "condition" else DType.parse(dtype)
            env[name] = Value(leaf_values(kind, (24,), rng), kind)
    return env


def leaf_values(dtype: DType, shape: tuple[int, ...], rng) -> np.ndarray:
    """Values for a sub-term: about a third special (0, -0.0, +-inf, NaN, the smallest subnormal,
    the smallest normal, the largest finite, +-1), the rest normal draws at magnitudes from 1e-3
    to 1e4; booleans and integers drawn plainly."""
    size = int(np.prod(shape)) if shape else 1
    if dtype is DType.BOOL:
        return rng.random(size).reshape(shape) < 0.5
    if not dtype.is_float:
        return rng.integers(-4, 5, size).astype(dtype.numpy).reshape(shape)
    info = np.finfo({DType.F16: np.float16, DType.F64: np.float64}.get(dtype, np.float32))
    largest = 3.3895314e38 if dtype is DType.BF16 else float(info.max)
    normal = 2.0 ** -126 if dtype is DType.BF16 else float(info.smallest_normal)
    subnormal = {DType.F16: 2.0 ** -24, DType.BF16: 2.0 ** -133}.get(dtype, float(info.smallest_subnormal))
    special = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, subnormal, -subnormal, normal, largest, -largest,
                        1.0, -1.0])
    values = rng.standard_normal(size) * 10.0 ** rng.uniform(-3, 4, size)
    chosen = rng.random(size) < 0.35
    values[chosen] = rng.choice(special, int(chosen.sum()))
    with np.errstate(over="ignore"):  # bf16's largest finite rounds through f32 exactly; nothing overflows
        return to_storage(values.reshape(shape), dtype)


def _differs(rule, lhs, rhs, reference, env, variables) -> str:
    """Why `rhs` is not what `rule` promises given `lhs` (and the exactly computed `reference`), or ""."""
    if not isinstance(lhs, Value) or not isinstance(rhs, Value):
        return "a side is not a tensor"
    try:
        shape = np.broadcast_shapes(lhs.array.shape, rhs.array.shape)
    except ValueError:
        return f"the sides have shapes {lhs.array.shape} and {rhs.array.shape}"
    if shape != lhs.array.shape:
        return f"the right side has shape {rhs.array.shape}, the left {lhs.array.shape}"
    if rhs.dtype != lhs.dtype:
        return f"the right side is {rhs.dtype}, the left {lhs.dtype}"
    left, right = lhs.array, np.broadcast_to(rhs.array, shape)
    dtype = lhs.dtype
    if rule.exact or not dtype.is_float:
        bad = ~_same_bits(left, right, dtype)
    else:
        ref = to_storage(np.asarray(reference.array, np.float64), dtype)
        bad = _ulps_apart(right, ref, dtype) > _ulps_apart(left, ref, dtype) + rule.ulps
    if not bad.any():
        return ""
    at = tuple(int(i) for i in np.argwhere(bad)[0])
    inputs = ", ".join(f"{n}={_show(env[n].array[at] if env[n].array.shape == shape else env[n].array)}"
                       for n, (sort, _) in variables.items() if sort == "Term" and isinstance(env.get(n), Value)
                       and env[n].array.ndim in (0, len(shape)))
    promise = "the same bits" if rule.exact else f"within {rule.ulps:g} ulp beyond the left side's error"
    return (f"{dtype} at {at}: left {_show(left[at])}, right {_show(right[at])} (promised {promise})"
            + (f"; inputs {inputs}" if inputs else ""))


def _show(value) -> str:
    value = np.asarray(value)
    return repr(float(value)) if value.size == 1 and value.dtype.kind == "f" else str(value.tolist())


def _ordered(values: np.ndarray, dtype: DType) -> np.ndarray:
    """Each float as an integer whose order is the numbers' (+0 and -0 both 0; infinities one
    step past the largest finite): differences count units in the last place."""
    if dtype is DType.F16:
        bits = np.asarray(values, np.float16).view(np.int16).astype(np.int64)
        magnitude = bits & 0x7FFF
    elif dtype is DType.F64:
        bits = np.asarray(values, np.float64).view(np.int64)
        magnitude = bits & 0x7FFFFFFFFFFFFFFF
    else:
        bits = np.asarray(values, np.float32).view(np.int32).astype(np.int64)
        magnitude = bits & 0x7FFFFFFF
        if dtype is DType.BF16:
            magnitude = magnitude >> 16
    return np.where(bits < 0, -magnitude, magnitude)


def _ulps_apart(a: np.ndarray, b: np.ndarray, dtype: DType) -> np.ndarray:
    a, b = np.asarray(a), np.asarray(b)
    nan_a, nan_b = np.isnan(a), np.isnan(b)
    distance = np.abs(_ordered(np.where(nan_a, 0, a), dtype) - _ordered(np.where(nan_b, 0, b), dtype))
    return np.where(nan_a & nan_b, 0.0, np.where(nan_a | nan_b, np.inf, distance.astype(np.float64)))


def _same_bits(a: np.ndarray, b: np.ndarray, dtype: DType) -> np.ndarray:
    a, b = np.asarray(a), np.asarray(b)
    if not dtype.is_float:
        return a == b
    nan_a, nan_b = np.isnan(a), np.isnan(b)
    storage, width = {DType.F16: (np.float16, np.int16), DType.F64: (np.float64, np.int64)}.get(dtype,
                                                                                               (np.float32, np.int32))
    same = np.asarray(a, storage).view(width) == np.asarray(b, storage).view(width)
    return np.where(nan_a | nan_b, nan_a & nan_b, same)


def _inputs(graph, seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    from emmy.tensor_ir.nodes import Input

    return {n.name: rng.standard_normal(n.type.shape).astype(np.float32)
            for n in graph.nodes if isinstance(n, Input)}
