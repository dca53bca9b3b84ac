"""The main job: compile every reference workload as far as the pipeline
goes (through Tile IR: each kernel's chosen schedule and its predicted time;
to CUDA where every kernel lowers to Kernel IR), print the requested stage,
check the interpreters against torch, and run the emitted CUDA in the CPU
simulator against torch."""

from __future__ import annotations

import sys
import time

from emmy.program import BUILT_STAGES
from emmy.workloads import WORKLOADS, get


def run_suite(stage: str = "loop", target: str | None = None, only=None, quiet: bool = False) -> int:
    from emmy.api import optimize
    from emmy.checking import compare, reference_outputs
    from emmy.errors import StageNotBuiltError
    from emmy.kernel_ir.lower import Unsupported, supports
    from emmy.runtime import check_program
    from emmy.tensor_ir.interpreter import too_big_to_interpret

    if stage not in BUILT_STAGES:
        raise StageNotBuiltError(f"the {stage} stage is not built yet; stages so far: {', '.join(BUILT_STAGES)}")
    chosen = [get(name) for name in only] if only else list(WORKLOADS)
    rows = []
    failed = 0
    for workload in chosen:
        start = time.perf_counter()
        program = optimize(workload.code, target=target, stop_after="tile")
        types = program.buffer_types
        why = next((f"kernel {k.kernel.name} ({k.shape.describe()}): {supports(k, types)}"
                    for k in program.tile_ir.kernels if supports(k, types)), "")
        if not why:
            try:
                program.kernel_ir  # noqa: B018 - a lowering may still refuse (e.g. a promise it cannot keep)
            except Unsupported as refused:
                why = str(refused)
        compile_s = time.perf_counter() - start
        if not quiet:
            print(f"=== {workload.name}: {workload.code}")
            if why and stage in ("kernel", "cuda"):
                print(f"(no {stage} stage yet: {why})")
            else:
                sys.stdout.write(program.ir(stage))
            print()
        interpreted, twin = program, ""
        if too_big_to_interpret(program.tensor_ir):  # the interpreters check the small-shape twin
            interpreted, twin = optimize(workload.sim_code, target=target), " (small)"
        expected = reference_outputs(interpreted.captured)
        errors, ok = [], True
        for interpreter in ("tensor", "loop"):
            worst = 0.0
            for out, want, name in zip(interpreted.interpret(stage=interpreter), expected,
                                       interpreted.tensor_ir.outputs):
                result = compare(out.float().numpy(), want, interpreted.tensor_ir[name].type.dtype)
                worst, ok = max(worst, result.max_abs), ok and result.ok
            errors.append(f"{worst:.2e}{twin}")
        if why:
            simulated = built = "not lowered yet"
        else:  # the emitted CUDA, built by nvcc, and compiled by g++ and run in the simulator
            resources = program.cubin().resources.values()
            built = "/".join(f"{r.registers}" for r in resources) + (" SPILLS" if any(r.spills for r in resources)
                                                                       else "")
            if workload.sim_code:  # too much work for the simulator: the same program at a small shape,
                small = small_twin(optimize, workload.sim_code, target, program)  # with the same rows where legal
                checks = check_program(small)
                simulated = f"{max(c.max_abs for c in checks):.2e} (small)"
            else:
                checks = check_program(program)
                simulated = f"{max(c.max_abs for c in checks):.2e}"
            ok = ok and all(c.ok for c in checks) and not any(r.spills for r in resources)
        failed += not ok
        predicted = sum(k.seconds for k in program.tile_ir.kernels)
        schedule = str(program.tile_ir.kernels[0].row) + (" ..." if len(program.tile_ir.kernels) > 1 else "")
        rows.append((workload.name, len(program.loop_ir.kernels), schedule, f"{compile_s:.2f}",
                     f"{predicted * 1e6:.2f}", built, *errors, simulated, "ok" if ok else "MISMATCH"))
    target_name = program.target.name if rows else ""
    header = ("workload", "kernels", "schedule (first kernel)", "compile s", f"predicted us ({target_name})",
              "nvcc regs", "tensor IR err", "loop IR err", "CUDA in sim err", "vs torch (f64)")
    widths = [max(len(str(r[i])) for r in rows + [header]) for i in range(len(header))]
    for row in [header] + rows:
        print("  ".join(str(c).ljust(w) for c, w in zip(row, widths)))
    print(f"{len(rows) - failed} passed, {failed} failed")
    return 1 if failed else 0


def small_twin(optimize, code: str, target, program):
    """The small-shape program with the full program's row when it has one kernel and that row is
    offered at the small shape too (the simulator then runs the same kernel code, other extents)."""
    from emmy.errors import EmmyError

    small = optimize(code, target=target)
    if len(program.tile_ir.kernels) != 1 or len(small.loop_ir.kernels) != 1:
        return small
    try:
        pinned = small.with_rows({small.loop_ir.kernels[0].name: program.tile_ir.kernels[0].row})
        pinned.tile_ir  # noqa: B018 - raises when the row is not offered at the small shape
        return pinned
    except EmmyError:
        return small
