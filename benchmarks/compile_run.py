"""Compile-time benchmarks: Tensor IR -> CUDA text per workload (in process, torch already
imported); whole `emmy compile -c <code> --ir cuda` processes for RMSNorm, SDPA and an f16 matmul,
cold and repeated (the repeat hits the capture cache and must not import torch); and where a cold
RMSNorm process spends its time, phase by phase.

    .venv/bin/python benchmarks/compile_run.py [--out benchmarks/COMPILE_REPORT.md] [--before REF]

--before REF also times the cold processes of the emmy at git revision REF (checked out in a
temporary worktree, run with this venv), in the same run, for a before/after ratio.

Exit status 1 when a lowered workload takes 1 s or more to CUDA text, the cold process 6.6 s
or more (the best a peer compiler, emmy-llm 0.1.1, took for this command), or the repeat 1.5 s or more.
"""

from __future__ import annotations

import argparse
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch  # noqa: F401  imported up front: its import time is not emmy's

import emmy
from emmy.kernel_ir.lower import supports
from emmy.workloads import WORKLOADS, get

REPEATS = 3
EMMY = Path(sys.executable).parent / "emmy"


def to_cuda_seconds(code: str) -> tuple[float, str]:
    best, why = float("inf"), ""
    for _ in range(REPEATS):
        program = emmy.optimize(code, target="sm_90", stop_after="tensor")
        start = time.perf_counter()
        tiles = program.tile_ir.kernels
        types = program.buffer_types
        why = next((supports(k, types) for k in tiles if supports(k, types)), "")
        if why:
            return 0.0, why
        _ = program.cuda_source
        best = min(best, time.perf_counter() - start)
    return best, ""


# The `emmy` command of another checkout: its own cli.main, as its console script ran it.
OTHER_EMMY = "import sys; sys.path.insert(0, sys.argv.pop(1)); import emmy.cli; sys.exit(emmy.cli.main())"


def process(code: str, cache: str, checkout: str | None = None) -> tuple[float, int]:
    """Seconds and peak resident kilobytes of one `emmy compile --ir cuda` process (of `checkout`,
    a source tree, when given)."""
    command = [str(EMMY)] if checkout is None else [sys.executable, "-c", OTHER_EMMY, checkout]
    with tempfile.NamedTemporaryFile(suffix=".cu") as out:
        start = time.perf_counter()
        done = subprocess.run(["/usr/bin/time", "-f", "%M", *command, "compile", "-c", code, "--ir", "cuda",
                               "-o", out.name], capture_output=True, text=True, env=dict(os.environ,
                                                                                          EMMY_CACHE_DIR=cache))
        seconds = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(done.stderr)
    return seconds, int(done.stderr.strip().splitlines()[-1])


# Each phase of a cold compile, timed in a fresh process (no caches): what the report's breakdown shows.
PHASES = r"""
import json, sys, time
marks = [("start", time.perf_counter())]
def mark(name):
    marks.append((name, time.perf_counter()))
import emmy, emmy.cli; mark("python and emmy's own imports")
import torch; mark("import torch")
import torch._dynamo; mark("import torch._dynamo (torch.export and make_fx both need it)")
from emmy.capture.code import capture_code
from emmy.capture import exporting
code = capture_code(sys.argv[1], "-c code"); mark("run the code on fake tensors")
exported = exporting.export_module(code.module, code.example_inputs.shaped()); mark("torch.export")
decomposed = exporting.decompose(exported); mark("core-ATen decompositions (run_decompositions)")
from emmy.api import _optimizer_setup
from emmy.config import settings
from emmy.extract.targets import get_target
groups, schedule_rules, budget = _optimizer_setup((), None, settings()); mark("import egglog and emmy's rules")
from emmy.capture import Captured
program = emmy.Program(Captured(decomposed, code.source, code.example_inputs), get_target("sm_90"), groups, budget,
                       schedule_rules=schedule_rules)
program.tensor_program; mark("decompose to Tensor IR")
program.loop_result; mark("e-graph: saturation and extraction")
program.tile_ir; mark("Tile IR: rows priced and chosen")
program.cuda_source; mark("Kernel IR and CUDA text")
print(json.dumps([(name, t - marks[k][1]) for k, (name, t) in enumerate(marks[1:])]))
"""


