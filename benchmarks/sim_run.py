"""Simulator benchmarks on this machine: build time, the second load of the same source (the
cache), and the time to simulate a block reduction of 32 blocks x 256 threads, per build mode; and
a whole program (emmy.workloads' GPT-2-like decoder, 4 layers of width 256) called on CPU tensors,
plain and ASan.

    .venv/bin/python benchmarks/sim_run.py [--out benchmarks/SIM_REPORT.md]

Exit status 1 when the plain reduction takes 1 s or more, or a second load compiles again.
"""

from __future__ import annotations

import argparse
import os
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


def decoder_program():
    """emmy.workloads' GPT-2-like decoder, 4 layers of width 256 (8 heads, 128 tokens): the program,
    its input and torch's result."""
    import torch

    import emmy
    from emmy.workloads import decoder_stack

    model, x = decoder_stack(4, dim=256, heads=8, tokens=128)
    model.eval()
    with torch.no_grad():
        want = model(x)
    return emmy.optimize(model, x), x, want


def measure_program(program, x, want, mode: str) -> dict:
    start = time.perf_counter()
    program(x, sim_mode=mode)  # builds the simulator library (and starts ASan's worker)
    first = time.perf_counter() - start
    start = time.perf_counter()
    got = program(x, sim_mode=mode)
    return {"mode": mode, "first": first, "run": time.perf_counter() - start,
            "error": float((got - want).abs().max())}


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default="benchmarks/SIM_REPORT.md")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as cache:  # a cold cache: the first load compiles
        rows = [measure(mode, Path(cache)) for mode in sim.MODES]
        os.environ["EMMY_CACHE_DIR"] = cache
        program, x, want = decoder_program()
        calls = [measure_program(program, x, want, mode) for mode in ("plain", "asan")]
    lines = [
        "# Simulator benchmarks",
        "",
        "Command: `.venv/bin/python benchmarks/sim_run.py` (a fresh cache; best of "
        f"{REPEATS} launches). Machine: {platform.machine()}, "
        f"{len(os.sched_getaffinity(0))} cores, Python {platform.python_version()}.",
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
    lines += ["", f"Plain launch: {plain['run']:.3f} s (target: under 1 s). The first asan launch starts "
              "its worker process (the ASan runtime must be preloaded), which the best of the launches leaves out. The first load includes building "
              "the simulator's runtime for the mode (once per cache).", "",
              f"Program: `emmy.workloads.decoder_stack(4, dim=256, heads=8, tokens=128)` ({len(program.kernels)} "
              "kernels) called on CPU tensors, `program(x, sim_mode=...)`: the first call builds, the second only runs.", "",
              "| mode | first call s | second call s | max abs error against torch |", "|---|---|---|---|"]
    lines += [f"| {c['mode']} | {c['first']:.1f} | {c['run']:.1f} | {c['error']:.2e} |" for c in calls]
    lines.append("")
    Path(args.out).write_text("\n".join(lines))
    print("\n".join(lines))
    ok = plain["run"] < 1.0 and not any(r["recompiled"] for r in rows) and all(r["compiled"] for r in rows) and \
        all(c["error"] < 1e-4 for c in calls)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
