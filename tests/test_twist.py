"""The online-softmax twist: the normaliser folds into one pass, beside the multi-pass form."""

import numpy as np
import pytest
import torch

import emmy
from emmy.loop_ir.nodes import Accumulate, Loop, Update

SPELLINGS = {
    "softmax": "x=torch.randn(4,64); torch.softmax(x, -1)",
    "log_softmax": "x=torch.randn(4,64); torch.log_softmax(x, -1)",
    "by_hand": "x=torch.randn(4,64); e=torch.exp(x - x.amax(-1, keepdim=True)); e / e.sum(-1, keepdim=True)",
    "sdpa_causal": "q=torch.randn(1,2,16,8); F.scaled_dot_product_attention(q, q * 0.5, q, is_causal=True)",
    "attention_by_hand": "q=torch.randn(1,2,16,8); k=torch.randn(1,2,16,8); v=torch.randn(1,2,16,8); "
                         "torch.softmax(q @ k.transpose(-1, -2) / 8, -1) @ v",
}


def _loops(body):
    for stmt in body:
        if isinstance(stmt, Loop):
            yield stmt
            yield from _loops(stmt.body)


@pytest.mark.parametrize("name", SPELLINGS)
def test_every_spelling_reaches_the_one_pass_normaliser(name):
    program = emmy.optimize(SPELLINGS[name])
    folds = [l for k in program.loop_ir.kernels for l in _loops(k.body) if any(isinstance(s, Update) for s in l.body)]
    assert folds, program.ir("loop")
    for a, b in zip(program.interpret(stage="loop"), program.interpret()):
        np.testing.assert_allclose(a.float().numpy(), b.float().numpy(), rtol=2e-5, atol=2e-6)


def test_softmax_reads_its_row_twice_not_three_times():
    (kernel,) = emmy.optimize(SPELLINGS["softmax"]).loop_ir.kernels
    row_loops = [l for l in _loops(kernel.body) if l.extent == 64]
    assert len(row_loops) == 2  # the max and the normaliser share a pass; then the sweep
    assert any(isinstance(s, Accumulate) for s in row_loops[0].body)
    assert any(isinstance(s, Update) for s in row_loops[0].body)


def test_masked_rows_and_large_scores_match_torch():
    code = ("x=torch.randn(4,8); r=torch.arange(4).unsqueeze(1); m=(torch.randn(4,8) > 0) & (r > 0); "
            "torch.softmax(torch.where(m, x * 1000, float('-inf')), -1)")
    program = emmy.optimize(code)
    (ours,) = program.interpret(stage="loop")
    x, r, m = program.example_inputs
    theirs = torch.softmax(torch.where((m > 0) & (r.unsqueeze(1) > 0), x * 1000, float("-inf")), -1)
    assert torch.isnan(ours[0]).all() and torch.isnan(theirs[0]).all()  # a fully masked row
    torch.testing.assert_close(ours[1:], theirs[1:])


def test_multi_pass_form_stays_beside_the_fold():
    from emmy.egraph import saturate
    from emmy.egraph.driver import Budget
    from emmy.egraph.view import EGraphView
    from emmy.rules import builtin_groups

    graph = emmy.optimize(SPELLINGS["softmax"]).tensor_ir
    egraph, _, _ = saturate(graph, builtin_groups(), Budget())
    view = EGraphView.of(egraph)
    twisted = [nodes for nodes in view.classes.values() if any(n.kind == "online_sum" for n in nodes)]
    assert twisted
    assert all(any(n.kind == "reduce" for n in nodes) for nodes in twisted)


def test_layernorm_is_one_welford_pass_then_the_sweep():
    code = "x=torch.randn(4,64); w=torch.randn(64); b=torch.randn(64); F.layer_norm(x * 100 + 1000, (64,), w, b)"
    program = emmy.optimize(code)
    (kernel,) = program.loop_ir.kernels
    row_loops = [l for l in _loops(kernel.body) if l.extent == 64]
    assert len(row_loops) == 2
    assert sum(isinstance(s, Update) for s in row_loops[0].body) == 3  # n, mean, m2
    (ours,), (reference,) = program.interpret(stage="loop"), program.interpret()
    torch.testing.assert_close(ours, reference, rtol=1e-4, atol=1e-4)
