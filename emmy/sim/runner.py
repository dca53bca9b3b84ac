"""Run a simulator build's kernel on numpy arrays through ctypes.

Plain and race-check builds run in this process. An ASan build needs the ASan
runtime loaded first, so it runs in a worker process (emmy.sim.worker) with
the runtime preloaded, kept across launches; arrays travel both ways by pickle
and the caller's arrays are updated in place, as in-process launches do.
"""

from __future__ import annotations

import atexit
import ctypes
import functools
import os
import pickle
import re
import subprocess
import sys
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from emmy.errors import EmmyError, KernelFault
from emmy.sim.source import KernelSignature


@functools.lru_cache(maxsize=64)
def library(path: str) -> ctypes.CDLL:
    lib = ctypes.CDLL(path)
    lib.emmy_sim_error.restype = ctypes.c_char_p
    return lib


def pack_arguments(signature: KernelSignature, args) -> tuple[list, list[np.ndarray]]:
    """Storage for each argument's value, in the parameter's C type; and the arrays passed."""
    if len(args) != len(signature.params):
        raise EmmyError(f"kernel {signature.name} takes {len(signature.params)} arguments "
                        f"({', '.join(p.name for p in signature.params)}), got {len(args)}")
    storage, arrays = [], []
    for param, value in zip(signature.params, args):
        if param.kind == "pointer":
            if not isinstance(value, np.ndarray) or not value.flags.c_contiguous:
                raise EmmyError(f"kernel {signature.name}: argument {param.name} must be a C-contiguous numpy "
                                f"array, got {type(value).__name__}")
            storage.append(ctypes.c_void_p(value.ctypes.data))
            arrays.append(value)
        elif param.kind == "tensormap":
            if not isinstance(value, TensorMap):
                raise EmmyError(f"kernel {signature.name}: argument {param.name} is a CUtensorMap; pass "
                                f"emmy.sim.TensorMap(array, box=(rows, cols)), got {type(value).__name__}")
            storage.append(value.encode())
            arrays.append(value.array)
        else:
            if isinstance(value, np.ndarray) or not np.isscalar(value):
                raise EmmyError(f"kernel {signature.name}: argument {param.name} is a scalar "
                                f"({np.dtype(param.kind)}), got {type(value).__name__}")
            storage.append(np.array([value], dtype=param.kind))
    return storage, arrays


@dataclass(frozen=True)
class TensorMap:
    """A 2-D TMA descriptor over a row-major array: what cuTensorMapEncodeTiled would be given (the
    array, its extents and row stride, the box), in the simulator's 128-byte CUtensorMap layout
    (cuda_templates/emmy_rt.cuh)."""
    array: np.ndarray
    box: tuple[int, int]  # (rows, cols) copied per load

    def __post_init__(self):
        if self.array.ndim != 2 or not self.array.flags.c_contiguous:
            raise EmmyError("a TensorMap needs a C-contiguous 2-D array")
        rows, cols = self.box
        if not (1 <= rows <= 256 and 1 <= cols <= 256) or (cols * self.array.itemsize) % 16:
            raise EmmyError(f"TMA box {self.box}: 1 to 256 per dimension, rows of a multiple of 16 bytes")
        # the driver's rule (cuTensorMapEncodeTiled answers "invalid argument" on an H200 otherwise)
        if self.array.strides[0] % 16 or self.array.ctypes.data % 16:
            raise EmmyError(f"TMA over rows of {self.array.strides[0]} bytes at address {self.array.ctypes.data:#x}: the "
                            "row stride and the base address must be multiples of 16 bytes")

    def encode(self) -> np.ndarray:
        """128 bytes at a 64-byte-aligned address (a view into a larger buffer)."""
        buffer = np.zeros(128 + 64, np.uint8)
        start = (-buffer.ctypes.data) % 64
        view = buffer[start:start + 128]
        rows, cols = self.array.shape
        header = np.array([self.array.ctypes.data, rows, cols, self.array.strides[0]], np.uint64)
        view[:32] = header.view(np.uint8)
        view[32:48] = np.array([self.box[0], self.box[1], self.array.itemsize, 0], np.uint32).view(np.uint8)
        return view


