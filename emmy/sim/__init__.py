"""The CPU simulator: CUDA kernel sources compiled by g++ against
cuda_templates/emmy_sim.h and run on numpy arrays.

    module = emmy.sim.load(source, "vector_add.cu")          # built once per content
    module.launch("vector_add", grid=4, block=256, args=[a, b, c, n])

Arrays are passed by pointer and updated in place; `launch` returns them.
Modes: "plain", "asan" (out-of-bounds accesses are faults naming the line)
and "racecheck" (shared-memory races are faults naming both accesses; `count` also says
how many bytes a launch read and wrote in each array).
Deadlocks at barriers and warp collectives are faults in every mode.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from emmy.sim.build import MODES, asan_runtime, build
from emmy.sim.runner import TensorMap
from emmy.sim.source import KernelSignature, kernels_of

__all__ = ["MODES", "SimModule", "TensorMap", "load"]


@dataclass(frozen=True)
class SimModule:
    filename: str
    mode: str
    kernels: dict[str, KernelSignature]
    library: Path
    compiled: bool  # whether this load ran g++ (False: the cache had it)

    def launch(self, kernel: str, grid, block, args, shared_bytes: int = 0) -> list:
        from emmy.errors import EmmyError
        from emmy.sim.runner import pack_arguments, run_in_process, run_in_worker

        if kernel not in self.kernels:
            raise EmmyError(f"{self.filename} has no kernel {kernel!r}; kernels: {', '.join(self.kernels)}")
        signature = self.kernels[kernel]
        if self.mode == "asan":
            run_in_worker(self.library, signature, grid, block, args, shared_bytes, self.filename, asan_runtime())
        else:
            run_in_process(self.library, signature, grid, block, args, shared_bytes, self.filename,
                           racecheck=self.mode == "racecheck")
        return pack_arguments(signature, args)[1]

    def count(self, kernel: str, grid, block, args, shared_bytes: int = 0) -> list[tuple[int, int]]:
        """Launch, and return the bytes the launch's threads read and wrote in each array argument (in
        argument order), counted access by access before any cache. Race-check builds only: theirs
        is the build whose every load and store is instrumented."""
        from emmy.errors import EmmyError
        from emmy.sim.runner import run_in_process

        if self.mode != "racecheck":
            raise EmmyError(f"counting accesses needs a racecheck build; {self.filename} is a {self.mode} build")
        if kernel not in self.kernels:
            raise EmmyError(f"{self.filename} has no kernel {kernel!r}; kernels: {', '.join(self.kernels)}")
        return run_in_process(self.library, self.kernels[kernel], grid, block, args, shared_bytes, self.filename,
                              racecheck=True)


def load(source: str, filename: str = "<source>", mode: str = "plain", cache_dir: Path | None = None) -> SimModule:
    """Build (or find in the cache) `source` for the simulator."""
    from emmy.config import settings

    built = build(source, filename, mode, cache_dir or settings().cache_dir)
    return SimModule(filename, mode, kernels_of(source, filename), built.library, built.compiled)
