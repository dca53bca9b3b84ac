"""Rules: soundness of every built-in rule, budgets, and rules users write."""

import textwrap

import pytest
from egglog import String, rewrite, vars_
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import emmy
from emmy.egraph.driver import Budget
from emmy.egraph.terms import Term
from emmy.rules import RuleGroup, builtin_groups
from emmy.testing import check_ruleset
from tests.conftest import run_emmy


@pytest.mark.parametrize("group", builtin_groups(), ids=lambda g: g.name)
def test_every_builtin_rule_fires_and_is_sound(group):
    result = check_ruleset(group, variants=3)
    assert not result.failures, result.failures
    assert not result.never_fired, f"rules that never fired on the corpus: {result.never_fired}"
    assert not result.never_instantiated, f"rules whose two sides were never evaluated: {result.never_instantiated}"
    assert result.checked > 0


def test_check_ruleset_catches_an_unsound_rule():
    x, y = vars_("x y", Term)
    (d,) = vars_("d", String)
    bad = RuleGroup("bad", "algebra", "subtraction commutes (it does not)")
    bad.rule("commute_subtract", "x - y -> y - x", rewrite(Term.binary("subtract", d, x, y)).to(Term.binary("subtract", d, y, x)))
    result = check_ruleset(bad, variants=4)
    assert result.fired["commute_subtract"] > 0
    assert result.failures and "bad.commute_subtract" in result.failures[0]
    assert not result.ok


def test_exploding_ruleset_stops_at_its_budget_with_a_correct_result(caplog):
    x, y, z = vars_("x y z", Term)
    (d,) = vars_("d", String)
    ac = RuleGroup("ac", "algebra", "associativity and commutativity, saturated: explodes")
    ac.rule("assoc", "(x+y)+z -> x+(y+z)", rewrite(Term.binary("add", d, Term.binary("add", d, x, y), z)).to(
        Term.binary("add", d, x, Term.binary("add", d, y, z))))
    ac.rule("comm", "x+y -> y+x", rewrite(Term.binary("add", d, x, y)).to(Term.binary("add", d, y, x)))
    terms = " + ".join(f"x[{i}]" for i in range(20))
    program = emmy.optimize(f"x=torch.randn(20,4); {terms}", rules=(ac,),
                            budget=Budget(iterations=50, enodes=5_000, seconds=2.0))
    with caplog.at_level("WARNING", logger="emmy.egraph"):
        reports = program.loop_result.reports
    stopped = [r for r in reports if r.stopped_by]
    assert stopped and not stopped[0].saturated
    assert sum(r.seconds for r in reports) < 30
    assert any("budget" in m for m in caplog.messages)
    (loop_out,), (tensor_out,) = program.interpret(stage="loop"), program.interpret()
    assert (loop_out - tensor_out).abs().max() < 1e-4


USER_RULES = textwrap.dedent('''
    from egglog import String, f64, rewrite, vars_
    from emmy.egraph.terms import Term
    from emmy.rules import RuleGroup

    x, = vars_("x", Term)
    d, = vars_("d", String)
    squares = RuleGroup("squares", "algebra", "x ** 2 as a multiply")
    squares.rule("square", "power(x, 2) -> x * x",
                 rewrite(Term.binary("power", d, x, Term.literal(2.0, d))).to(Term.binary("multiply", d, x, x)))
    RULESETS = [squares]
''')


def test_user_rules_file_changes_the_output(tmp_path):
    path = tmp_path / "squares.py"
    path.write_text(USER_RULES)
    code = "x=torch.randn(16); x.pow(2)"
    plain = run_emmy("compile", "-c", code, "--ir", "loop")
    ruled = run_emmy("compile", "-c", code, "--ir", "loop", "--rules", str(path))
    assert plain.returncode == 0 and ruled.returncode == 0, ruled.stderr
    assert "power(in0, 2.0)" in plain.stdout
    assert "multiply(in0, in0)" in ruled.stdout and "power" not in ruled.stdout
    listed = run_emmy("rules", "--rules", str(path))
    assert "squares  (phase algebra): x ** 2 as a multiply" in listed.stdout
    assert "square  exact  power(x, 2) -> x * x" in listed.stdout


def test_rules_listing_and_bad_rule_files(tmp_path):
    listed = run_emmy("rules")
    assert listed.returncode == 0
    for group in builtin_groups():
        for rule in group.rules:
            assert rule.name in listed.stdout
    missing = run_emmy("compile", "-c", "x=torch.randn(2); x", "--rules", str(tmp_path / "nope.py"))
    assert missing.returncode == 2 and "no such file" in missing.stderr
    empty = tmp_path / "empty.py"
    empty.write_text("x = 1\n")
    bad = run_emmy("rules", "--rules", str(empty))
    assert bad.returncode == 2 and "must define RULESETS" in bad.stderr


_UNARY = ["exp", "tanh", "sigmoid", "abs", "neg"]
_BINARY = ["+", "-", "*", "/"]


@st.composite
def programs(draw):
    rows, cols = draw(st.integers(1, 4)), draw(st.integers(2, 6))
    exprs = ["x", "y", "w"]
    for _ in range(draw(st.integers(2, 6))):
        kind = draw(st.sampled_from(["unary", "binary", "reduce", "scale"]))
        a = draw(st.sampled_from(exprs))
        if kind == "unary":
            fn = draw(st.sampled_from(_UNARY))
            exprs.append(f"(-{a})" if fn == "neg" else f"torch.{fn}({a})")
        elif kind == "binary":
            b = draw(st.sampled_from(exprs))
            op = draw(st.sampled_from(_BINARY))
            exprs.append(f"({a} {op} (({b}).abs() + 1))" if op == "/" else f"({a} {op} {b})")
        elif kind == "reduce":
            fn = draw(st.sampled_from(["sum", "amax", "mean"]))
            exprs.append(f"{a}.{fn}(-1, keepdim=True)")
        else:
            exprs.append(f"({a} * {draw(st.sampled_from(['2.0', '0.5', '1.0']))})")
    return f"x=torch.randn({rows},{cols}); y=torch.randn({rows},{cols}); w=torch.randn({cols}); {exprs[-1]} + x"


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(code=programs(), seed=st.integers(0, 1000))
def test_random_programs_every_extracted_variant_is_correct(code, seed):
    from emmy.egraph import saturate
    from emmy.egraph.extract import optional_classes, program_with
    from emmy.egraph.representatives import choose_representatives, random_weights
    from emmy.egraph.view import EGraphView
    from emmy.loop_ir.interpreter import run_program
    from emmy.tensor_ir.interpreter import evaluate
    from emmy.checking import compare
    import numpy as np

    program = emmy.optimize(code)
    graph = program.tensor_ir
    rng = np.random.default_rng(seed)
    inputs = {n.name: rng.standard_normal(n.type.shape).astype(np.float32) for n in graph.inputs}
    expected = evaluate(graph, inputs)
    egraph, _, _ = saturate(graph, builtin_groups(), Budget())
    view = EGraphView.of(egraph)
    for k in range(4):
        choice = choose_representatives(view, random_weights(seed + k)) if k else choose_representatives(view)
        optional = optional_classes(view, graph, choice)
        boundaries = {c for i, c in enumerate(optional) if (seed + i + k) % 3 == 0}
        actual = run_program(program_with(view, graph, choice, boundaries), inputs)
        for a, e in zip(actual, expected):
            assert compare(a, e, graph[graph.outputs[0]].type.dtype).ok, (code, k)
