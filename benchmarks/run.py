"""Optimizer benchmarks on this machine: per workload, each stage's time and
the e-graph's phases (iterations, e-nodes, seconds).

    .venv/bin/python benchmarks/run.py [--out benchmarks/REPORT.md]

torch is imported before the clock starts, so `optimize` times exclude it.
"""

from __future__ import annotations

import argparse
import platform
import statistics
import sys
import time
from pathlib import Path

import torch  # noqa: F401  imported up front: its import time is not emmy's

import emmy
from emmy.egraph import optimize_loops
from emmy.egraph.driver import Budget
from emmy.rules import builtin_groups
from emmy.workloads import WORKLOADS

REPEATS = 3


def measure(workload) -> dict:
    best = {}
    for _ in range(REPEATS):
        start = time.perf_counter()
        program = emmy.optimize(workload.code, stop_after="torch")
        captured = time.perf_counter()
        graph = program.tensor_ir
        decomposed = time.perf_counter()
        result = optimize_loops(graph, builtin_groups(), Budget())
        looped = time.perf_counter()
        sample = {
            "capture": captured - start,
            "decompose": decomposed - captured,
            "to_loop": looped - decomposed,
            "total": looped - start,
            "kernels": len(result.program.kernels),
            "phases": result.reports,
        }
        if not best or sample["total"] < best["total"]:
            best = sample
    return best


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default="benchmarks/REPORT.md")
    args = parser.parse_args()
    rows, phase_lines = [], []
    for workload in WORKLOADS:
        m = measure(workload)
        rows.append(m | {"name": workload.name})
        for report in m["phases"]:
            phase_lines.append(f"| {workload.name} | {report.phase} | {report.iterations} | {report.enodes} | "
                               f"{report.seconds * 1000:.1f} | {'saturated' if report.saturated else report.stopped_by} |")
        print(f"{workload.name:18s} capture {m['capture']:.3f}s  decompose {m['decompose']:.3f}s  "
              f"tensor->loop {m['to_loop']:.3f}s  kernels {m['kernels']}", flush=True)
    worst = max(r["to_loop"] for r in rows)
    lines = [
        "# Optimizer benchmarks",
        "",
        f"Command: `.venv/bin/python benchmarks/run.py` (best of {REPEATS} per workload; torch imported before timing).",
        f"Machine: {platform.processor() or platform.machine()}, {len(__import__('os').sched_getaffinity(0))} cores, "
        f"Python {platform.python_version()}, torch {torch.__version__}.",
        "",
        "| workload | capture s | decompose s | Tensor IR -> Loop IR s | optimize total s | kernels |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(f"| {r['name']} | {r['capture']:.3f} | {r['decompose']:.3f} | {r['to_loop']:.3f} | "
                     f"{r['total']:.3f} | {r['kernels']} |")
    lines += [
        "",
        f"Slowest Tensor IR -> Loop IR: {worst:.3f} s (target: under 0.5 s each). "
        f"Median: {statistics.median(r['to_loop'] for r in rows):.3f} s.",
        "",
        "## E-graph phases",
        "",
        "| workload | phase | iterations | e-nodes | ms | ended |",
        "|---|---|---|---|---|---|",
        *phase_lines,
        "",
    ]
    Path(args.out).write_text("\n".join(lines))
    print(f"wrote {args.out}")
    return 0 if worst < 0.5 else 1


if __name__ == "__main__":
    sys.exit(main())
