"""How fast candidates are built for the GPU: RMSNorm-sized candidate rows (the tuner's unit of work),
each lowered to CUDA and built by nvcc into its GPU library (emmy.gpu.program_library, what the tuner
and the GPU session load), on every core at once, from a cold cache.

    .venv/bin/python benchmarks/compile_throughput.py [--candidates 8] [--out benchmarks/COMPILE_THROUGHPUT.md]

The target (issue 18) is 8 candidates a second on a 2-core machine; this measures where the one-library-a-
candidate path stands against it.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import os
import platform
import tempfile
import time
from pathlib import Path

import emmy
from emmy.gpu import program_library
from emmy.nvcc import build_cubin, nvcc_version
from emmy.tune import candidates

CODE = "x=torch.randn(4096,4096); w=torch.randn(4096); F.rms_norm(x,(4096,),w,eps=1e-6)"


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--candidates", type=int, default=8)
    parser.add_argument("--out", default=str(Path(__file__).resolve().parent / "COMPILE_THROUGHPUT.md"))
    args = parser.parse_args()
    program = emmy.optimize(CODE, target="sm_90")
    chosen = candidates(program, args.candidates)
    start = time.perf_counter()
    variants = [program.with_rows({c.kernel: c.row}) for c in chosen]
    sources = [v.cuda_source for v in variants]  # lowering and emission
    lowered = time.perf_counter() - start
    cores = os.cpu_count() or 1
    with tempfile.TemporaryDirectory() as work, concurrent.futures.ThreadPoolExecutor(cores) as pool:
        begin = time.perf_counter()
        list(pool.map(lambda v: program_library(v, Path(work)), variants))
        built = time.perf_counter() - begin
        begin = time.perf_counter()
        build_cubin(sources[0], "sm_90", cache_dir=Path(work) / "cubin")  # the device code alone, one nvcc call
        cubin = time.perf_counter() - begin
    rate = len(variants) / (lowered + built)
    lines = ["# Compile throughput for tuning", "",
             f"Command: `.venv/bin/python benchmarks/compile_throughput.py --candidates {args.candidates}` on "
             f"{cores} cores ({platform.processor() or platform.machine()}), {nvcc_version()}.", "",
             "| candidates | distinct sources | lowering + CUDA s | nvcc s (one library each, all cores) | "
             "candidates / s | target |", "|---|---|---|---|---|---|",
             f"| {len(variants)} | {len(set(sources))} | {lowered:.2f} | {built:.1f} | {rate:.2f} | 8 |", "",
             f"Each candidate is one nvcc call that builds device code and a host library (launchers, timers), "
             f"{built * cores / len(variants):.1f} core-seconds each; the device code alone (`nvcc -cubin` of the "
             f"same source) took {cubin:.1f} s. Batching many candidates into one translation unit, or NVRTC for "
             "the device code with a driver-API loader, is what would reach the target; neither is built yet."]
    Path(args.out).write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
