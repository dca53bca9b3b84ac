"""The online-softmax twist: the normaliser folds into one pass, beside the multi-pass form."""

import dataclasses

import numpy as np
import pytest
import torch

import emmy
from emmy.loop_ir.nodes import Accumulate, Loop, Update
from emmy.runtime import check_program
from emmy.schedule.shape import kernel_shape

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


def _run_loop_program(loop_program, program) -> list:
    from emmy.loop_ir.interpreter import run_program

    inputs = {node.name: t.numpy() for node, t in zip(program.tensor_ir.inputs, program.example_inputs)}
    return run_program(loop_program, inputs, program.weights)


# The one-pass forms are checked as the e-graph's one-pass representatives spell them: extraction
# takes them where they save a pass over memory, and the multi-pass form where a row held in
# registers makes its second pass free (tests/test_softmax_lean.py).
@pytest.mark.parametrize("name", SPELLINGS)
def test_every_spelling_reaches_the_one_pass_normaliser(name):
    program = emmy.optimize(SPELLINGS[name])
    one_pass = _one_pass_fully_fused(program)
    folds = [l for k in one_pass.kernels for l in _loops(k.body) if any(isinstance(s, Update) for s in l.body)]
    assert folds, program.ir("tensor")
    for a, b in zip(_run_loop_program(one_pass, program), program.interpret()):
        np.testing.assert_allclose(np.asarray(a, np.float32), b.float().numpy(), rtol=2e-5, atol=2e-6)


def test_softmax_reads_its_row_twice_not_three_times():
    (kernel,) = _one_pass_fully_fused(emmy.optimize(SPELLINGS["softmax"])).kernels
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


@pytest.mark.parametrize("n", [64, 56])  # the mean a sum times 1/64, or divided by 56 (1/56 is not exact)
def test_layernorm_is_one_welford_pass_then_the_sweep(n):
    code = f"x=torch.randn(4,{n}); w=torch.randn({n}); b=torch.randn({n}); F.layer_norm(x * 100 + 1000, ({n},), w, b)"
    program = emmy.optimize(code)
    one_pass = _one_pass_fully_fused(program)
    (kernel,) = one_pass.kernels
    row_loops = [l for l in _loops(kernel.body) if l.extent == n]
    assert len(row_loops) == 2
    assert sum(isinstance(s, Update) for s in row_loops[0].body) == 3  # n, mean, m2
    (ours,), (reference,) = _run_loop_program(one_pass, program), program.interpret()
    torch.testing.assert_close(torch.from_numpy(np.asarray(ours)), reference, rtol=1e-4, atol=1e-4)


ATTENTION = {
    "sdpa": "q=torch.randn(1,2,16,8); k=torch.randn(1,2,16,8); v=torch.randn(1,2,16,8); "
            "F.scaled_dot_product_attention(q, k, v)",
    "sdpa_scale_causal": "q=torch.randn(1,2,16,8); k=torch.randn(1,2,16,8); v=torch.randn(1,2,16,8); "
                         "F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=0.3)",
    "sdpa_grouped_heads": "q=torch.randn(1,4,16,8); k=torch.randn(1,2,16,8); v=torch.randn(1,2,16,8); "
                          "F.scaled_dot_product_attention(q, k, v, enable_gqa=True)",
    "by_hand": SPELLINGS["attention_by_hand"],
    "large_scores_masked_rows": "q=torch.randn(1,2,6,4); k=torch.randn(1,2,6,4); v=torch.randn(1,2,6,4); "
                                "r=torch.arange(6).unsqueeze(1); m=(torch.randn(6,6) > 0) & (r > 0); "
                                "torch.softmax(torch.where(m, q @ k.transpose(-1, -2) * 30, float('-inf')), -1) @ v",
}


def _one_pass_fully_fused(program):
    """The program as the one-pass representatives spell it with every optional kernel fused."""
    from emmy.egraph import saturate
    from emmy.egraph.driver import Budget
    from emmy.egraph.extract import program_with
    from emmy.egraph.representatives import choose_representatives
    from emmy.egraph.view import EGraphView
    from emmy.rules import builtin_groups

    egraph, _, _ = saturate(program.tensor_ir, builtin_groups(), Budget())
    view = EGraphView.of(egraph)
    return program_with(view, program.tensor_ir, choose_representatives(view))


