"""The main job: compile every reference workload as far as the pipeline
goes (through Tile IR: each kernel's chosen schedule and its predicted time),
print the requested stage, and check the result against torch."""

from __future__ import annotations

import sys
import time

from emmy.program import BUILT_STAGES
from emmy.workloads import WORKLOADS, get


def run_suite(stage: str = "loop", target: str | None = None, only=None, quiet: bool = False) -> int:
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
        program = optimize(workload.code, target=target, stop_after="tile")
        compile_s = time.perf_counter() - start
        if not quiet:
            print(f"=== {workload.name}: {workload.code}")
            sys.stdout.write(program.ir(stage))
            print()
        expected = reference_outputs(program.captured)
        errors, ok = [], True
        for interpreter in ("tensor", "loop"):
            worst = 0.0
            for out, want, name in zip(program.interpret(stage=interpreter), expected, program.tensor_ir.outputs):
                result = compare(out.float().numpy(), want, program.tensor_ir[name].type.dtype)
                worst, ok = max(worst, result.max_abs), ok and result.ok
            errors.append(f"{worst:.2e}")
        failed += not ok
        predicted = sum(k.seconds for k in program.tile_ir.kernels)
        rows.append((workload.name, len(program.loop_ir.kernels), f"{compile_s:.2f}", f"{predicted * 1e6:.2f}",
                     *errors, "ok" if ok else "MISMATCH"))
    target_name = program.target.name if rows else ""
    header = ("workload", "kernels", "compile s", f"predicted us ({target_name})", "tensor IR err", "loop IR err",
              "vs torch (f64)")
    widths = [max(len(str(r[i])) for r in rows + [header]) for i in range(len(header))]
    for row in [header] + rows:
        print("  ".join(str(c).ljust(w) for c, w in zip(row, widths)))
    print(f"{len(rows) - failed} passed, {failed} failed")
    return 1 if failed else 0
