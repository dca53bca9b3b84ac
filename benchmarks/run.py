"""Optimizer benchmarks on this machine: per workload, each stage's time
(extraction: Tensor IR to Tile IR with the cost model), the e-graph's phases
(iterations, e-nodes, seconds), the schedule space (legal rows, build time
per target) and the model's predictions against the bandwidth bound.

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
from emmy.schedule.space import build_space
from emmy.extract.targets import TARGETS
from emmy.schedule.shape import kernel_shape
from emmy.workloads import WORKLOADS

REPEATS = 3


def cold_caches() -> None:
    """Forget what earlier compiles in this process built (schedule spaces by shape, geometries), so each
    repeat pays what a fresh process pays."""
    from emmy.schedule.geometry import geometry
    from emmy.schedule.space import forget_spaces

    forget_spaces()
    geometry.cache_clear()


def contraction_flops(tile_kernel) -> tuple[float, bool]:
    """(FLOPs, on tensor cores) of a contraction kernel (convolutions are contractions too): two per
    multiply-add of M x N x K per batch; 0 for other kernels."""
    shape = tile_kernel.shape
    if shape.kind != "contraction":
        return 0.0, False
    return 2.0 * shape.rows * shape.cols * shape.red * shape.batch, tile_kernel.row.tile.mma


def measure(workload) -> dict:
    best = {}
    for _ in range(REPEATS):
        cold_caches()
        start = time.perf_counter()
        program = emmy.optimize(workload.code, target="sm_90")
        captured = time.perf_counter()
        _ = program.tensor_ir
        decomposed = time.perf_counter()
        result = program.loop_result  # saturation, then every program form priced by the model
        looped = time.perf_counter()
        tile = program.tile_ir
        tiled = time.perf_counter()
        shapes = [kernel_shape(k) for k in result.program.kernels]
        spaces = {}
        for name, target in TARGETS.items():
            t0 = time.perf_counter()
            space = build_space(shapes, target)
            spaces[name] = (time.perf_counter() - t0, sum(len(r) for r in space.rows.values()))
        sample = {
            "capture": captured - start,
            "decompose": decomposed - captured,
            "to_loop": looped - decomposed,
            "to_tile": tiled - looped,
            "extract": tiled - decomposed,
            "total": tiled - start,
            "moves": result.search.moves_priced,
            "kernels": len(result.program.kernels),
            "phases": result.reports,
            "spaces": spaces,
            "predicted": [(k.kernel.name, str(k.row), k.breakdown, contraction_flops(k)) for k in tile.kernels],
        }
        if not best or sample["total"] < best["total"]:
            best = sample
    return best


RMSNORM_BY_SIZE = "x=torch.randn(1,{rows},2048); w=torch.randn(2048); F.rms_norm(x,(2048,),w,eps=1e-6)"


def rmsnorm_by_size() -> list[str]:
    """How far the chosen RMSNorm row's predicted device time is from the bandwidth bound, by rows."""
    lines = []
    for rows in (32, 128, 512, 4096, 16384):
        (kernel,) = emmy.optimize(RMSNORM_BY_SIZE.format(rows=rows), target="sm_90").tile_ir.kernels
        b = kernel.breakdown
        bound = b.bytes / TARGETS["sm_90"].dram_bandwidth
        device = b.total_s - b.launch_s
        lines.append(f"| {rows} | {b.bytes / 1e6:.3f} | `{kernel.row}` | {device * 1e6:.2f} | {bound * 1e6:.3f} | "
                     f"{device / bound:.2f} |")
    return lines


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
        h200 = TARGETS["sm_90"]
        for kernel, row, b, (flops, mma) in m["predicted"]:
            flop_bound = flops / (h200.tensor_flops if mma else h200.fp32_flops)
            bound = max(b.bytes / h200.dram_bandwidth, flop_bound)
            predicted_lines.append(f"| {workload.name} | {kernel} | `{row}` | {b.total_s * 1e6:.2f} | "
                                   f"{(b.total_s - b.launch_s) * 1e6:.2f} | {b.bytes / h200.dram_bandwidth * 1e6:.3f} | "
                                   f"{flop_bound * 1e6:.3f} | {(b.total_s - b.launch_s) / bound:.1f} |")
        space_lines.append(f"| {workload.name} | " + " | ".join(
            f"{m['spaces'][t][1]} / {m['spaces'][t][0]:.3f}" for t in TARGETS) + " |")
        print(f"{workload.name:18s} capture {m['capture']:.3f}s  decompose {m['decompose']:.3f}s  "
              f"extract {m['extract']:.3f}s  kernels {m['kernels']}", flush=True)
    worst = max(r["extract"] for r in rows)
    worst_space = max(s for r in rows for s, _ in r["spaces"].values())
    lines = [
        "# Optimizer benchmarks",
        "",
        f"Command: `.venv/bin/python benchmarks/run.py` (best of {REPEATS} per workload; torch imported before timing).",
        f"Machine: {platform.processor() or platform.machine()}, {len(__import__('os').sched_getaffinity(0))} cores, "
        f"Python {platform.python_version()}, torch {torch.__version__}.",
        "",
        "Extraction is everything from Tensor IR to Tile IR on sm_90: saturation, then the boundary search "
        "(docs/extraction.md: kernel boundaries and fold forms chosen by the sum of the kernels' best rows, each "
        "move priced by the cost model), then the chosen program's rows found on its e-classes.",
        "",
        "| workload | capture s | decompose s | to Loop IR s | to Tile IR s | extraction s | moves priced | kernels |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(f"| {r['name']} | {r['capture']:.3f} | {r['decompose']:.3f} | {r['to_loop']:.3f} | "
                     f"{r['to_tile']:.3f} | {r['extract']:.3f} | {r['moves']} | {r['kernels']} |")
    lines += [
        "",
        f"Slowest extraction: {worst:.3f} s (target: under 1 s each). "
        f"Median: {statistics.median(r['extract'] for r in rows):.3f} s.",
        "",
        "## Schedule space",
        "",
        "Legal rows (all kernels of the chosen program) / seconds to build the space, per target.",
        "",
        "| workload | " + " | ".join(TARGETS) + " |",
        "|---|" + "---|" * len(TARGETS),
        *space_lines,
        "",
        f"Slowest schedule-space build: {worst_space:.3f} s (target: under 1 s each).",
        "",
        "## Predicted times on sm_90 (the analytic model; no GPU measurement)",
        "",
        f"Bounds: the kernel's bytes over the measured H200 copy bandwidth "
        f"({TARGETS['sm_90'].dram_bandwidth / 1e12:.1f} TB/s), and a contraction's (or convolution's) FLOPs "
        f"over the f16 tensor-core peak ({TARGETS['sm_90'].tensor_flops / 1e12:.0f} TFLOP/s) for mma rows, "
        f"else the FP32 peak ({TARGETS['sm_90'].fp32_flops / 1e12:.0f} TFLOP/s). `device` is the prediction "
        f"without the {TARGETS['sm_90'].launch_seconds * 1e6:.0f} us launch estimate; `x bound` is device over "
        "the larger bound.",
        "",
        "| workload | kernel | chosen row | total us | device us | bytes bound us | FLOP bound us | x bound |",
        "|---|---|---|---|---|---|---|---|",
        *predicted_lines,
        "",
        "### RMSNorm by size (f32[1, rows, 2048], sm_90)",
        "",
        "The reference RMSNorm (32 rows) moves about half a megabyte: less than the bytes that must be in "
        "flight to keep HBM busy (bandwidth times DRAM latency, a few hundred nanoseconds: megabytes), so "
        "latency, the block-wide reduction and too few blocks for 132 SMs set its time, not bandwidth; peers' "
        "best measured time for this kernel on an RTX 5090 is 2.91 us a launch (median in CUDA-graph batches, "
        "the peers' published figure), about ten times its bound there. Where the bound can be approached, the model's prediction approaches it.",
        "",
        "| rows | MB | chosen row | device us | bound us | x bound |",
        "|---|---|---|---|---|---|",
        *rmsnorm_by_size(),
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
    return 0 if worst < 1.0 and worst_space < 1.0 else 1


if __name__ == "__main__":
    sys.exit(main())
