"""Kernels on a real GPU from Python: a CUDA source built by nvcc into a shared library with a
host launcher and a timer per kernel (plus allocation, copies and TMA descriptors), driven
through ctypes. `emmy run --device cuda` and benchmarks/gpu_session.py use it; on a machine
without a GPU or driver the first call fails with the CUDA runtime's own reason (GpuError).

The library is cached by content under EMMY_CACHE_DIR/gpu (source, arch, flags, nvcc and the
runtime headers).
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import numpy as np

from emmy.errors import GpuError, KernelBuildError


def host_library_source(source: Path, names: list[str], cooperative: tuple[str, ...] = ()) -> str:
    """The host side of a CUDA source: it includes the source and adds allocation, copies, TMA
    descriptors and a launcher and a timer per kernel (cuda_templates/host_library.cu.j2); the
    kernels named in `cooperative` (grid barriers) launch cooperatively."""
    import jinja2

    import emmy.cuda_templates

    folder = Path(emmy.cuda_templates.__path__[0])
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(str(folder)), undefined=jinja2.StrictUndefined,
                             keep_trailing_newline=True, autoescape=False)
    return env.get_template("host_library.cu.j2").render(source=source, names=names, cooperative=set(cooperative))


def build_library(source: Path, names: list[str], arch: str, work: Path | None = None, fmad: bool = True,
                  cooperative: tuple[str, ...] = ()) -> Path:
    """The shared library of a CUDA source and its host side, built by nvcc for sm_`arch` unless one
    with the same content is cached (so many can be built at once, in threads, before any is loaded)."""
    from emmy.sim.build import headers_digest

    text = host_library_source(source.resolve(), names, cooperative)
    flags = ["-shared", "-Xcompiler", "-fPIC", "-O3", f"-fmad={'true' if fmad else 'false'}", f"-arch=sm_{arch}"]
    key = hashlib.sha256("\0".join([" ".join(names), source.read_text(), " ".join(flags), headers_digest(),
                                    text]).encode())
    return shared_library(text, flags, work, f"{key.hexdigest()[:24]}-sm_{arch}.so", "the GPU library for sm_" + arch)


def shared_library(text: str, flags: list[str], work: Path | None, name: str, what: str) -> Path:
    """`text` (CUDA C++) built by nvcc with `flags` into `name` under `work` (default
    EMMY_CACHE_DIR/gpu), unless that file exists: `name` carries the caller's content key. Written
    whole or not at all, so threads may build at once."""
    from emmy.config import settings
    from emmy.sim.build import HEADERS

    folder = work or settings().cache_dir / "gpu"
    library = folder / name
    if library.exists():
        return library
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        raise KernelBuildError(f"nvcc is not on PATH; it is needed to build {what}")
    folder.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=folder) as tmp:
        source = Path(tmp) / "library.cu"
        source.write_text(text)
        done = subprocess.run([nvcc, *flags, "-I", str(HEADERS), str(source), "-o", str(Path(tmp) / "lib.so")],
                              capture_output=True, text=True)
        if done.returncode != 0:
            raise KernelBuildError(f"nvcc could not build {what}:\n{done.stderr[:4000]}")
        os.replace(Path(tmp) / "lib.so", library)
    return library


class Gpu:
    """A CUDA source built by nvcc into a library with a host launcher (and timer) per kernel."""

    def __init__(self, source: Path, names: list[str], arch: str, work: Path | None = None, fmad: bool = True,
                 cooperative: tuple[str, ...] = ()):
        self._load(build_library(source, names, arch, work, fmad, cooperative))

    @classmethod
    def of_library(cls, library: Path) -> Gpu:
        """A library build_library already made."""
        gpu = cls.__new__(cls)
        gpu._load(library)
        return gpu

    def _load(self, library: Path) -> None:
        self.lib = ctypes.CDLL(str(library))
        self.lib.emmy_gpu_error.restype = ctypes.c_char_p

    def check(self, rc: int, what: str) -> None:
        if rc:
            reason = self.lib.emmy_gpu_error(rc).decode() if rc > 0 else "the driver has no cuTensorMapEncodeTiled"
            raise GpuError(f"{what}: CUDA error {rc} ({reason})")

    def arch(self) -> str:
        major, minor = ctypes.c_int(), ctypes.c_int()
        self.check(self.lib.emmy_gpu_arch(ctypes.byref(major), ctypes.byref(minor)), "finding the GPU")
        return f"sm_{major.value}{minor.value}"

    def upload(self, array: np.ndarray) -> ctypes.c_void_p:
        ptr = ctypes.c_void_p()
        self.check(self.lib.emmy_gpu_alloc(ctypes.byref(ptr), ctypes.c_size_t(max(1, array.nbytes))), "cudaMalloc")
        self.check(self.lib.emmy_gpu_put(ptr, array.ctypes.data_as(ctypes.c_void_p), ctypes.c_size_t(array.nbytes)),
                   "copy to the GPU")
        return ptr

    def download(self, ptr: ctypes.c_void_p, into: np.ndarray) -> None:
        self.check(self.lib.emmy_gpu_get(into.ctypes.data_as(ctypes.c_void_p), ptr, ctypes.c_size_t(into.nbytes)),
                   "copy from the GPU")

    def alloc(self, nbytes: int) -> ctypes.c_void_p:
        ptr = ctypes.c_void_p()
        self.check(self.lib.emmy_gpu_alloc(ctypes.byref(ptr), ctypes.c_size_t(max(1, nbytes))), "cudaMalloc")
        return ptr

    def fill(self, ptr: ctypes.c_void_p, byte: int, nbytes: int) -> None:
        """Every byte of a device buffer set to `byte` (outputs poisoned before a checked run)."""
        self.check(self.lib.emmy_gpu_fill(ptr, ctypes.c_int(byte), ctypes.c_size_t(nbytes)), "cudaMemset")

    def free(self, ptr: ctypes.c_void_p) -> None:
        self.lib.emmy_gpu_free(ptr)

    def tensor_map(self, device_ptr, shape, row_bytes, box, element_bytes):
        """(owner, 128-byte view at a 64-byte boundary): the driver's CUtensorMap of a 2-D device array."""
        buffer = np.zeros(192, np.uint8)
        view = buffer[(-buffer.ctypes.data) % 64:][:128]
        rows, cols = shape
        self.check(self.lib.emmy_gpu_tensormap(
            view.ctypes.data_as(ctypes.c_void_p), device_ptr, ctypes.c_ulong(rows), ctypes.c_ulong(cols),
            ctypes.c_ulong(row_bytes), ctypes.c_uint(box[0]), ctypes.c_uint(box[1]), ctypes.c_uint(element_bytes)),
            "cuTensorMapEncodeTiled")
        return buffer, view

    def launch(self, name: str, grid, block, shared: int, argv) -> None:
        self.check(getattr(self.lib, f"emmy_gpu_launch_{name}")(_dims(grid), _dims(block), ctypes.c_ulong(shared),
                                                                 argv), f"launching {name}")

    def time(self, name: str, grid, block, shared: int, argv, iters: int) -> float:
        """Milliseconds for `iters` back-to-back launches."""
        ms = ctypes.c_float()
        self.check(getattr(self.lib, f"emmy_gpu_time_{name}")(_dims(grid), _dims(block), ctypes.c_ulong(shared), argv,
                                                               iters, ctypes.byref(ms)), f"timing {name}")
        return ms.value

    def samples(self, name: str, grid, block, shared: int, argv, reps: int, batch: int = 1,
                flush: ctypes.c_void_p | None = None, flush_bytes: int = 0) -> list[float]:
        """Milliseconds per launch of `reps` samples, each `batch` back-to-back launches timed by
        CUDA events, with `flush_bytes` at `flush` overwritten before each sample (a cold L2)."""
        ms = (ctypes.c_float * reps)()
        self.check(getattr(self.lib, f"emmy_gpu_samples_{name}")(
            _dims(grid), _dims(block), ctypes.c_ulong(shared), argv, ctypes.c_int(reps), ctypes.c_int(batch),
            flush, ctypes.c_size_t(flush_bytes), ms), f"timing {name}")
        return list(ms)


