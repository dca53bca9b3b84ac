"""The emitted CUDA is byte-identical to the snapshot (tests/cuda_snapshot.py): refactoring Kernel IR,
the schedule wing or the templates changes no kernel unless the snapshot is deliberately rewritten. The
same lowered kernels are held to Kernel IR's contract: no C text in their nodes."""

import difflib

import pytest

from emmy.workloads import WORKLOADS
from tests import cuda_snapshot
from tests.conftest import compiled


@pytest.fixture(scope="module")
def golden():
    return cuda_snapshot.load()


@pytest.mark.parametrize("workload", WORKLOADS, ids=lambda w: w.name)
@pytest.mark.parametrize("target", cuda_snapshot.TARGETS)
def test_emitted_cuda_matches_the_snapshot(golden, workload, target):
    program = compiled(workload.sim_code or workload.code, target)
    emitted = {f"{workload.name}@{target}/chosen": program.cuda_source}
    for j, rows in enumerate(cuda_snapshot.variants(program)):
        variant = program.with_rows(rows)
        emitted[f"{workload.name}@{target}/v{j}"] = variant.cuda_source
        # Kernel IR holds meaning, not C: every string a lowered node holds is a name or a word
        for kernel in variant.kernel_ir:
            for path, value in cuda_snapshot.node_strings(kernel, kernel.name):
                assert cuda_snapshot.WORD.fullmatch(value), (workload.name, path, value)
    expected = {label: text for label, text in golden.items() if label.startswith(f"{workload.name}@{target}/")}
    assert sorted(emitted) == sorted(expected)
    for label, text in emitted.items():
        if text != expected[label]:
            diff = "".join(list(difflib.unified_diff(expected[label].splitlines(True), text.splitlines(True),
                                                     "snapshot", "emitted", n=1))[:60])
            pytest.fail(f"{label} differs from the snapshot:\n{diff}")
