"""Compile-time benchmarks: Tensor IR -> CUDA text per workload (in process, torch already
imported), and whole `emmy compile -c <RMSNorm> --ir cuda` processes, cold and repeated (the
repeat hits the capture cache and must not import torch).

    .venv/bin/python benchmarks/compile_run.py [--out benchmarks/COMPILE_REPORT.md]

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


def process(code: str, cache: str) -> tuple[float, int]:
    """Seconds and peak resident kilobytes of one `emmy compile --ir cuda` process."""
    with tempfile.NamedTemporaryFile(suffix=".cu") as out:
        start = time.perf_counter()
        done = subprocess.run(["/usr/bin/time", "-f", "%M", str(EMMY), "compile", "-c", code, "--ir", "cuda",
                               "-o", out.name], capture_output=True, text=True, env=dict(os.environ,
                                                                                          EMMY_CACHE_DIR=cache))
        seconds = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(done.stderr)
    return seconds, int(done.stderr.strip().splitlines()[-1])


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default="benchmarks/COMPILE_REPORT.md")
    args = parser.parse_args()
    rows, worst = [], 0.0
    for workload in WORKLOADS:
        seconds, why = to_cuda_seconds(workload.code)
        worst = max(worst, seconds)
        rows.append(f"| {workload.name} | {seconds:.3f} | |" if not why else f"| {workload.name} | - | {why} |")
    rms = get("rmsnorm").code
    with tempfile.TemporaryDirectory() as cache:
        cold = process(rms, cache)
        warm = min((process(rms, cache) for _ in range(REPEATS)), key=lambda t: t[0])
    lines = [
        "# Compile-time benchmarks", "",
        f"Command: `.venv/bin/python benchmarks/compile_run.py` (best of {REPEATS}). Machine: {platform.machine()}, "
        f"{len(os.sched_getaffinity(0))} cores, Python {platform.python_version()}, torch {torch.__version__}.", "",
        "## Tensor IR -> CUDA text, in process (saturation, extraction, Tile IR, Kernel IR, templates)", "",
        "| workload | seconds | note |", "|---|---|---|", *rows, "",
        f"Slowest: {worst:.3f} s (target: under 1 s each). Workloads with a dash are not lowered to CUDA yet.", "",
        "## `emmy compile -c <RMSNorm> --ir cuda`, whole process", "",
        "| run | seconds | peak RSS MB |", "|---|---|---|",
        f"| cold (empty caches: capture with torch.export) | {cold[0]:.2f} | {cold[1] / 1024:.0f} |",
        f"| repeated (capture cache hit, torch not imported) | {warm[0]:.2f} | {warm[1] / 1024:.0f} |", "",
        "Reference: the peer compiler (emmy-llm 0.1.1) took 6.6-8.2 s and about 840 MB per process for this "
        "command on a 2-core machine (its published figure); targets: cold under that, repeat under 1.5 s.", "",
    ]
    Path(args.out).write_text("\n".join(lines))
    print("\n".join(lines))
    return 0 if worst < 1.0 and cold[0] < 6.6 and warm[0] < 1.5 else 1


if __name__ == "__main__":
    sys.exit(main())