@pytest.mark.parametrize("name", ATTENTION)
def test_attention_is_one_kernel_with_state_m_d_z(name):
    """The e-graph holds attention as one kernel with the online softmax's (m, d, z) state; the
    program extraction chooses by cost computes the same values."""
    from emmy.schedule.shape import kernel_shape

    program = emmy.optimize(ATTENTION[name])
    fused = _one_pass_fully_fused(program)
    (kernel,) = fused.kernels
    (fold,) = [l for l in _loops(kernel.body) if any(isinstance(s, Update) for s in l.body)]
    assert sum(isinstance(s, Update) for s in fold.body) == 3  # m, d, z
    assert any(isinstance(s, Loop) and s.reduction for s in fold.body)  # q.k inside the element
    assert kernel_shape(kernel).kind == "attention"
    (reference,) = program.interpret()
    for ours in (torch.from_numpy(_run_loop_program(fused, program)[0]), program.interpret(stage="loop")[0]):
        assert torch.equal(torch.isnan(ours), torch.isnan(reference))
        torch.testing.assert_close(ours, reference, rtol=1e-4, atol=1e-5, equal_nan=True)


def test_masked_attention_rows_are_nan_like_torch():
    program = emmy.optimize(ATTENTION["large_scores_masked_rows"])
    (ours,) = program.interpret(stage="loop")
    q, k, v, r, m = program.example_inputs
    mask = (m > 0) & (r.unsqueeze(1) > 0)
    theirs = torch.softmax(torch.where(mask, q @ k.transpose(-1, -2) * 30, float("-inf")), -1) @ v
    assert torch.isnan(ours[0, :, 0]).all() and torch.isnan(theirs[0, :, 0]).all()
    torch.testing.assert_close(ours[0, :, 1:], theirs[0, :, 1:], rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("code", [
    "q=torch.randn(1,8,1024,64,dtype=torch.float16); k=torch.randn(1,8,1024,64,dtype=torch.float16); "
    "v=torch.randn(1,8,1024,64,dtype=torch.float16); F.scaled_dot_product_attention(q, k, v)",
    "q=torch.randn(1,8,1024,64,dtype=torch.float16); k=torch.randn(1,8,1024,64,dtype=torch.float16); "
    "v=torch.randn(1,8,1024,64,dtype=torch.float16); F.scaled_dot_product_attention(q, k, v, is_causal=True)",
    "q=torch.randn(1,8,1024,64,dtype=torch.float16); k=torch.randn(1,8,1024,64,dtype=torch.float16); "
    "v=torch.randn(1,8,1024,64,dtype=torch.float16); torch.softmax(q @ k.transpose(-1, -2) / 8, -1) @ v",
], ids=["sdpa", "sdpa_causal", "by_hand"])
def test_full_size_attention_tile_ir_shows_the_twisted_contraction(code):
    lines = emmy.optimize(code, target="sm_90").ir("tile").splitlines()
    assert sum(line.startswith("=== ") for line in lines) == 1
    (fold,) = [i for i, line in enumerate(lines) if line.startswith("Fold[")]
    assert lines[fold].startswith("Fold[a3 in 0..1024] contraction ⟨REDUCE=")
    assert lines[fold].endswith("<twist=softmax>")
    assert lines[fold + 1].startswith("│ init     (m, d, z) = (-inf, 0.0, 0.0)")
    assert "│ output   z / d" in lines
    assert any(line.startswith("flash ") and "(m, d, z) in registers" in line for line in lines)


@pytest.mark.parametrize("code", ["x=torch.randn(8,256,1024); x.var(dim=(1,2))",
                                  "x=torch.randn(8,4,64,256); x.std(dim=(1,2,3), keepdim=True)"])
def test_a_variance_over_adjacent_axes_is_one_welford_pass(code):
    """The centred squares are folded over the merged axis (not reshaped after squaring), so the
    mean and the sum of squares fold in one pass: one kernel reading x once."""
    program = emmy.optimize(code)
    (kernel,) = program.loop_ir.kernels
    assert any(sum(isinstance(s, Update) for s in loop.body) == 3 for loop in _loops(kernel.body))  # n, mean, m2
    small = code.replace("(8,256,1024)", "(3,20,70)").replace("(8,4,64,256)", "(2,3,20,14)")
    small_program = emmy.optimize(small)
    assert all(c.ok for c in check_program(small_program, mode="asan"))
    (ours,), (reference,) = small_program.interpret(stage="loop"), small_program.interpret()
    torch.testing.assert_close(ours, reference, rtol=1e-4, atol=1e-5)


WINDOW_ATTENTION = ("x=torch.randn(1,{n},{n},4); w = x.view(1, 2, {h}, 2, {h}, 4).permute(0, 1, 3, 2, 4, 5)"
                    ".reshape(-1, {t}, 4); a = (w @ w.transpose(1, 2) * 0.5).softmax(-1) @ w; "
                    "a.view(1, 2, 2, {h}, {h}, 4).permute(0, 1, 3, 2, 4, 5).reshape(1, {n}, {n}, 4)")


@pytest.mark.parametrize("half, knobs", [(4, None), (20, "WORK=t128,TILE=f1,REDUCE="),
                                         (4, "WORK=t64,TILE=f1,REDUCE=coop")],
                         ids=["chosen", "chunked-thread-rows", "coop-rows"])
def test_attention_as_a_row_kernel_merges_its_m_d_z_state(half, knobs):
    # Swin-style window attention: its output is read back through the windows' permutation, so
    # it lowers as a row kernel whose fold keeps (m, d, z), not as flash attention. That state
    # had no merge (NotLoweredError "a softmax fold with 3 state values"), so neither a block of
    # threads (coop) nor a thread's chunks over 400 keys could combine it; emmy::merge_softmax_wsum.
    code = WINDOW_ATTENTION.format(n=2 * half, h=half, t=half * half)
    program = emmy.optimize(code, target="sm_90", knobs=knobs)
    if half == 20:
        # at 400 keys the search takes flash attention and a map for the permutation (its move that
        # fuses the scores while cutting the weighted sum out); the row kernel is the alternative
        # it priced, built here as the program
        assert sorted(kernel_shape(k).kind for k in program.loop_ir.kernels) == ["attention", "map"]
        decision = next(d for d in program.loop_result.decisions
                        if d.kind == "boundary" and d.subject == "bmm_1_sum" and d.alternative == "fused")
        assert decision.delta_seconds > 0
        assert all(c.ok for c in check_program(program, mode="asan"))
        fused = dataclasses.replace(program)
        fused.__dict__["loop_result"] = dataclasses.replace(program.loop_result,
                                                            program=program.loop_result.alternative(decision))
        program = fused
    folds = [p for k in program.tile_ir.kernels for p in k.parts if getattr(p, "twist", "") == "softmax"]
    assert folds and all(len(f.init) == 3 for f in folds)
    if knobs:
        assert "emmy::merge_softmax_wsum(" in program.cuda_source
    assert all(c.ok for c in check_program(program, mode="asan"))


def test_sibling_variances_keep_one_twisted_state_per_loop():
    """Three variances of one short row (CoaT's factorised attention has such): each may fold in one
    pass, but a loop keeps one Update-stepped state, the one the lowering merges, so they are
    three loops (a shared loop was a 9-value state no lowering takes, and failed the program)."""
    code = "x=torch.randn(256,8); torch.stack([x.var(-1), (2 * x).var(-1), x.exp().var(-1)])"
    program = emmy.optimize(code)
    for kernel in program.loop_ir.kernels:
        for loop in _loops(kernel.body):
            assert sum(isinstance(s, Update) for s in loop.body) <= 3, "two twisted states in one loop"
    assert all(c.ok for c in check_program(program, mode="asan"))


@pytest.mark.parametrize("code", [
    # T5's relative-position bias: a bias over heads the q.k dot does not read, probabilities out
    "x=torch.randn(2,12,8); bias=torch.randn(4,12,12); ((x @ x.transpose(-1, -2)).unsqueeze(1) + bias).softmax(-1)",
    # the same bias, weighted values shared by the batch: the only variable left for query rows
    # is the batch, which K reads
    "x=torch.randn(2,12,8); bias=torch.randn(4,12,12); v=torch.randn(12,5); "
    "((x @ x.transpose(-1, -2)).unsqueeze(1) + bias).softmax(-1) @ v",
], ids=["probabilities", "batch_as_rows"])
def test_a_softmax_over_a_dot_that_is_not_flash_attention_lowers_as_rows(code):
    # Both were taken for flash attention (the bias's head variable for the value columns): the
    # first kernel dropped its sweep's stores, the second staged K by a variable out of scope.
    from emmy.schedule.shape import kernel_shape

    program = emmy.optimize(code, target="sm_90")
    assert all(kernel_shape(k).kind != "attention" for k in program.loop_ir.kernels)
    assert all(c.ok for c in check_program(program, mode="asan"))


def test_attention_nested_in_a_fold_over_heads_is_a_row_kernel():
    # sdpa(...).mean(1) fused into one kernel folds over the heads around the softmax fold; it was
    # taken for flash attention, whose lowering refuses it (NotLoweredError "flash attention needs
    # one softmax-twisted fold first"), so extraction could only price it as unlowerable
    from emmy.schedule.shape import kernel_shape

    program = emmy.optimize("q=torch.randn(2,3,5,8); k=torch.randn(2,3,7,8); v=torch.randn(2,3,7,4); "
                            "F.scaled_dot_product_attention(q, k, v).mean(1)", target="sm_90")
    (kernel,) = _one_pass_fully_fused(program).kernels
    softmax_folds = [l for l in _loops(kernel.body) if any(isinstance(s, Update) for s in l.body)]
    assert softmax_folds and any(softmax_folds[0] in _loops(l.body) for l in _loops(kernel.body))  # nested
    assert kernel_shape(kernel).kind == "column"
    assert all(c.ok for c in check_program(program, mode="asan"))