def _argv(storage) -> ctypes.Array:
    addresses = [ctypes.addressof(s) if isinstance(s, ctypes.c_void_p) else s.ctypes.data for s in storage]
    return (ctypes.c_void_p * max(1, len(addresses)))(*addresses)


def _dim3(value, what: str) -> ctypes.Array:
    dims = (value,) if isinstance(value, int) else tuple(value)
    if not 1 <= len(dims) <= 3 or any(not isinstance(d, (int, np.integer)) or d < 1 for d in dims):
        raise EmmyError(f"{what} must be 1 to 3 positive integers, got {value!r}")
    dims = dims + (1,) * (3 - len(dims))
    return (ctypes.c_uint * 3)(*dims)


def run_in_process(lib_path: Path, signature: KernelSignature, grid, block, args, shared_bytes: int,
                   filename: str, racecheck: bool) -> list[tuple[int, int]]:
    """Launch; in a race-check build, also the bytes the launch read and wrote in each array argument
    (every access is instrumented there), in argument order. [] otherwise."""
    lib = library(str(lib_path))
    storage, arrays = pack_arguments(signature, args)
    launch = getattr(lib, f"emmy_sim_launch_{signature.name}")
    launch.restype = ctypes.c_int
    if racecheck:
        lib.emmy_sim_race_reset()
        bases = (ctypes.c_void_p * max(1, len(arrays)))(*[a.ctypes.data for a in arrays])
        sizes = (ctypes.c_ulong * max(1, len(arrays)))(*[a.nbytes for a in arrays])
        lib.emmy_sim_count_reset(bases, sizes, len(arrays))
    rc = launch(_dim3(grid, "grid"), _dim3(block, "block"), ctypes.c_ulong(shared_bytes), _argv(storage))
    if rc != 0:
        raise KernelFault(f"kernel {signature.name} ({filename}): {lib.emmy_sim_error().decode()}")
    if not racecheck:
        return []
    _check_race(lib, lib_path, signature, filename, arrays)
    read = (ctypes.c_ulonglong * max(1, len(arrays)))()
    written = (ctypes.c_ulonglong * max(1, len(arrays)))()
    lib.emmy_sim_counts(read, written)
    return [(read[i], written[i]) for i in range(len(arrays))]


def _check_race(lib, lib_path: Path, signature: KernelSignature, filename: str, arrays) -> None:
    pcs = (ctypes.c_void_p * 2)()
    threads = (ctypes.c_uint * 2)()
    wrote = (ctypes.c_int * 2)()
    block = (ctypes.c_uint * 3)()
    address = ctypes.c_size_t()
    if not lib.emmy_sim_race(pcs, threads, wrote, block, ctypes.byref(address)):
        return
    lib.emmy_sim_module_offset.restype = ctypes.c_ulong
    lines = [_short(_source_line(lib_path, lib.emmy_sim_module_offset(ctypes.c_void_p(pc))), filename) for pc in pcs]
    first, second = (f"thread {threads[i]} {'writes' if wrote[i] else 'reads'} at {lines[i]}" for i in range(2))
    # kernel arguments are global memory; anything else not on a thread's stack is shared memory
    memory = next((f"global memory ({p.name}[{(address.value - a.ctypes.data) // a.itemsize}])"
                   for p, a in zip((p for p in signature.params if p.kind == "pointer"), arrays)
                   if a.ctypes.data <= address.value < a.ctypes.data + a.nbytes), "shared memory")
    raise KernelFault(f"kernel {signature.name} ({filename}): race on {memory} in block "
                      f"({block[0]},{block[1]},{block[2]}): {first}, then {second}, with no barrier between")


def _short(where: str, filename: str) -> str:
    """`/cwd/kernel.cu:14` -> `kernel.cu:14` for the file being run (its #line name has no directory)."""
    return re.sub(r"\S*/" + re.escape(os.path.basename(filename)) + ":", os.path.basename(filename) + ":", where)


