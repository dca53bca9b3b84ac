"""Many programs' device code in few nvcc calls: the tuner's candidates, built before any is measured.

A small program's build is mostly nvcc's fixed cost (its front end parsing the CUDA headers: about
0.6 s of a 0.8 s build of one RMSNorm kernel here), so programs are merged into translation units of
up to BATCH each and the units are built by nvcc at once, one a core. An emmy program's text is its
extern "C" kernels and nothing else at file scope (their one shared name, the dynamic shared-memory
array, has one type everywhere), so in a unit each program's kernels get a suffix and nothing more:
`k_rms_norm` of the third program is `k_rms_norm__b2` in the cubin (and in the simulator, which runs
a unit as it runs a program).

Each program's outcome is cached by its own content (EMMY_CACHE_DIR/cubin/programs), so a program
met again in another mix of candidates is not built again. A unit nvcc refuses is built again one
program at a time, so one bad candidate costs itself, not its neighbours.
"""

from __future__ import annotations

import concurrent.futures
import json
import os
import re
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path

from emmy.errors import KernelBuildError
from emmy.nvcc import Resources, build_cubin, cubin_key

BATCH = 16  # programs a translation unit at most: past this nvcc's own work per kernel dominates


@dataclass(frozen=True)
class BuiltProgram:
    """One program's kernels in a cubin that may hold other programs' too."""
    cubin: Path | None  # None when the program did not build (see `error`)
    target: str
    names: dict[str, str] = field(default_factory=dict)  # the program's kernel name -> its name in the cubin
    resources: dict[str, Resources] = field(default_factory=dict)  # by the program's kernel name
    error: str = ""


def merged_source(programs: list[tuple[str, list[str]]]) -> tuple[str, list[dict[str, str]]]:
    """One translation unit of `programs` ((CUDA source, its kernels' names) each): their `#include`
    lines once at the top, then each program's text with its kernels renamed <name>__b<i>. Returns
    the text and, per program, its renaming."""
    includes: list[str] = []
    bodies, renames = [], []
    for index, (source, names) in enumerate(programs):
        lines = source.splitlines()
        includes += [line for line in lines if line.startswith("#include") and line not in includes]
        body = "\n".join(line for line in lines if not line.startswith("#include"))
        rename = {name: f"{name}__b{index}" for name in names}
        if rename:
            pattern = re.compile(r"\b(" + "|".join(re.escape(n) for n in sorted(names, key=len, reverse=True)) + r")\b")
            body = pattern.sub(lambda m: rename[m.group(1)], body)
        bodies.append(f"// ---- program {index} ----\n{body}")
        renames.append(rename)
    return "\n".join(includes + bodies) + "\n", renames


def build_programs(programs: list[tuple[str, list[str]]], target: str, cache_dir: Path | None = None,
                   batch: int = BATCH, jobs: int | None = None) -> list[BuiltProgram]:
    """Every program ((CUDA source, its kernels' names)) built for `target` (sm_90, ...), in units of
    up to `batch` programs, `jobs` nvcc calls at once (default: one a core). Distinct sources are built
    once; cached ones not at all. One BuiltProgram a program, in order; a program nvcc refuses has
    its reason in `error`."""
    from emmy.config import settings

    root = cache_dir or settings().cache_dir
    folder = root / "cubin" / "programs"
    keys = [cubin_key(source, target) for source, _ in programs]
    found: dict[str, BuiltProgram] = {}
    todo: dict[str, tuple[str, list[str]]] = {}
    for key, program in zip(keys, programs):
        entry = _cached(folder, key, target)
        if entry is not None:
            found[key] = entry
        elif key not in todo:
            todo[key] = program
    jobs = jobs or os.cpu_count() or 1
    units = _units(list(todo.items()), batch, jobs)

    def build(unit: list[tuple[str, tuple[str, list[str]]]]) -> list[tuple[str, BuiltProgram]]:
        unit_keys, unit_programs = zip(*unit)
        return list(zip(unit_keys, _build_unit(list(unit_programs), target, root)))

    with concurrent.futures.ThreadPoolExecutor(max(1, min(jobs, len(units)))) as pool:
        for done in pool.map(build, units):
            for key, entry in done:
                if not entry.error:
                    _store(folder, key, entry)
                found[key] = entry
    return [found[key] for key in keys]


def _units(items: list, batch: int, jobs: int) -> list[list]:
    """`items` in units of at most `batch`, at least one a job when there are enough (so every core
    has a unit), of sizes differing by one at most."""
    if not items:
        return []
    count = max(-(-len(items) // batch), min(jobs, len(items)))
    size, extra = divmod(len(items), count)
    units, start = [], 0
    for i in range(count):
        end = start + size + (1 if i < extra else 0)
        units.append(items[start:end])
        start = end
    return units


def _build_unit(unit: list[tuple[str, list[str]]], target: str, root: Path) -> list[BuiltProgram]:
    text, renames = merged_source(unit)
    try:
        cubin = build_cubin(text, target, cache_dir=root)
    except KernelBuildError as err:
        if len(unit) == 1:
            return [BuiltProgram(None, target, error=str(err))]
        return [entry for program in unit for entry in _build_unit([program], target, root)]
    return [BuiltProgram(cubin.path, target, rename, {name: cubin.resources[inside] for name, inside in rename.items()
                                                      if inside in cubin.resources})
            for rename in renames]


def _cached(folder: Path, key: str, target: str) -> BuiltProgram | None:
    path = folder / f"{key}-{target}.json"
    try:
        data = json.loads(path.read_text())
        cubin = Path(data["cubin"])
        if not cubin.exists():
            return None
        return BuiltProgram(cubin, target, dict(data["names"]),
                            {name: Resources(**r) for name, r in data["resources"].items()})
    except (OSError, ValueError, KeyError, TypeError):  # absent, or a partial or foreign file: build again
        return None


def _store(folder: Path, key: str, entry: BuiltProgram) -> None:
    """Written whole or not at all (a reader never sees half an entry)."""
    folder.mkdir(parents=True, exist_ok=True)
    data = {"cubin": str(entry.cubin), "names": entry.names,
            "resources": {name: asdict(r) for name, r in entry.resources.items()}}
    with tempfile.NamedTemporaryFile("w", dir=folder, delete=False, suffix=".tmp") as tmp:
        tmp.write(json.dumps(data))
    os.replace(tmp.name, folder / f"{key}-{entry.target}.json")
