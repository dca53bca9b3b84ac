"""How fast the tuner's candidates are built for the GPU: RMSNorm-sized candidate rows, each lowered to
CUDA, then built as the tuner builds them (emmy.batch_build: many programs to an nvcc call, one call
a core, each program's kernels loaded later from the cubin through the driver API by one shared
loader library), from a cold cache.

    .venv/bin/python benchmarks/compile_throughput.py [--candidates 32] [--baseline 4]
        [--out benchmarks/COMPILE_THROUGHPUT.md]

The target (issue 18) is 8 candidates a second on a 2-core machine. `--baseline N` also builds N
candidates the way a program run on the GPU is built (emmy.gpu.program_library: nvcc builds device
code and a host library per program), for comparison.
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
from emmy.batch_build import BATCH, build_programs
from emmy.gpu import program_library
from emmy.module_gpu import loader_library
from emmy.nvcc import nvcc_version
from emmy.tune import candidates

CODE = "x=torch.randn(4096,4096); w=torch.randn(4096); F.rms_norm(x,(4096,),w,eps=1e-6)"


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--candidates", type=int, default=32)
    parser.add_argument("--baseline", type=int, default=0, help="also build this many one library each")
    parser.add_argument("--out", default=str(Path(__file__).resolve().parent / "COMPILE_THROUGHPUT.md"))
    args = parser.parse_args()
    program = emmy.optimize(CODE, target="sm_90")
    chosen = candidates(program, args.candidates)
    cores = os.cpu_count() or 1
    with tempfile.TemporaryDirectory() as work:
        start = time.perf_counter()
        variants = [program.with_rows({c.kernel: c.row}) for c in chosen]
        programs = [(v.cuda_source, [k.name for k in v.kernel_ir]) for v in variants]  # lowering and emission
        lowered = time.perf_counter() - start
        begin = time.perf_counter()
        built = build_programs(programs, "sm_90", cache_dir=Path(work))
        batched = time.perf_counter() - begin
        assert not any(b.error for b in built), [b.error for b in built if b.error]
        units = len({b.cubin for b in built})
        begin = time.perf_counter()
        build_programs(programs, "sm_90", cache_dir=Path(work))
        again = time.perf_counter() - begin
        begin = time.perf_counter()
        loader_library(Path(work) / "gpu")
        loader = time.perf_counter() - begin
        baseline = None
        if args.baseline:
            with concurrent.futures.ThreadPoolExecutor(cores) as pool:
                begin = time.perf_counter()
                list(pool.map(lambda v: program_library(v, Path(work) / "libraries"), variants[:args.baseline]))
                baseline = (args.baseline, time.perf_counter() - begin)
    rate = len(variants) / (lowered + batched)
    lines = ["# Compile throughput for tuning", "",
             f"Command: `.venv/bin/python benchmarks/compile_throughput.py --candidates {args.candidates}"
             f"{f' --baseline {args.baseline}' if args.baseline else ''}` on {cores} cores "
             f"({platform.processor() or platform.machine()}), {nvcc_version()}, cold cache.", "",
             "| candidates | distinct sources | lowering + CUDA s | nvcc units (at most "
             f"{BATCH} programs each) | nvcc s (all cores) | candidates / s | target |",
             "|---|---|---|---|---|---|---|",
             f"| {len(variants)} | {len(set(p for p, _ in programs))} | {lowered:.2f} | {units} | {batched:.2f} | "
             f"**{rate:.1f}** | 8 |", "",
             f"The same candidates again (cached by content): {again * 1e3:.0f} ms. The loader every candidate's "
             f"cubin is launched through (cuda_templates/module_loader.cu, built once a machine and cached): "
             f"{loader:.1f} s."]
    if baseline:
        count, seconds = baseline
        lines += ["", f"Baseline, one nvcc call a candidate building its device code and a host library "
                      f"(emmy.gpu.program_library, what a program run on the GPU gets): {count} candidates in "
                      f"{seconds:.1f} s on all cores, {count / seconds:.2f} candidates / s."]
    Path(args.out).write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
