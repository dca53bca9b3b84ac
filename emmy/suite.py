"""The main job: compile every reference workload as far as the pipeline
goes, print the requested stage, and check the result against torch."""

from __future__ import annotations

import sys
import time

from emmy.program import BUILT_STAGES
from emmy.workloads import WORKLOADS, get


def run_suite(stage: str = "tensor", target: str | None = None, only=None, quiet: bool = False) -> int:
    from emmy.api import optimize
    from emmy.checking import compare, reference_outputs
    from emmy.errors import StageNotBuiltError

    if stage not in BUILT_STAGES:
        raise StageNotBuiltError(f"the {stage} stage is not built yet; stages so far: {', '.join(BUILT_STAGES)}")
    chosen = [get(name) for name in only] if only else list(WORKLOADS)
    rows = []
    failed = 0
    for workload in chosen:
        start = time.perf_counter()
        program = optimize(workload.code, target=target)
        compile_s = time.perf_counter() - start
        if not quiet:
            print(f"=== {workload.name}: {workload.code}")
            sys.stdout.write(program.ir(stage))
            print()
        actual = program.interpret()
        expected = reference_outputs(program.captured)
        worst_abs, worst_rel, ok = 0.0, 0.0, True
        for out, want, name in zip(actual, expected, program.tensor_ir.outputs):
            dtype = program.tensor_ir[name].type.dtype
            result = compare(out.float().numpy(), want, dtype)
            worst_abs, worst_rel, ok = max(worst_abs, result.max_abs), max(worst_rel, result.max_rel), ok and result.ok
        failed += not ok
        rows.append((workload.name, len(program.tensor_ir.nodes), f"{compile_s:.2f}", f"{worst_abs:.2e}",
                     "ok" if ok else "MISMATCH"))
    header = ("workload", "tensor IR nodes", "compile s", "max abs err vs torch (f64)", "interpreter")
    widths = [max(len(str(r[i])) for r in rows + [header]) for i in range(len(header))]
    for row in [header] + rows:
        print("  ".join(str(c).ljust(w) for c, w in zip(row, widths)))
    print(f"{len(rows) - failed} passed, {failed} failed")
    return 1 if failed else 0
