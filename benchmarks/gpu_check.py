"""The one script for a GPU session: every workload emmy lowers to CUDA, built by nvcc for the
GPU, run there with the example inputs, checked against torch (float64) and timed (CUDA events:
warm-up until ~10 ms, then batches of launches, per-launch median), with a few probe programs
beside them (PROBES); then the simulator's test kernels compared with the GPU bit for bit
(benchmarks/gpu_sim_compare.py).

    .venv/bin/python benchmarks/gpu_check.py [--arch 90] [--out benchmarks/GPU_REPORT.md]

Nothing is timed unless it was checked first. Exit status 1 on any mismatch.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path


sys.path.insert(0, str(Path(__file__).resolve().parent))
import gpu_sim_compare  # noqa: E402
from emmy.gpu import ProgramOnGpu  # noqa: E402

import emmy  # noqa: E402
from emmy.kernel_ir.lower import Unsupported, supports  # noqa: E402
from emmy.runtime import compare_outputs, host_buffers  # noqa: E402
from emmy.workloads import WORKLOADS  # noqa: E402


@dataclass(frozen=True)
class Probe:
    """A program beside the workloads whose prediction the GPU should check: few long rows (a
    grid-synced LayerNorm over (C, H, W)) and a middle-axis sum."""
    name: str
    code: str


PROBES = (
    Probe("layer_norm_chw_16x4M", "x=torch.randn(16,64,256,256); w=torch.randn(64,256,256); "
                                  "b=torch.randn(64,256,256); torch.nn.functional.layer_norm(x,(64,256,256),w,b)"),
    Probe("sum_dim1_16x1024x1023", "x=torch.randn(16,1024,1023); x.sum(dim=1)"),
)


def run_workload(workload, arch: str, work: Path) -> dict:
    program = emmy.optimize(workload.code, target=f"sm_{arch}")
    types = program.buffer_types
    why = next((supports(k, types) for k in program.tile_ir.kernels if supports(k, types)), "")
    try:
        if not why:
            program.kernel_ir  # noqa: B018 - a lowering may still refuse
    except Unsupported as refused:
        why = str(refused)
    if why:
        return {"name": workload.name, "skipped": why}
    host = host_buffers(program, program.example_inputs)
    on_gpu = ProgramOnGpu(program, host, work)
    on_gpu.run()  # the run that is checked
    checks = compare_outputs(program, on_gpu.outputs())
    worst, ok = max(c.max_abs for c in checks), all(c.ok for c in checks)
    times = {}
    if ok:  # only what was checked is timed
        for k, argv in zip(on_gpu.kernels, on_gpu.argvs):
            total, iters = 0.0, 16
            while total < 10.0:  # warm-up: at least 10 ms of GPU time
                total += on_gpu.gpu.time(k.name, k.grid, k.block, k.dynamic_smem, argv, iters)
                iters *= 2
            per_batch = max(16, int(iters * 1.0 / max(total, 1e-3)))  # about 1 ms batches
            times[k.name] = statistics.median(
                on_gpu.gpu.time(k.name, k.grid, k.block, k.dynamic_smem, argv, per_batch) * 1e3 / per_batch
                for _ in range(20))
    on_gpu.close()
    predicted = sum(t.seconds for t in program.tile_ir.kernels) * 1e6
    return {"name": workload.name, "kernels": len(on_gpu.kernels), "error": worst, "ok": ok, "times": times,
            "predicted": predicted}


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--arch", default="90")
    parser.add_argument("--out", default="benchmarks/GPU_REPORT.md")
    args = parser.parse_args()
    gpu_name = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True,
                              text=True).stdout.strip() or "unknown GPU"
    lines = ["# emmy on a GPU", "", f"Command: `.venv/bin/python benchmarks/gpu_check.py --arch {args.arch}` on "
             f"{gpu_name}.", "", "| workload | kernels | max abs err vs torch | result | measured us (per launch, "
             "summed) | predicted us | per kernel us |", "|---|---|---|---|---|---|---|"]
    failures = 0
    with tempfile.TemporaryDirectory() as work:
        for workload in (*WORKLOADS, *PROBES):
            r = run_workload(workload, args.arch, Path(work))
            if "skipped" in r:
                lines.append(f"| {r['name']} | - | - | not lowered: {r['skipped']} | - | - | - |")
                continue
            failures += not r["ok"]
            measured = sum(r["times"].values())
            lines.append(f"| {r['name']} | {r['kernels']} | {r['error']:.2e} | {'ok' if r['ok'] else 'MISMATCH'} | "
                         f"{measured:.2f} | {r['predicted']:.2f} | "
                         + ", ".join(f"{k} {t:.2f}" for k, t in r["times"].items()) + " |")
            print(lines[-1], flush=True)
    Path(args.out).write_text("\n".join(lines) + "\n")
    sys.argv = [sys.argv[0], "--arch", args.arch]  # then the simulator's kernels, GPU vs simulator
    failures += gpu_sim_compare.main()
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
