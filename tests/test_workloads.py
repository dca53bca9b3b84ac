"""Every reference workload captures, prints and interprets correctly."""

import pytest

import emmy
from emmy.tensor_ir.nodes import IndexMap
from emmy.workloads import WORKLOADS
from tests.conftest import check_against_torch


INTERPRETABLE = 2 ** 26  # elements of the largest value the numpy interpreter materializes (float64: 512 MB)


@pytest.mark.parametrize("workload", WORKLOADS, ids=[w.name for w in WORKLOADS])
def test_workload_interprets_like_torch(workload):
    program = emmy.optimize(workload.code)
    if any(isinstance(n, IndexMap) and n.guards and n.type.numel > INTERPRETABLE for n in program.tensor_ir.nodes):
        # a guarded map is materialized by the interpreter (no strided view takes guards): a padded
        # convolution window at full size (8x64x56x56 outputs x 576 taps) is no numpy array, the same
        # program at its small shape is
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
