"""What the simulator needs to know about a CUDA source: its kernels with their
parameter types, and its `extern __shared__` arrays. Read with regular
expressions: enough for kernels written for emmy (no templates, one
declaration per parameter), with a clear error otherwise."""

from __future__ import annotations

import re
from dataclasses import dataclass

from emmy.errors import KernelBuildError

# scalar parameter types the launcher can pass, by their C spelling
SCALARS = {
    "int": "i4", "int32_t": "i4", "unsigned": "u4", "unsigned int": "u4", "uint32_t": "u4",
    "long": "i8", "long long": "i8", "int64_t": "i8", "size_t": "u8", "unsigned long": "u8",
    "uint64_t": "u8", "float": "f4", "double": "f8",
}

_KERNEL = re.compile(r"__global__\s+(?:__launch_bounds__\s*\([^)]*\)\s*)?void\s+"
                     r"(?:__launch_bounds__\s*\([^)]*\)\s*)?(\w+)\s*\(([^)]*)\)", re.S)
_EXTERN_SHARED = re.compile(r"extern\s+__shared__\s+(?:(?:__align__|alignas)\s*\(\s*\d+\s*\)\s+)?"
                            r"([A-Za-z_][\w:\s]*?)\s+(\w+)\s*\[\s*\]\s*;")
_QUALIFIERS = re.compile(r"\b(const|volatile|__restrict__|__restrict|__grid_constant__)\b")


@dataclass(frozen=True)
class Param:
    name: str
    kind: str  # "pointer", "tensormap" or a numpy dtype string for a scalar ("i4", "f4", ...)
    element: str = ""  # pointers: the element type as written


@dataclass(frozen=True)
class KernelSignature:
    name: str
    params: tuple[Param, ...]


def kernels_of(source: str, filename: str = "<source>") -> dict[str, KernelSignature]:
    found = {}
    for match in _KERNEL.finditer(source):
        name, text = match.group(1), match.group(2).strip()
        params = [] if text in ("", "void") else [_param(p.strip(), name, filename) for p in text.split(",")]
        found[name] = KernelSignature(name, tuple(params))
    if not found:
        raise KernelBuildError(f"{filename}: no `__global__ void name(...)` kernel found")
    return found


def _param(text: str, kernel: str, filename: str) -> Param:
    parts = _QUALIFIERS.sub(" ", text).split()
    if len(parts) < 2:
        raise KernelBuildError(f"{filename}: kernel {kernel}: cannot read parameter {text!r}")
    *type_words, name = parts
    spelled = " ".join(type_words).replace(" *", "*")
    if "*" in spelled or name.startswith("*"):
        return Param(name.lstrip("*"), "pointer", spelled.replace("*", "").strip())
    if spelled == "CUtensorMap":  # a TMA descriptor, passed by value (emmy.sim.TensorMap)
        return Param(name, "tensormap")
    if spelled not in SCALARS:
        raise KernelBuildError(f"{filename}: kernel {kernel}: parameter {name} has type {spelled!r}; "
                               f"the simulator passes pointers, CUtensorMap and {', '.join(sorted(SCALARS))}")
    return Param(name, SCALARS[spelled])


def dynamic_shared(source: str) -> list[tuple[str, str]]:
    """(element type, name) of every distinct `extern __shared__ T name[];`."""
    seen: dict[str, str] = {}
    for match in _EXTERN_SHARED.finditer(source):
        element, name = " ".join(match.group(1).split()), match.group(2)
        if seen.setdefault(name, element) != element:
            raise KernelBuildError(f"extern __shared__ array {name} is declared as {seen[name]} and as {element}")
    return [(element, name) for name, element in seen.items()]


def simulator_source(source: str, filename: str) -> str:
    """The source as g++ compiles it: unchanged (its lines keep their numbers), after the simulator's
    header (so a plain CUDA file needs no include, as under nvcc), with storage for its dynamic
    shared arrays and one exported launcher per kernel appended."""
    tail = [f"EMMY_SIM_DYNAMIC_SHARED({element}, {name})" for element, name in dynamic_shared(source)]
    tail += [f"EMMY_SIM_EXPORT({name})" for name in kernels_of(source, filename)]
    escaped = filename.replace("\\", "\\\\").replace('"', '\\"')
    return f'#include "emmy_sim.h"\n#line 1 "{escaped}"\n{source}\n#line 1 "<emmy-sim launchers>"\n' + "\n".join(tail) + "\n"
