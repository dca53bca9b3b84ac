"""Measuring a compiled program's kernels on a device: its outputs checked first, then its kernels
timed. Used by `emmy tune` and benchmarks/gpu_session.py.

On a GPU (GpuDevice): outputs poisoned before the checked run; per kernel, CUDA-event samples of one
launch each with FLUSH_BYTES overwritten before it (a cold L2), taken in tens until the median
settles (at least 20, at most 200 or about 1.5 s), reported as median, p10 and p90; kernels under
SMALL_KERNEL_S also get the per-launch time of back-to-back batches (warm L2, launch gaps amortised).
On the CPU simulator (SimDevice): the same check, then each kernel's wall time over a few runs:
simulator seconds, recorded as such and never standing for a GPU's.
"""

from __future__ import annotations

import logging
import os
import shutil
import statistics
import subprocess
import time
from dataclasses import dataclass

from emmy.errors import GpuError, NoGpuError

log = logging.getLogger(__name__)

FLUSH_BYTES = 256 << 20  # over four times an H100/H200's L2
SMALL_KERNEL_S = 20e-6



@dataclass(frozen=True)
class KernelTime:
    name: str  # the Kernel IR kernel's
    median_s: float
    p10_s: float
    p90_s: float
    samples: int
    warm_s: float | None = None  # back-to-back batches (small kernels only)


@dataclass(frozen=True)
class Measured:
    """A program's check and, when it passed, its kernels' times."""
    correct: bool
    why: str  # the check's failure, a fault, a refusal
    times: tuple[KernelTime, ...] = ()


def stats(samples: list[float]) -> tuple[float, float, float]:
    """(median, p10, p90)."""
    ordered = sorted(samples)
    at = lambda q: ordered[min(len(ordered) - 1, int(q * len(ordered)))]  # noqa: E731
    return statistics.median(ordered), at(0.1), at(0.9)


