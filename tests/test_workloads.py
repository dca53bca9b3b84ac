"""Every reference workload captures, prints and interprets correctly."""

import pytest

import emmy
from emmy.tensor_ir.interpreter import too_big_to_interpret
from emmy.workloads import WORKLOADS
from tests.conftest import check_against_torch


@pytest.mark.parametrize("workload", WORKLOADS, ids=[w.name for w in WORKLOADS])
def test_workload_interprets_like_torch(workload):
    program = emmy.optimize(workload.code)
    if too_big_to_interpret(program.tensor_ir):  # a padded convolution window at full size: its small twin
        program = emmy.optimize(workload.sim_code)
    text = program.ir("tensor")
    assert text.count("let ") == sum(1 for n in program.tensor_ir.nodes if type(n).__name__ in
                                     ("Elementwise", "Reduce", "IndexMap"))
    check_against_torch(program)


def test_benchmark_shapes_capture_too():
    for workload in WORKLOADS:
        if workload.bench_code:
            graph = emmy.optimize(workload.bench_code).tensor_ir
            assert graph.validate() is graph
