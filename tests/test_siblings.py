"""Sibling folds share a kernel (emmy.loop_ir.siblings): two folds of the same rows that load an
element in common run as one kernel with both outputs, reading the rows once."""

import dataclasses

import pytest
import torch

import emmy
from emmy.schedule.loop_cost import buffer_sizes, kernel_cost
from emmy.loop_ir.nodes import Assign, Load, Loop, LoopProgram
from emmy.loop_ir.siblings import merge_sibling_folds
from emmy.runtime import check_program


def _fold_loads(kernel) -> list:
    stack, found = list(kernel.body), []
    while stack:
        s = stack.pop()
        if isinstance(s, Loop):
            stack += list(s.body) if not s.reduction else []
            if s.reduction:
                found += [t for t in s.body if isinstance(t, Assign) and isinstance(t.expr, Load)]
    return found


@pytest.mark.parametrize("code", ["x=torch.randn(3,9000); torch.var_mean(x, dim=1)",
                                  "x=torch.randn(6,500); (x.sum(1), (x * x).sum(1))",
                                  "x=torch.randn(6,500); (x.amax(1), x.amin(1), x.mean(1))"])
def test_sibling_folds_read_their_rows_once_in_one_kernel(code):
    program = emmy.optimize(code, target="sm_90")
    outputs = len(program.loop_ir.outputs)
    merged = [k for k in program.loop_ir.kernels if k.more_outputs]
    assert merged, program.ir("loop")
    (kernel,) = merged[:1]
    loads = _fold_loads(kernel)
    assert len(loads) == len({(s.expr.buffer, s.expr.index) for s in loads})  # a shared load is made once
    sizes = buffer_sizes(program.loop_ir)
    assert kernel_cost(kernel, sizes).bytes_read == sizes["x"][0] * sizes["x"][1]  # x read once
    assert len(program.loop_ir.kernels) < outputs
    (reference,) = [program.interpret()]
    ours = program.interpret(stage="loop")
    for a, b in zip(ours, reference):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("code", ["x=torch.randn(6,500); (x.amax(1), x.var(1))",
                                  "x=torch.randn(6,500); (x.sum(1), (x - x.mean(1, keepdim=True)).abs().sum(1))"])
def test_a_sibling_with_two_folds_merges_into_the_first(code):
    # The second kernel's later fold (a two-pass variance's sum of squares) had its names renamed
    # statement by statement, and a loop had no renaming: TypeError, a crash of the whole compile.
    program = emmy.optimize(code, target="sm_90")
    (kernel,) = program.loop_ir.kernels
    assert len(kernel.outputs) == 2
    assert all(c.ok for c in check_program(program, mode="asan"))


@pytest.mark.parametrize("knobs", ["REDUCE=g8k", "REDUCE=coop,TILE=f4/v4", "REDUCE=,WORK=t32"])
def test_a_merged_kernel_runs_right_under_each_schedule(knobs):
    program = emmy.optimize("x=torch.randn(3,9000); torch.var_mean(x, dim=1)", target="sm_90", knobs=knobs)
    (kernel,) = program.loop_ir.kernels
    assert len(kernel.outputs) == 2
    assert all(c.ok for c in check_program(program, mode="asan"))


def _kernel(code: str, name: str, output: str):
    program = emmy.optimize(code)
    (kernel,) = program.loop_ir.kernels
    return dataclasses.replace(kernel, name=name, output=output), program.loop_ir


def test_siblings_stay_apart_when_a_kernel_between_them_needs_the_first():
    total, base = _kernel("x=torch.randn(6,500); x.sum(1)", "k_total", "total")
    squares, _ = _kernel("x=torch.randn(6,500); (x * x).sum(1)", "k_squares", "squares")
    between, _ = _kernel("total=torch.randn(6); total * 2", "k_between", "between")  # reads `total`
    apart = LoopProgram((total, between, squares), base.inputs, base.weights, ("between", "squares"))
    assert merge_sibling_folds(apart) == apart
    together = LoopProgram((total, squares, between), base.inputs, base.weights, ("between", "squares"))
    merged, after = merge_sibling_folds(together).kernels
    assert [name for name, _ in merged.outputs] == ["total", "squares"] and after == between


def test_every_layer_of_a_deep_program_merges_its_own_siblings():
    """Few long rows: each layer's statistics split across the GPU in a kernel of their own, where
    the variance and the mean share one read of the rows."""
    layers = "".join("m, v = torch.var_mean(x, dim=-1, keepdim=True); x = (x - m) * (v + 1).rsqrt() * 1.01; "
                     for _ in range(6))
    program = emmy.optimize(f"x=torch.randn(4,1048576); {layers} x", target="sm_90")
    merged = [k for k in program.loop_ir.kernels if k.more_outputs]
    assert len(merged) == 6, [k.name for k in program.loop_ir.kernels]


def test_two_matmuls_of_one_input_stay_two_matmuls():
    """A grouped-query attention's key and value projections read the same rows and fold alike,
    but merged they are no matmul (two accumulators over one k loop): the cost model prices the
    pair as a row kernel at over twice the two matmuls, so extraction keeps them apart."""
    from emmy.schedule.shape import kernel_shape

    code = ("x=torch.randn(256,256); wk=torch.randn(128,256); wv=torch.randn(128,256); "
            "(x @ wk.t(), x @ wv.t())")
    program = emmy.optimize(code, stop_after="tile")
    assert [kernel_shape(k).kind for k in program.loop_ir.kernels] == ["contraction", "contraction"]
    together = merge_sibling_folds(program.loop_ir)
    assert len(together.kernels) == 1  # the pass alone merges them: the price is what refuses