def phases(code: str, cache: str) -> list[tuple[str, float]]:
    import json

    done = subprocess.run([sys.executable, "-c", PHASES, code], capture_output=True, text=True,
                          env=dict(os.environ, EMMY_CACHE_DIR=cache))
    if done.returncode != 0:
        raise SystemExit(done.stderr)
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default="benchmarks/COMPILE_REPORT.md")
    parser.add_argument("--before", metavar="REF", help="also time the cold compiles of this git revision")
    args = parser.parse_args()
    rows, worst = [], 0.0
    for workload in WORKLOADS:
        seconds, why = to_cuda_seconds(workload.code)
        worst = max(worst, seconds)
        rows.append(f"| {workload.name} | {seconds:.3f} | |" if not why else f"| {workload.name} | - | {why} |")
    processes = []
    with tempfile.TemporaryDirectory() as cache:
        for name in ("rmsnorm", "attention", "matmul_f16"):
            code = get(name).code
            cold = process(code, cache)
            warm = min((process(code, cache) for _ in range(REPEATS)), key=lambda t: t[0])
            processes.append((name, cold, warm))
    before = []
    if args.before:
        root = Path(__file__).resolve().parent.parent
        with tempfile.TemporaryDirectory() as tree:
            subprocess.run(["git", "-C", str(root), "worktree", "add", "--detach", tree, args.before], check=True,
                           capture_output=True)
            try:
                for name, cold, _ in processes:
                    runs = []
                    for _ in range(REPEATS):
                        with tempfile.TemporaryDirectory() as cache:
                            runs.append(process(get(name).code, cache, tree)[0])
                    before.append((name, min(runs)))
            finally:
                subprocess.run(["git", "-C", str(root), "worktree", "remove", "--force", tree], capture_output=True)
        colds = {}
        for name, _, _ in processes:  # best of REPEATS cold runs of today's emmy too, beside the revision's
            runs = []
            for _ in range(REPEATS):
                with tempfile.TemporaryDirectory() as cache:
                    runs.append(process(get(name).code, cache)[0])
            colds[name] = min(runs)
    with tempfile.TemporaryDirectory() as cache:
        breakdown = phases(get("rmsnorm").code, cache)
    total = sum(seconds for _, seconds in breakdown)
    cold_rms = processes[0][1][0]
    lines = [
        "# Compile-time benchmarks", "",
        f"Command: `.venv/bin/python benchmarks/compile_run.py` (best of {REPEATS}). Machine: {platform.machine()}, "
        f"{len(os.sched_getaffinity(0))} cores, Python {platform.python_version()}, torch {torch.__version__}.", "",
        "## Tensor IR -> CUDA text, in process (saturation, extraction, Tile IR, Kernel IR, templates)", "",
        "| workload | seconds | note |", "|---|---|---|", *rows, "",
        f"Slowest: {worst:.3f} s (target: under 1 s each). Workloads with a dash are not lowered to CUDA yet.", "",
        "## `emmy compile -c <code> --ir cuda`, whole process", "",
        "| workload | cold s (empty caches: capture with torch.export) | cold peak RSS MB "
        "| repeated s (capture cache hit, torch not imported) | repeated peak RSS MB |", "|---|---|---|---|---|",
        *[f"| {name} | {cold[0]:.2f} | {cold[1] / 1024:.0f} | {warm[0]:.2f} | {warm[1] / 1024:.0f} |"
          for name, cold, warm in processes], "",
        "Reference: the peer compiler (emmy-llm 0.1.1) took 6.6-8.2 s and about 840 MB per process for the "
        "RMSNorm command on a 2-core machine (its published figure); targets: cold under that, repeat under 1.5 s.", "",
        *([f"## Cold compiles before and after (`--before {args.before}`, best of {REPEATS}, same run)", "",
           "| workload | before s | now s | now / before |", "|---|---|---|---|",
           *[f"| {name} | {b:.2f} | {colds[name]:.2f} | {colds[name] / b:.2f} |" for name, b in before], ""]
          if before else []),
        "## Where a cold RMSNorm compile spends its time", "",
        "Each phase timed in one fresh process with empty caches (the phases of `emmy compile`, run one after "
        "another):", "",
        "| phase | seconds | share |", "|---|---|---|",
        *[f"| {name} | {seconds:.2f} | {seconds / total:.0%} |" for name, seconds in breakdown],
        f"| total | {total:.2f} | |", "",
        "torch's own imports (torch, then torch._dynamo, which torch.export and make_fx both import) are a floor "
        "that any route through torch's tracers pays before emmy's work starts. The `emmy` command therefore "
        "captures `-c` code in a forked child (emmy.api.capture_ahead, with cyclic garbage collection off there) "
        "while it loads egglog and the rules, skips the second trace of run_decompositions when the exported "
        "graph holds only ops emmy lowers as they are, and exits without the interpreter's teardown "
        "(emmy.cli.console_main): the phases above run one after another, the command overlaps them.", "",
    ]
    Path(args.out).write_text("\n".join(lines))
    print("\n".join(lines))
    return 0 if worst < 1.0 and cold_rms < 6.6 and all(w[0] < 1.5 for _, _, w in processes) else 1


if __name__ == "__main__":
    sys.exit(main())
