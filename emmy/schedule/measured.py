"""Measured kernel times that replace predictions (a measurement wins over the model).

For now a JSON file (EMMY_MEASUREMENTS): a list of rows
`{"target": "sm_90", "kernel": <signature>, "knobs": "WORK=...,RASTER=", "seconds": 1.2e-5}`, where the
signature is the kernel's canonical signature (emmy.loop_ir.signature: its operations, dtypes, index
maps, extents and buffer types; `emmy explain` and `TileKernel.signature` show it). A row applies to
the exact kernel signature, knob row and GPU (a target given as an architecture, "sm_90", is
its default GPU, extract.targets.ARCH_DEFAULT_GPU; "h100" is the H100). Rows that
are malformed are skipped with a warning naming the file and the row; they
never stop a compile. The measurement database of a later issue fills the
same lookup.
"""

from __future__ import annotations

import json
import logging
from functools import lru_cache
from pathlib import Path

from emmy.extract.targets import measurement_key

log = logging.getLogger("emmy.extract")
_FIELDS = {"target": str, "kernel": str, "knobs": str, "seconds": (int, float)}


class Measurements:
    def __init__(self, rows: dict[tuple[str, str, str], float] | None = None):
        self.rows = rows or {}

    def lookup(self, target: str, signature: str, knobs: str) -> float | None:
        return self.rows.get((target, signature, knobs))

    def has_signature(self, target: str, signature: str) -> bool:
        """Whether any row is measured for this kernel signature on this target."""
        if not hasattr(self, "_signatures"):
            self._signatures = {(t, s) for t, s, _ in self.rows}
        return (target, signature) in self._signatures

    @classmethod
    def load(cls, path: Path) -> "Measurements":
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError) as err:
            log.warning("measurements file %s unreadable (%s); predicting every kernel", path, err)
            return cls()
        if not isinstance(data, list):
            log.warning("measurements file %s: expected a list of rows; predicting every kernel", path)
            return cls()
        rows = {}
        for index, row in enumerate(data):
            problem = _problem(row)
            if problem:
                log.warning("measurements file %s, row %d skipped: %s", path, index, problem)
                continue
            rows[(measurement_key(row["target"]), row["kernel"], row["knobs"])] = float(row["seconds"])
        return cls(rows)


def _problem(row) -> str:
    if not isinstance(row, dict):
        return "not an object"
    for name, kind in _FIELDS.items():
        if not isinstance(row.get(name), kind) or isinstance(row.get(name), bool):
            return f"field {name!r} missing or not a {getattr(kind, '__name__', 'number')}"
    if not row["seconds"] > 0:
        return "seconds must be positive"
    return ""


@lru_cache(maxsize=8)
def _load_cached(path: str, mtime: float) -> Measurements:
    return Measurements.load(Path(path))


def current() -> Measurements:
    """The measurements EMMY_MEASUREMENTS names (reloaded when the file changes), or none."""
    from emmy.config import settings

    path = settings().measurements
    if path is None or not path.exists():
        return Measurements()
    return _load_cached(str(path), path.stat().st_mtime)
