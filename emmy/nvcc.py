"""nvcc: CUDA source -> cubin for a target, cached by content, with each kernel's resources
(registers, shared memory, stack, spills from `ptxas -v`) and, through cuobjdump, its SASS
instruction mix. Every kernel of a program is one translation unit: one nvcc call builds them all.

The cache (EMMY_CACHE_DIR/cubin) is keyed on the source, the target, the flags, nvcc's version
and the runtime header's text; a cubin and its report are written atomically.
"""

from __future__ import annotations

import collections
import functools
import hashlib
import json
import logging
import os
import re
import shutil
import subprocess
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

from emmy.errors import EmmyError, KernelBuildError

log = logging.getLogger(__name__)

FLAGS = ("-O3", "-Xptxas", "-v", "-std=c++17")


@dataclass(frozen=True)
class Resources:
    registers: int
    shared_bytes: int
    stack_bytes: int
    spill_stores: int
    spill_loads: int

    @property
    def spills(self) -> bool:
        return bool(self.spill_stores or self.spill_loads)


@dataclass(frozen=True)
class Cubin:
    path: Path
    target: str
    resources: dict[str, Resources]  # kernel name -> what ptxas reported
    cached: bool  # True when no nvcc ran


def build_cubin(source: str, target: str, cache_dir: Path | None = None) -> Cubin:
    from emmy.config import settings
    from emmy.sim.build import HEADERS

    if not re.fullmatch(r"sm_\d+a?", target):
        raise EmmyError(f"nvcc target must look like sm_90, got {target!r}")
    key = cubin_key(source, target)
    nvcc = shutil.which("nvcc")
    folder = (cache_dir or settings().cache_dir) / "cubin"
    cubin, report = folder / f"{key}-{target}.cubin", folder / f"{key}-{target}.json"
    if cubin.exists() and report.exists():
        return Cubin(cubin, target, _load_report(report), True)
    if nvcc is None:
        raise KernelBuildError("nvcc is not on PATH; it is needed to build cubins")
    folder.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=folder) as work:
        cu = Path(work) / "program.cu"
        cu.write_text(source)
        out = Path(work) / "program.cubin"
        done = subprocess.run([nvcc, "-cubin", f"-arch={target}", *FLAGS, "-I", str(HEADERS), str(cu), "-o", str(out)],
                              capture_output=True, text=True)
        if done.returncode != 0:
            errors = "\n".join(line for line in done.stderr.splitlines() if "error" in line)[:4000]
            raise KernelBuildError(f"nvcc could not build the program for {target}:\n{errors or done.stderr[:4000]}")
        resources = parse_ptxas(done.stderr)
        tmp_report = Path(work) / "report.json"
        tmp_report.write_text(json.dumps({k: asdict(r) for k, r in resources.items()}))
        os.replace(out, cubin)
        os.replace(tmp_report, report)
    log.info("nvcc: built %s for %s: %s", cubin.name, target,
             ", ".join(f"{k} {r.registers} regs" for k, r in resources.items()))
    return Cubin(cubin, target, resources, False)


def cubin_key(source: str, target: str) -> str:
    """The cache key of a cubin of `source`: the text, the target, nvcc's flags and version, and the
    runtime headers the text includes."""
    from emmy.sim.build import headers_digest

    return hashlib.sha256("\0".join([source, target, " ".join(FLAGS), nvcc_version(),
                                     headers_digest()]).encode()).hexdigest()[:24]


def parse_ptxas(text: str) -> dict[str, Resources]:
    """Per kernel: `Function properties for K` (stack, spills), then `Used N registers, ... M bytes smem`."""
    found: dict[str, Resources] = {}
    current, stack, stores, loads = None, 0, 0, 0
    for line in text.splitlines():
        if m := re.search(r"Function properties for (\w+)", line):
            current = m.group(1)
        elif current and (m := re.search(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads",
                                         line)):
            stack, stores, loads = (int(g) for g in m.groups())
        elif current and (m := re.search(r"Used (\d+) registers", line)):
            smem = re.search(r"(\d+) bytes smem", line)
            found[current] = Resources(int(m.group(1)), int(smem.group(1)) if smem else 0, stack, stores, loads)
            current = None
    return found


def sass_mix(cubin: Path) -> dict[str, collections.Counter]:
    """Per kernel, how many of each SASS opcode (with modifiers, e.g. LDG.E.128) its code holds."""
    return {name: collections.Counter(ops) for name, ops in sass_opcodes(cubin).items()}


def sass_opcodes(cubin: Path) -> dict[str, list[str]]:
    """Per kernel, its SASS opcodes (with modifiers) in code order."""
    tool = _cuobjdump()
    env = dict(os.environ, PATH=f"{Path(tool).parent}{os.pathsep}{os.environ.get('PATH', '')}")  # nvdisasm beside it
    done = subprocess.run([tool, "-sass", str(cubin)], capture_output=True, text=True, env=env)
    if done.returncode != 0:
        raise KernelBuildError(f"cuobjdump -sass failed: {done.stderr.strip()[:2000]}")
    found: dict[str, list[str]] = {}
    ops = None
    for line in done.stdout.splitlines():
        if m := re.match(r"\s*Function : (\w+)", line):
            ops = found.setdefault(m.group(1), [])
        elif ops is not None and (m := re.match(r"\s*/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)", line)):
            ops.append(m.group(1))
    return _demangled(found)


def _demangled(mix: dict) -> dict:
    """C++ kernels appear under mangled names (extern "C" ones do not): key them by the plain name."""
    mangled = [name for name in mix if name.startswith("_Z")]
    if not mangled or shutil.which("c++filt") is None:
        return mix
    done = subprocess.run(["c++filt", "-p", *mangled], capture_output=True, text=True)
    plain = dict(zip(mangled, done.stdout.split("\n")))
    return {plain.get(name, name).split("<")[0] or name: counter for name, counter in mix.items()}


def _cuobjdump() -> str:
    found = shutil.which("cuobjdump")
    if found:
        return found
    try:  # PyPI's nvidia-cuda-cuobjdump (with nvidia-cuda-nvdisasm) installs it inside the package
        import nvidia

        for root in nvidia.__path__:
            for candidate in Path(root).glob("*/bin/cuobjdump"):
                return str(candidate)
    except ImportError:
        pass
    raise KernelBuildError("cuobjdump not found: install nvidia-cuda-cuobjdump and nvidia-cuda-nvdisasm")


def _load_report(path: Path) -> dict[str, Resources]:
    return {k: Resources(**v) for k, v in json.loads(path.read_text()).items()}


def nvcc_version() -> str:
    """nvcc's version line ("Build cuda_13.0.r13.0/..."), or "" where there is no nvcc."""
    nvcc = shutil.which("nvcc")
    return _nvcc_version(nvcc) if nvcc else ""


@functools.lru_cache(maxsize=4)
def _nvcc_version(nvcc: str) -> str:
    return subprocess.run([nvcc, "--version"], capture_output=True, text=True).stdout.strip().splitlines()[-1]
