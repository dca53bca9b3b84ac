"""The one script for a GPU session: every workload emmy lowers to CUDA, built by nvcc for the
GPU, run there with the example inputs, checked against torch (float64) and timed (CUDA events:
warm-up until ~10 ms, then batches of launches, per-launch median); then the simulator's test
kernels compared with the GPU bit for bit (benchmarks/gpu_sim_compare.py).

    .venv/bin/python benchmarks/gpu_check.py [--arch 90] [--out benchmarks/GPU_REPORT.md]

Nothing is timed unless it was checked first. Exit status 1 on any mismatch.
"""

from __future__ import annotations

import argparse
import ctypes
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import gpu_sim_compare  # noqa: E402

import emmy  # noqa: E402
from emmy.checking import compare, reference_outputs  # noqa: E402
from emmy.kernel_ir.lower import Unsupported, supports  # noqa: E402
from emmy.runtime import from_device, host_buffers  # noqa: E402
from emmy.tile_ir.nodes import Fold  # noqa: E402
from emmy.workloads import WORKLOADS  # noqa: E402


def run_workload(workload, arch: str, work: Path) -> dict:
    program = emmy.optimize(workload.code, target=f"sm_{arch}")
    types = program.buffer_types
    why = next((supports(k, types) for k in program.tile_ir.kernels if supports(k, types)), "")
    try:
        kernels = [] if why else program.kernel_ir
    except Unsupported as refused:
        why = str(refused)
    if why:
        return {"name": workload.name, "skipped": why}
    source = work / f"{workload.name}.cu"
    source.write_text(program.cuda_source)
    gpu = gpu_sim_compare.Gpu(source, arch, work, fmad=True)
    lib, loops = gpu.lib, program.loop_ir
    host = host_buffers(program, program.example_inputs)
    device = {}
    for name, array in host.items():
        ptr = ctypes.c_void_p()
        gpu._check(lib.emmy_gpu_alloc(ctypes.byref(ptr), ctypes.c_size_t(max(1, array.nbytes))), "cudaMalloc")
        gpu._check(lib.emmy_gpu_put(ptr, array.ctypes.data_as(ctypes.c_void_p), ctypes.c_size_t(array.nbytes)), "in")
        device[name] = ptr
    dims = lambda v: (ctypes.c_uint * 3)(*v)  # noqa: E731
    argvs, maps = [], []
    for k in kernels:
        addresses = [ctypes.addressof(device[p.name]) for p in k.params]
        for buffer, row, box_rows, box_cols in k.tensor_maps:  # TMA descriptors follow the buffers
            itemsize = host[buffer].itemsize
            owner, view = gpu.tensor_map(device[buffer], (host[buffer].size // row, row), row * itemsize,
                                         (box_rows, box_cols), itemsize)
            maps.append(owner)
            addresses.append(view.ctypes.data)
        argvs.append((k, (ctypes.c_void_p * len(addresses))(*addresses)))
    for k, argv in argvs:  # the run that is checked
        gpu._check(getattr(lib, f"emmy_gpu_launch_{k.name}")(dims(k.grid), dims(k.block),
                                                               ctypes.c_ulong(k.dynamic_smem), argv), k.name)
    longest = max((p.extent for t in program.tile_ir.kernels for p in t.parts if isinstance(p, Fold)), default=1)
    expected = reference_outputs(program.captured)
    worst, ok = 0.0, True
    for name, want in zip(loops.outputs, expected):
        out = np.empty_like(host[name])
        gpu._check(lib.emmy_gpu_get(out.ctypes.data_as(ctypes.c_void_p), device[name], ctypes.c_size_t(out.nbytes)),
                   "out")
        c = compare(from_device(out, types[name].dtype).astype(np.float64).reshape(want.shape), want,
                    types[name].dtype, longest)
        worst, ok = max(worst, c.max_abs), ok and c.ok
    times = {}
    if ok:  # only what was checked is timed
        for k, argv in argvs:
            timer = getattr(lib, f"emmy_gpu_time_{k.name}")
            ms, total, iters = ctypes.c_float(), 0.0, 16
            while total < 10.0:  # warm-up: at least 10 ms of GPU time
                gpu._check(timer(dims(k.grid), dims(k.block), ctypes.c_ulong(k.dynamic_smem), argv, iters,
                                 ctypes.byref(ms)), k.name)
                total += ms.value
                iters *= 2
            per_batch = max(16, int(iters * 1.0 / max(total, 1e-3)))  # about 1 ms batches
            samples = []
            for _ in range(20):
                gpu._check(timer(dims(k.grid), dims(k.block), ctypes.c_ulong(k.dynamic_smem), argv, per_batch,
                                 ctypes.byref(ms)), k.name)
                samples.append(ms.value * 1e3 / per_batch)
            times[k.name] = statistics.median(samples)
    for ptr in device.values():
        lib.emmy_gpu_free(ptr)
    predicted = sum(t.seconds for t in program.tile_ir.kernels) * 1e6
    return {"name": workload.name, "kernels": len(kernels), "error": worst, "ok": ok, "times": times,
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
        for workload in WORKLOADS:
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
