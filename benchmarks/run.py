"""Optimizer benchmarks on this machine: per workload, each stage's time,
the e-graph's phases (iterations, e-nodes, seconds), and the schedule space
(legal rows, build time per target, Loop IR -> Tile IR time).

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
from emmy.egraph.schedules import build_space
from emmy.extract.targets import TARGETS
from emmy.tile_ir.build import build_tile_program
from emmy.tile_ir.shape import kernel_shape
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
        shapes = [kernel_shape(k) for k in result.program.kernels]
        spaces = {}
        for name, target in TARGETS.items():
            t0 = time.perf_counter()
            space = build_space(shapes, target)
            spaces[name] = (time.perf_counter() - t0, sum(len(r) for r in space.rows.values()))
        t0 = time.perf_counter()
        tile = build_tile_program(result.program, TARGETS["sm_90"])
        tiled = time.perf_counter() - t0
        sample = {
            "capture": captured - start,
            "decompose": decomposed - captured,
            "to_loop": looped - decomposed,
            "total": looped - start,
            "kernels": len(result.program.kernels),
            "phases": result.reports,
            "spaces": spaces,
            "to_tile": tiled,
            "predicted": [(k.kernel.name, str(k.row), k.breakdown) for k in tile.kernels],
        }
        if not best or sample["total"] < best["total"]:
            best = sample
    return best


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default="benchmarks/REPORT.md")
    args = parser.parse_args()
    rows, phase_lines, space_lines, predicted_lines = [], [], [], []
    for workload in WORKLOADS:
        m = measure(workload)
        rows.append(m | {"name": workload.name})
        for report in m["phases"]:
            phase_lines.append(f"| {workload.name} | {report.phase} | {report.iterations} | {report.enodes} | "
                               f"{report.seconds * 1000:.1f} | {'saturated' if report.saturated else report.stopped_by} |")
        bandwidth = TARGETS["sm_90"].dram_bandwidth
        for kernel, row, b in m["predicted"]:
            bound = b.bytes / bandwidth
            predicted_lines.append(f"| {workload.name} | {kernel} | `{row}` | {b.total_s * 1e6:.2f} | "
                                   f"{(b.total_s - b.launch_s) * 1e6:.2f} | {bound * 1e6:.3f} | "
                                   f"{(b.total_s - b.launch_s) / bound:.1f} |")
        space_lines.append(f"| {workload.name} | " + " | ".join(
            f"{m['spaces'][t][1]} / {m['spaces'][t][0]:.3f}" for t in TARGETS) + f" | {m['to_tile']:.3f} |")
        print(f"{workload.name:18s} capture {m['capture']:.3f}s  decompose {m['decompose']:.3f}s  "
              f"tensor->loop {m['to_loop']:.3f}s  kernels {m['kernels']}", flush=True)
    worst = max(r["to_loop"] for r in rows)
    worst_space = max(s for r in rows for s, _ in r["spaces"].values())
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
        "## Schedule space",
        "",
        "Legal rows (all kernels) / seconds to build the space, per target; then Loop IR -> Tile IR "
        "(space, costs, choice) on sm_90.",
        "",
        "| workload | " + " | ".join(TARGETS) + " | to Tile IR s |",
        "|---|" + "---|" * len(TARGETS) + "---|",
        *space_lines,
        "",
        f"Slowest schedule-space build: {worst_space:.3f} s (target: under 1 s each).",
        "",
        "## Predicted times on sm_90 (the analytic model; no GPU measurement)",
        "",
        f"Bound: the kernel's bytes over the measured H200 copy bandwidth "
        f"({TARGETS['sm_90'].dram_bandwidth / 1e12:.1f} TB/s). `device` is the prediction without the "
        f"{TARGETS['sm_90'].launch_seconds * 1e6:.0f} us launch estimate; `x bound` is device over bound.",
        "",
        "| workload | kernel | chosen row | total us | device us | bound us | x bound |",
        "|---|---|---|---|---|---|---|",
        *predicted_lines,
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
    return 0 if worst < 0.5 and worst_space < 1.0 else 1


if __name__ == "__main__":
    sys.exit(main())
