"""The CUDA emitted for a set of (program, rows) pairs: what tests/test_cuda_snapshot.py holds
byte-for-byte against tests/golden/cuda.json.gz.

For each reference workload (on h100 and on sm_80), every kernel's offered rows are grouped by kind
(WORK form, TILE form, REDUCE, STAGE mode, RASTER on or off); variant j gives each kernel the first
row of its j-th group (or its model-chosen row when it has fewer groups). So the snapshot covers
SIMT, micro-tile and mma contractions, splits, staging modes and rasterisation, not only the rows the
cost model picks today. Refresh it (after a deliberate change to emitted code) with

    .venv/bin/python -m tests.cuda_snapshot --write
"""

from __future__ import annotations

import gzip
import hashlib
import json
import pathlib
import re
import sys

GOLDEN = pathlib.Path(__file__).parent / "golden" / "cuda.json.gz"
TARGETS = ("h100", "sm_80")


def _form(value: str) -> str:
    return re.sub(r"[0-9]+", "", value)  # the knob's form without its numbers: t, wx, f/v, gak, d/smem-async


def _group(row) -> tuple:
    return tuple(_form(str(getattr(row, knob))) for knob in ("WORK", "TILE", "REDUCE", "STAGE", "RASTER"))


def variants(program) -> list[dict]:
    """Per variant, kernel name -> row."""
    space = program.schedule_space()
    per_kernel = {}
    for name, rows in space.rows.items():
        firsts = {}
        for row in rows:
            firsts.setdefault(_group(row), row)
        per_kernel[name] = list(firsts.values())
    count = max((len(v) for v in per_kernel.values()), default=0)
    return [{name: rows[j] for name, rows in per_kernel.items() if j < len(rows)} for j in range(count)]


WORD = re.compile(r"[A-Za-z_][A-Za-z0-9_\-]*|")  # a name or a word ("block", "smem-async"), or nothing
_LOOP_IR_FIELDS = ("knobs", "summary", "stmts", "body", "lift", "combine", "epilogue", "inits", "per_key", "held",
                   "dot", "per_col", "scores", "prologue")


def node_strings(node, path=""):
    """(field path, value) of every str a Kernel IR node holds, through nested Kernel IR nodes and
    tuples (Loop IR statements, which keep their own names, and the listing's knobs/summary excluded)."""
    import dataclasses

    from emmy.kernel_ir import nodes as K

    if isinstance(node, str):
        yield path, node
    elif isinstance(node, tuple):
        for i, item in enumerate(node):
            yield from node_strings(item, f"{path}[{i}]")
    elif dataclasses.is_dataclass(node) and type(node).__module__ == K.__name__:
        for f in dataclasses.fields(node):
            if f.name not in _LOOP_IR_FIELDS or isinstance(node, (K.KernelIR, K.OnlyThread)) and f.name == "body":
                yield from node_strings(getattr(node, f.name), f"{path}.{type(node).__name__}.{f.name}")


def snapshot() -> dict[str, str]:
    """Label -> emitted CUDA text."""
    import emmy
    from emmy.workloads import WORKLOADS

    out = {}
    for workload in WORKLOADS:
        for target in TARGETS:
            program = emmy.optimize(workload.sim_code or workload.code, target=target)
            out[f"{workload.name}@{target}/chosen"] = program.cuda_source
            for j, rows in enumerate(variants(program)):
                out[f"{workload.name}@{target}/v{j}"] = program.with_rows(rows).cuda_source
    return out


def load() -> dict[str, str]:
    return json.loads(gzip.decompress(GOLDEN.read_bytes()))


def main() -> None:
    texts = snapshot()
    if "--write" in sys.argv:
        GOLDEN.write_bytes(gzip.compress(json.dumps(texts, sort_keys=True).encode(), mtime=0))
    digest = hashlib.sha256(json.dumps(texts, sort_keys=True).encode()).hexdigest()[:16]
    print(f"{len(texts)} sources, {sum(map(len, texts.values()))} chars, digest {digest}")


if __name__ == "__main__":
    main()
