"""A program's kernels from a cubin on the GPU, through the CUDA driver API: how the tuner measures
candidates. emmy.batch_build builds many candidates' device code in one nvcc call; one host library,
cuda_templates/module_loader.cu, built once and cached by content, loads any cubin and launches
its kernels (cuModuleLoad, cuLaunchKernel or cuLaunchCooperativeKernel), so a candidate costs its
share of a batched build instead of a host library of its own (5 core-seconds each here).

ModuleGpu answers what emmy.gpu.Gpu answers (uploads, copies, launches, timed samples), so
emmy.gpu.ProgramOnGpu and emmy.measure time either the same way.
"""

from __future__ import annotations

import ctypes
import hashlib
from pathlib import Path

from emmy.errors import GpuError, KernelBuildError
from emmy.gpu import Gpu, _dims, shared_library


def loader_library(work: Path | None = None) -> Path:
    """module_loader.cu built by nvcc into a shared library (host code only: one serves every GPU),
    unless one of the same text and nvcc is cached under `work` (default EMMY_CACHE_DIR/gpu)."""
    from emmy.nvcc import nvcc_version
    from emmy.sim.build import HEADERS, headers_digest

    text = (HEADERS / "module_loader.cu").read_text()
    flags = ["-shared", "-Xcompiler", "-fPIC", "-O3"]
    key = hashlib.sha256("\0".join([text, headers_digest(), " ".join(flags), nvcc_version()]).encode()).hexdigest()[:24]
    return shared_library(text, flags, work, f"module-loader-{key}.so", "the GPU module loader")


class ModuleGpu(Gpu):
    """The kernels of one built program (emmy.batch_build.BuiltProgram) loaded from its cubin;
    `program` (its Program) says which have grid barriers (launched cooperatively). A program that
    did not build is a KernelBuildError with nvcc's reason."""

    def __init__(self, built, program=None, work: Path | None = None):
        if built.cubin is None:
            raise KernelBuildError(f"the program did not build: {built.error}")
        self._load(loader_library(work))
        self.module = ctypes.c_void_p()
        self.check(self.lib.emmy_module_load(str(built.cubin).encode(), ctypes.byref(self.module)),
                   f"loading {built.cubin.name}")
        self.functions: dict[str, ctypes.c_void_p] = {}
        for name, inside in built.names.items():
            function = ctypes.c_void_p()
            self.check(self.lib.emmy_module_function(self.module, inside.encode(), ctypes.byref(function)),
                       f"finding kernel {inside} in {built.cubin.name}")
            self.functions[name] = function
        self.cooperative = frozenset(k.name for k in program.kernel_ir if k.cooperative) if program else frozenset()

    def _function(self, name: str) -> ctypes.c_void_p:
        if name not in self.functions:
            raise GpuError(f"kernel {name} is not in this cubin (it holds {', '.join(sorted(self.functions))})")
        return self.functions[name]

    def launch(self, name: str, grid, block, shared: int, argv) -> None:
        self.check(self.lib.emmy_module_launch(self._function(name), _dims(grid), _dims(block), ctypes.c_ulong(shared),
                                               argv, ctypes.c_int(name in self.cooperative)), f"launching {name}")

    def samples(self, name: str, grid, block, shared: int, argv, reps: int, batch: int = 1,
                flush: ctypes.c_void_p | None = None, flush_bytes: int = 0) -> list[float]:
        ms = (ctypes.c_float * reps)()
        self.check(self.lib.emmy_module_samples(
            self._function(name), _dims(grid), _dims(block), ctypes.c_ulong(shared), argv,
            ctypes.c_int(name in self.cooperative), ctypes.c_int(reps), ctypes.c_int(batch), flush,
            ctypes.c_size_t(flush_bytes), ms), f"timing {name}")
        return list(ms)

    def close(self) -> None:
        """The module unloaded (its kernels cannot be launched after)."""
        if self.module:
            self.lib.emmy_module_unload(self.module)
            self.module = ctypes.c_void_p()