def settled(take, most: int = 200, seconds: float = 1.5) -> list[float]:
    """Samples from `take(n)` in tens until the median of all is within 1% of the first half's."""
    samples, start = [], time.perf_counter()
    while len(samples) < most and time.perf_counter() - start < seconds:
        samples += take(10)
        if len(samples) >= 20:
            whole, half = statistics.median(samples), statistics.median(samples[:len(samples) // 2])
            if abs(whole - half) <= 0.01 * whole:
                break
    return samples


def gpu_name() -> str:
    """The first GPU's name as its driver gives it, or NoGpuError saying why there is none."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        raise NoGpuError("no CUDA GPU here (nvidia-smi is not on PATH): measuring needs a GPU machine")
    done = subprocess.run([smi, "--query-gpu=name,driver_version,compute_cap", "--format=csv,noheader"],
                          capture_output=True, text=True)
    line = done.stdout.strip().splitlines()[0] if done.returncode == 0 and done.stdout.strip() else ""
    if not line:
        raise NoGpuError(f"no CUDA GPU here (nvidia-smi: {(done.stderr or done.stdout).strip()[:200]}): measuring "
                         "needs a GPU machine")
    return line


class SimDevice:
    """The CPU simulator as the tuner's device: real checks, simulator seconds."""
    source = "simulator"

    def __init__(self, runs: int = 3):
        import platform

        self.runs = runs
        self.name, self.driver, self.capability = f"CPU simulator ({platform.machine()})", "", ""

    def prepare(self, programs) -> list:
        """Every program's simulator library built ahead into the cache, one g++ a core, so that a
        candidate's time under the tuner's watchdog is its checks and runs, as on a GPU, not a build.
        A build that fails is left for `measure` to meet again and record."""
        from concurrent.futures import ThreadPoolExecutor

        import emmy.sim as sim
        from emmy.errors import KernelBuildError

        def build(program) -> None:
            try:
                sim.load(program.cuda_source, "program.cu")
            except KernelBuildError:
                pass

        with ThreadPoolExecutor(max_workers=max(1, os.cpu_count() or 1)) as pool:
            list(pool.map(build, programs))
        return [None] * len(programs)

    def measure(self, program, inputs, references, built=None) -> Measured:
        import emmy.sim as sim
        from emmy.dtypes import from_device
        from emmy.runtime import compare_outputs, host_buffers, launch_in_order

        types = program.buffer_types
        buffers = host_buffers(program, inputs)
        module = sim.load(program.cuda_source, "program.cu")
        launch_in_order(module, program, program.kernel_ir, buffers)
        outputs = {n: from_device(buffers[n], types[n].dtype) for n in program.loop_ir.outputs}
        checks = compare_outputs(program, outputs, references=references)
        if not all(c.ok for c in checks):
            return Measured(False, "; ".join(f"{c.output}: {c.why}" for c in checks if not c.ok))
        per_kernel: dict[str, list[float]] = {}
        for _ in range(self.runs):
            timings: dict[str, float] = {}
            launch_in_order(module, program, program.kernel_ir, buffers, timings=timings)
            for name, seconds in timings.items():
                per_kernel.setdefault(name, []).append(seconds)
        return Measured(True, "", tuple(KernelTime(name, *stats(s), len(s)) for name, s in per_kernel.items()))


class GpuDevice:
    """The machine's GPU (CUDA_VISIBLE_DEVICES picks it). Candidates the tuner built ahead
    (`prepare`: batched cubins) load through the driver API (emmy.module_gpu); other programs, and
    every program once that loader has failed, get a host library of their own (emmy.gpu)."""
    source = "gpu"

    def __init__(self):
        fields = [f.strip() for f in gpu_name().split(",")]
        self.name, self.driver = fields[0], fields[1] if len(fields) > 1 else ""
        self.capability = fields[2] if len(fields) > 2 else ""
        self._flush = None
        self.loader_failed = ""  # why loading a batched cubin failed, once it has

    def prepare(self, programs) -> list:
        """Every program's device code built ahead, many to an nvcc call on every core
        (emmy.batch_build): one BuiltProgram each, for `measure`."""
        from emmy.batch_build import build_programs

        return build_programs([(p.cuda_source, [k.name for k in p.kernel_ir]) for p in programs],
                              programs[0].target.name if programs else "sm_90")

    def measure(self, program, inputs, references, built=None) -> Measured:
        """`built`: the program's BuiltProgram from `prepare` (its cubin, loaded through the driver
        API), else the program gets a host library of its own."""
        from emmy.gpu import ProgramOnGpu
        from emmy.module_gpu import ModuleGpu
        from emmy.runtime import compare_outputs, host_buffers

        loaded = None
        if built is not None and not self.loader_failed:
            try:
                loaded = ModuleGpu(built, program)
            except GpuError as err:  # the loader, not the candidate: every later one gets a host library
                self.loader_failed = str(err)
                log.warning("the cubin loader failed (%s); candidates get a host library of their own", err)
        on_gpu = ProgramOnGpu(program, host_buffers(program, inputs), gpu=loaded)
        try:
            on_gpu.poison()
            on_gpu.run()
            checks = compare_outputs(program, on_gpu.outputs(), references=references)
            if not all(c.ok for c in checks):
                return Measured(False, "; ".join(f"{c.output}: {c.why}" for c in checks if not c.ok))
            if self._flush is None:
                self._flush = on_gpu.gpu.alloc(FLUSH_BYTES)
            return Measured(True, "", tuple(time_on_gpu(on_gpu, i, self._flush) for i in range(len(on_gpu.kernels))))
        finally:
            on_gpu.close()
            if loaded is not None:
                loaded.close()


def time_on_gpu(on_gpu, index: int, flush) -> KernelTime:
    """One Kernel IR kernel of a ProgramOnGpu timed (module docstring)."""
    k, argv, gpu = on_gpu.kernels[index], on_gpu.argvs[index], on_gpu.gpu

    def take(reps, batch=1, cold=True):
        return [ms * 1e-3 for ms in gpu.samples(k.name, k.grid, k.block, k.dynamic_smem, argv, reps, batch,
                                                flush if cold else None, FLUSH_BYTES if cold else 0)]

    take(3)  # warm-up: module load, first touch
    cold = settled(take)
    median, p10, p90 = stats(cold)
    warm = None
    if median < SMALL_KERNEL_S:
        batch = max(1, int(200e-6 / max(median, 1e-7)))
        warm = statistics.median(take(20, batch, cold=False))
    return KernelTime(k.name, median, p10, p90, len(cold), warm)


def time_torch(fn, args, flush) -> tuple[float, float, float, int]:
    """A torch callable on the GPU timed like emmy's kernels: events around each call with `flush` (a
    FLUSH_BYTES torch tensor) zeroed before it, samples until the median settles. (median, p10, p90,
    samples) in seconds."""
    import torch

    def take(n):
        events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(n)]
        for begin, end in events:
            flush.zero_()
            begin.record()
            fn(*args)
            end.record()
        torch.cuda.synchronize()
        return [b.elapsed_time(e) * 1e-3 for b, e in events]

    with torch.no_grad():
        for _ in range(3):
            fn(*args)
        torch.cuda.synchronize()
        samples = settled(take)
    return (*stats(samples), len(samples))