def _source_line(lib_path: Path, offset: int) -> str:
    done = subprocess.run(["addr2line", "-C", "-f", "-e", str(lib_path), hex(max(0, offset - 1))],
                          capture_output=True, text=True)
    parts = done.stdout.split("\n")
    where = parts[1].strip() if len(parts) > 1 else "?"
    return re.sub(r" \(discriminator \d+\)", "", where)


def read_message(stream):
    """One length-prefixed pickle from `stream`; None at its end."""
    header = stream.read(8)
    if len(header) < 8:
        return None
    size = int.from_bytes(header, "little")
    payload = stream.read(size)
    return pickle.loads(payload) if len(payload) == size else None


def write_message(stream, message) -> None:
    data = pickle.dumps(message)
    stream.write(len(data).to_bytes(8, "little") + data)
    stream.flush()


class AsanWorker:
    """A process with the ASan runtime preloaded that runs launches of ASan builds, kept for the
    next launch (starting Python for each cost about 0.2 s a launch); one that faulted is replaced."""

    def __init__(self, asan_runtime: str):
        env = dict(os.environ, LD_PRELOAD=asan_runtime,
                   ASAN_OPTIONS="detect_leaks=0:halt_on_error=1:exitcode=23:print_summary=1")
        self.stderr = tempfile.TemporaryFile()
        self.process = subprocess.Popen([sys.executable, "-m", "emmy.sim.worker"], stdin=subprocess.PIPE,
                                        stdout=subprocess.PIPE, stderr=self.stderr, env=env)

    def alive(self) -> bool:
        return self.process.poll() is None

    def run(self, request):
        """The worker's reply, or None when it died (its stderr says why)."""
        try:
            write_message(self.process.stdin, request)
            return read_message(self.process.stdout)
        except (BrokenPipeError, OSError):
            return None

    def report(self) -> tuple[int, str]:
        """After a death: exit status and stderr."""
        code = self.process.wait()
        self.stderr.seek(0)
        return code, self.stderr.read().decode(errors="replace")

    def close(self) -> None:
        if self.alive():
            self.process.stdin.close()
            self.process.wait()
        self.stderr.close()


_workers: dict[str, AsanWorker] = {}
_workers_lock = threading.Lock()


def run_in_worker(lib_path: Path, signature: KernelSignature, grid, block, args, shared_bytes: int,
                  filename: str, asan_runtime: str) -> None:
    _, arrays = pack_arguments(signature, args)  # checks the arguments here, where errors are clearest
    request = (str(lib_path), signature, grid, block, list(args), shared_bytes, filename)
    with _workers_lock:
        worker = _workers.get(asan_runtime)
        if worker is None or not worker.alive():
            worker = _workers[asan_runtime] = AsanWorker(asan_runtime)
        reply = worker.run(request)
        if reply is None:  # it died: an ASan report, or a crash
            del _workers[asan_runtime]
            code, report = worker.report()
            worker.close()
    if reply is None:
        if code == 23 or "AddressSanitizer" in report:
            raise KernelFault(f"kernel {signature.name} ({filename}): {_short(asan_summary(report), filename)}")
        raise KernelFault(f"kernel {signature.name} ({filename}): the ASan worker failed (exit {code}):\n"
                          + report[-3000:])
    status, payload = reply
    if status == "fault":
        raise KernelFault(payload)
    if status == "error":
        raise EmmyError(payload)
    for mine, theirs in zip(arrays, payload):
        mine[...] = theirs


@atexit.register
def _close_workers() -> None:
    for worker in list(_workers.values()):
        worker.close()
    _workers.clear()


def asan_summary(report: str) -> str:
    """ASan's report as one line: what, read or write of how many bytes, where (function, file:line)."""
    kind = re.search(r"ERROR: AddressSanitizer: ([\w-]+)", report)
    access = re.search(r"(READ|WRITE) of size (\d+)", report)
    frame = re.search(r"#0 0x[0-9a-f]+ in (.+?) (\S+:\d+)", report)
    if not (kind and frame):
        return "AddressSanitizer: " + report[-2000:]
    what = f"{access.group(1).lower()} of {access.group(2)} bytes" if access else "access"
    return f"out-of-bounds {what} ({kind.group(1)}) in {frame.group(1)} at {frame.group(2)}"
