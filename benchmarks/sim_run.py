"""Simulator benchmarks on this machine: build time, the second load of the same source (the
cache), and the time to simulate a block reduction of 32 blocks x 256 threads, per build mode.

    .venv/bin/python benchmarks/sim_run.py [--out benchmarks/SIM_REPORT.md]

Exit status 1 when the plain reduction takes 1 s or more, or a second load compiles again.
"""

from __future__ import annotations

import argparse
import platform
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

import emmy.sim as sim

KERNEL = Path(__file__).resolve().parent.parent / "tests" / "sim_kernels" / "block_reduce.cu"
REPEATS = 5


def measure(mode: str, cache: Path) -> dict:
    source = KERNEL.read_text()
    start = time.perf_counter()
    first = sim.load(source, KERNEL.name, mode=mode, cache_dir=cache)
    built = time.perf_counter() - start
    start = time.perf_counter()
    second = sim.load(source, KERNEL.name, mode=mode, cache_dir=cache)
    reloaded = time.perf_counter() - start
    x = np.random.default_rng(0).standard_normal((32, 4096)).astype(np.float32)
    out = np.zeros(32, np.float32)
    runs = []
    for _ in range(REPEATS):
        start = time.perf_counter()
        second.launch("row_sum", grid=32, block=256, args=[x, out, 4096])
        runs.append(time.perf_counter() - start)
    error = float(np.abs(out - x.astype(np.float64).sum(1)).max())
    return {"mode": mode, "build": built, "compiled": first.compiled, "reload": reloaded,
            "recompiled": second.compiled, "run": min(runs), "error": error}


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default="benchmarks/SIM_REPORT.md")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as cache:  # a cold cache: the first load compiles
        rows = [measure(mode, Path(cache)) for mode in sim.MODES]
    lines = [
        "# Simulator benchmarks",
        "",
        "Command: `.venv/bin/python benchmarks/sim_run.py` (a fresh cache; best of "
        f"{REPEATS} launches). Machine: {platform.machine()}, "
        f"{len(__import__('os').sched_getaffinity(0))} cores, Python {platform.python_version()}.",
        "",
        "Kernel: `row_sum` of tests/sim_kernels/block_reduce.cu (warp shuffles, then a shared-memory "
        "tree), 32 blocks x 256 threads over f32[32, 4096].",
        "",
        "| mode | first load s (g++) | second load s | second load compiled | 32 x 256 launch s | max abs error |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(f"| {r['mode']} | {r['build']:.2f} | {r['reload']:.4f} | {'yes' if r['recompiled'] else 'no'} | "
                     f"{r['run']:.3f} | {r['error']:.2e} |")
    plain = next(r for r in rows if r["mode"] == "plain")
    lines += ["", f"Plain launch: {plain['run']:.3f} s (target: under 1 s). The asan launch includes starting "
              "its worker process (the ASan runtime must be preloaded).", ""]
    Path(args.out).write_text("\n".join(lines))
    print("\n".join(lines))
    ok = plain["run"] < 1.0 and not any(r["recompiled"] for r in rows) and all(r["compiled"] for r in rows)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
