"""Build a kernel source into a shared object for the simulator, once per
content: the object is cached under the emmy cache directory, keyed on the
source, the mode, the flags, the compiler's version and the simulator headers."""

from __future__ import annotations

import functools
import hashlib
import logging
import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

import emmy.cuda_templates
from emmy.errors import KernelBuildError
from emmy.sim.source import simulator_source

log = logging.getLogger(__name__)

HEADERS = Path(emmy.cuda_templates.__path__[0])  # emmy_sim.h and emmy_rt.cuh
CUDA_HEADERS = HEADERS / "sim_include"  # <cuda_fp16.h>, <cuda_runtime.h>, ...: the simulator's stand-ins

MODES = ("plain", "asan", "racecheck")
# -g1: line tables, all that ASan reports and addr2line read (file:line), a third cheaper to build than -g
COMMON_FLAGS = ("-std=c++20", "-O1", "-g1", "-fPIC", "-fno-strict-aliasing", "-Wno-unknown-pragmas")
MODE_FLAGS = {
    "plain": (),
    # out-of-bounds accesses become ASan reports naming the kernel and line
    "asan": ("-fsanitize=address", "-fno-omit-frame-pointer", "-DEMMY_SIM_ASAN"),
    # every load and store calls emmy_sim.h's __tsan_* hooks (compiled with TSan, linked without its runtime)
    "racecheck": ("-fsanitize=thread", "-DEMMY_SIM_RACECHECK"),
}


@dataclass(frozen=True)
class Built:
    library: Path
    compiled: bool  # False when the cache had it


def build(source: str, filename: str, mode: str, cache_dir: Path) -> Built:
    if mode not in MODES:
        raise KernelBuildError(f"unknown simulator mode {mode!r}; modes are {', '.join(MODES)}")
    text = simulator_source(source, filename)
    library = cache_dir / "sim" / f"{_build_key(mode, text)[:24]}-{mode}.so"
    if library.exists():
        return Built(library, False)
    library.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=library.parent) as work:
        cu = Path(work) / "kernel.cpp"
        cu.write_text(text)
        obj, tmp = Path(work) / "kernel.o", Path(work) / "kernel.so"
        compile_flags = [*COMMON_FLAGS, *MODE_FLAGS[mode], "-I", str(HEADERS), "-I", str(CUDA_HEADERS)]
        runtime = _runtime(mode, cache_dir, compile_flags)
        if runtime.precompiled:
            compile_flags[:0] = ["-I", str(runtime.folder)]
        link_flags = ["-fsanitize=address"] if mode == "asan" else []  # racecheck links no TSan runtime
        _run(["g++", *compile_flags, "-c", str(cu), "-o", str(obj)], filename)
        _run(["g++", "-shared", *link_flags, str(obj), str(runtime.folder / RUNTIME_OBJECT), "-o", str(tmp), "-ldl"],
             filename)
        os.replace(tmp, library)  # atomic: a concurrent builder never sees half a library
    log.info("simulator: built %s (%s) -> %s", filename, mode, library.name)
    return Built(library, True)


@dataclass(frozen=True)
class Runtime:
    folder: Path  # holds RUNTIME_OBJECT, and emmy_sim.h precompiled beside a copy of it
    precompiled: bool  # False where g++ could not precompile the header: each build parses it


RUNTIME_OBJECT = "emmy_sim_runtime.o"


def _runtime(mode: str, cache_dir: Path, compile_flags: list[str]) -> Runtime:
    """The simulator's runtime (emmy_sim_runtime.cpp: the scheduler, fiber switch, race check),
    compiled for `mode` once per headers, flags and compiler and linked into every kernel's library,
    so that a kernel's build compiles its kernels only (the runtime was two thirds of each build);
    and emmy_sim.h precompiled beside it: g++ takes the .gch it finds in an include folder ahead of
    the header. Built aside and renamed, so concurrent builders agree."""
    folder = cache_dir / "sim" / f"runtime-{_build_key(mode)[:16]}-{mode}"
    if (folder / RUNTIME_OBJECT).exists():
        return Runtime(folder, (folder / "emmy_sim.h.gch").exists())
    work = Path(tempfile.mkdtemp(dir=cache_dir / "sim", prefix="runtime-build-"))  # build() made the folder
    try:
        _run(["g++", *compile_flags, "-c", str(HEADERS / "emmy_sim_runtime.cpp"), "-o", str(work / RUNTIME_OBJECT)],
             "emmy_sim_runtime.cpp")
        try:
            _run(["g++", *compile_flags, "-x", "c++-header", str(HEADERS / "emmy_sim.h"), "-o",
                  str(work / "emmy_sim.h.gch")], "emmy_sim.h")
            # the header beside it: g++ looks for a later include of it (a plain CUDA file's
            # <cuda_fp16.h> includes it again) where it found the .gch
            shutil.copy(HEADERS / "emmy_sim.h", work / "emmy_sim.h")
        except KernelBuildError as err:
            log.warning("simulator: emmy_sim.h could not be precompiled, each build parses it (%s)", err)
        os.rename(work, folder)
    except OSError:  # another builder renamed its folder first: theirs is as good
        pass
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return Runtime(folder, (folder / "emmy_sim.h.gch").exists())


def _build_key(mode: str, *texts: str) -> str:
    """What a build depends on besides its source text: the mode, the flags, g++'s version, the headers."""
    return hashlib.sha256("\0".join([*texts, mode, " ".join(COMMON_FLAGS + MODE_FLAGS[mode]), _compiler_version(),
                                     headers_digest()]).encode()).hexdigest()


def _run(command: list[str], filename: str) -> None:
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        errors = "\n".join(line for line in done.stderr.splitlines() if "error" in line)[:4000]
        raise KernelBuildError(f"g++ could not build {filename} for the simulator:\n{errors or done.stderr[:4000]}")


@functools.lru_cache(maxsize=1)
def _compiler_version() -> str:
    return subprocess.run(["g++", "--version"], capture_output=True, text=True).stdout.splitlines()[0]


@functools.lru_cache(maxsize=1)
def headers_digest() -> str:
    """The runtime and simulator headers' text (and the simulator runtime's source): part of every
    build cache's key (g++ and nvcc)."""
    digest = hashlib.sha256()
    for header in (sorted(HEADERS.glob("*.h")) + sorted(HEADERS.glob("*.cuh")) + sorted(HEADERS.glob("*.cpp")) +
                   sorted(CUDA_HEADERS.glob("*.h"))):
        digest.update(header.read_bytes())
    return digest.hexdigest()


@functools.lru_cache(maxsize=1)
def asan_runtime() -> str:
    """The ASan runtime g++ links against: preloaded into the worker that runs ASan builds."""
    return subprocess.run(["g++", "-print-file-name=libasan.so"], capture_output=True, text=True).stdout.strip()