def _dims(v) -> ctypes.Array:
    values = ((v,) if isinstance(v, int) else tuple(v)) + (1, 1)
    return (ctypes.c_uint * 3)(*values[:3])


def program_library(program, work: Path) -> Path:
    """A compiled program's GPU library, built (or found in `work`) from its CUDA source, kept at a
    path named by its content so a library built ahead (in another thread) is found again."""
    plan = program.plan
    source = work / f"{hashlib.sha256(plan.cuda_source.encode()).hexdigest()[:20]}.cu"
    if not source.exists():
        work.mkdir(parents=True, exist_ok=True)
        source.write_text(plan.cuda_source)
    return build_library(source, [k.name for k in plan.kernels], plan.target.removeprefix("sm_"), work,
                         cooperative=tuple(k.name for k in plan.kernels if k.cooperative))


def _argv(gpu: Gpu, kernel, pointers: dict, itemsizes: dict, sizes: dict, keep: list):
    """A kernel's argument vector: the address of each buffer's device pointer, then of each TMA
    descriptor (kept alive in `keep`)."""
    addresses = [ctypes.addressof(pointers[p.name]) for p in kernel.params]
    for buffer, row, box_rows, box_cols in kernel.tensor_maps:
        itemsize = itemsizes[buffer]
        owner, view = gpu.tensor_map(pointers[buffer], (sizes[buffer] // row, row), row * itemsize,
                                     (box_rows, box_cols), itemsize)
        keep.append(owner)
        addresses.append(view.ctypes.data)
    return (ctypes.c_void_p * max(1, len(addresses)))(*addresses)


class ProgramOnGpu:
    """A compiled program's kernels on the GPU: its buffers uploaded, an argument vector per kernel
    (buffers, then TMA descriptors), launched in order. `program`: a Program or a loaded one;
    `library`: its GPU library when already built (a loaded program carries one); `gpu`: its
    kernels already loaded otherwise (emmy.module_gpu.ModuleGpu: a cubin through the driver API)."""

    def __init__(self, program, buffers: dict[str, np.ndarray], work: Path | None = None,
                 library: Path | None = None, gpu: Gpu | None = None):
        self.plan, self.host = program.plan, buffers
        self.kernels = self.plan.kernels
        self._folder = tempfile.TemporaryDirectory()
        self.gpu = gpu or Gpu.of_library(library or program_library(program, work or Path(self._folder.name)))
        self.device = {name: self.gpu.upload(array) for name, array in buffers.items()}
        self._keep: list = []
        itemsizes = {name: a.itemsize for name, a in buffers.items()}
        sizes = {name: a.size for name, a in buffers.items()}
        self.argvs = [_argv(self.gpu, k, self.device, itemsizes, sizes, self._keep) for k in self.kernels]

    def poison(self, byte: int = 0xFF) -> None:
        """Every output of the program's kernels overwritten (0xFF bytes: NaN in every float type), so
        an element no kernel writes cannot pass the check."""
        for name, _ in self.plan.kernel_outputs:
            self.gpu.fill(self.device[name], byte, self.host[name].nbytes)

    def run(self) -> None:
        """Every kernel in order; a bad index value a kernel recorded is raised after its launch."""
        from emmy.kernel_ir.index_faults import INDEX_FAULTS, raise_recorded_fault, takes_faults

        for k, argv in zip(self.kernels, self.argvs):
            self.gpu.launch(k.name, k.grid, k.block, k.dynamic_smem, argv)
            if takes_faults(k):
                raise_recorded_fault(self.fetch(INDEX_FAULTS), k, self.plan)

    def fetch(self, name: str) -> np.ndarray:
        out = np.empty_like(self.host[name])
        self.gpu.download(self.device[name], out)
        return out

    def outputs(self) -> dict[str, np.ndarray]:
        """The program's outputs by name, in interpreter storage (bf16 as float32)."""
        return self.plan.named_outputs(self.fetch)

    def close(self) -> None:
        for ptr in self.device.values():
            self.gpu.free(ptr)
        self._folder.cleanup()


def run_on_torch_cuda(program, library: Path, inputs: list, weights: dict) -> list:
    """The program run on CUDA torch tensors without a copy through the host: inputs are read in
    place, outputs and intermediates are fresh torch tensors on the inputs' GPU, `weights` (name ->
    torch tensor on that GPU) are uploaded once by the caller. Kernels launch on the legacy default
    stream, so the caller's current stream is synchronized first. Returns the output tensors in the
    program's order."""
    import torch

    from emmy.dtypes import to_torch
    from emmy.kernel_ir.index_faults import INDEX_FAULTS, raise_recorded_fault, takes_faults

    plan = program.plan
    device = inputs[0].device
    gpu = _loaded(library)
    gpu.check(gpu.lib.emmy_gpu_set_device(ctypes.c_int(device.index or 0)), f"selecting {device}")
    tensors = {name: x.contiguous() for name, x in zip(plan.input_names, inputs)}
    tensors |= weights
    tensors |= {name: torch.zeros(t.shape, dtype=to_torch(t.dtype), device=device)
                for name, t in plan.kernel_outputs}
    tensors |= {name: torch.zeros(count, dtype=torch.from_numpy(np.zeros(0, dtype)).dtype, device=device)
                for name, (count, dtype) in plan.scratch.items()}
    pointers = {name: ctypes.c_void_p(t.data_ptr()) for name, t in tensors.items()}
    itemsizes = {name: t.element_size() for name, t in tensors.items()}
    sizes = {name: t.numel() for name, t in tensors.items()}
    torch.cuda.current_stream(device).synchronize()
    keep: list = []
    for kernel in plan.kernels:
        gpu.launch(kernel.name, kernel.grid, kernel.block, kernel.dynamic_smem,
                   _argv(gpu, kernel, pointers, itemsizes, sizes, keep))
        if takes_faults(kernel):
            raise_recorded_fault(tensors[INDEX_FAULTS].cpu().numpy(), kernel, plan)
    torch.cuda.synchronize(device)
    outputs, seen = [], set()
    for buffer in plan.outputs:  # a buffer returned twice, or an input returned, is a fresh tensor
        tensor = tensors[buffer]
        fresh = buffer in seen or buffer in plan.input_names
        outputs.append(tensor.clone() if fresh else tensor)
        seen.add(buffer)
    return outputs


_LOADED: dict = {}


def _loaded(library: Path) -> Gpu:
    """One ctypes handle per library file (loading one is not free, and a handle is never unloaded)."""
    key = str(library)
    if key not in _LOADED:
        _LOADED[key] = Gpu.of_library(library)
    return _LOADED[key]
