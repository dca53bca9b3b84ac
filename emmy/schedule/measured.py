"""Measured kernel times that replace predictions (a measurement wins over the model).

Three sources, later ones winning for the same (GPU, kernel signature, knob row):
- rows shipped with the package (emmy/data/measurements.json, an `emmy db export`), so a fresh
  machine extracts with them;
- the measurement database (emmy.measure_db, EMMY_DB), where `emmy tune` and the GPU session
  record; only GPU rows count (simulator timings never stand for a GPU);
- EMMY_MEASUREMENTS, a JSON list of rows
  `{"target": "sm_90", "kernel": <signature>, "knobs": "WORK=...,RASTER=", "seconds": 1.2e-5}`.

The signature is the kernel's canonical signature (emmy.loop_ir.signature; `emmy explain` and
`TileKernel.signature` show it). A row applies to the exact kernel signature, knob row and GPU (a
target given as an architecture, "sm_90", is its default GPU, extract.targets.ARCH_DEFAULT_GPU).
A row measured wrong on the GPU (its outputs failed the check) marks its knob row as one never to
pick while another is offered. Malformed rows and unreadable files are skipped with a warning naming
the file and the row; they never stop a compile.
"""

from __future__ import annotations

import json
import logging
from functools import lru_cache
from pathlib import Path

from emmy.extract.targets import measurement_key

log = logging.getLogger("emmy.extract")
_FIELDS = {"target": str, "kernel": str, "knobs": str, "seconds": (int, float)}
SHIPPED = Path(__file__).resolve().parent.parent / "data" / "measurements.json"


class Measurements:
    def __init__(self, rows: dict[tuple[str, str, str], float] | None = None,
                 wrong: set[tuple[str, str, str]] | None = None):
        self.rows = rows or {}
        self.wrong = wrong or set()

    def lookup(self, target: str, signature: str, knobs: str) -> float | None:
        return self.rows.get((target, signature, knobs))

    def is_wrong(self, target: str, signature: str, knobs: str) -> bool:
        return (target, signature, knobs) in self.wrong

    def has_signature(self, target: str, signature: str) -> bool:
        """Whether any row is measured (right or wrong) for this kernel signature on this target."""
        if not hasattr(self, "_signatures"):
            self._signatures = {(t, s) for t, s, _ in (*self.rows, *self.wrong)}
        return (target, signature) in self._signatures

    def merged(self, other: Measurements) -> Measurements:
        """These rows with `other`'s over them."""
        rows = {**self.rows, **other.rows}
        wrong = (self.wrong - set(other.rows)) | other.wrong
        return Measurements({k: v for k, v in rows.items() if k not in other.wrong}, wrong)

    @classmethod
    def load(cls, path: Path) -> Measurements:
        """An EMMY_MEASUREMENTS file: a JSON list of rows."""
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

    @classmethod
    def of_rows(cls, rows) -> Measurements:
        """emmy.measure_db rows: GPU rows only, the latest of each key; wrong ones marked."""
        found, wrong = {}, set()
        for row in sorted(rows, key=lambda r: r.measured_at):
            if row.source != "gpu":
                continue
            key = (measurement_key(row.target), row.signature, row.knobs)
            if row.correct:
                found[key] = float(row.median_s)
                wrong.discard(key)
            else:
                wrong.add(key)
                found.pop(key, None)
        return cls(found, wrong)


def _problem(row) -> str:
    if not isinstance(row, dict):
        return "not an object"
    for name, kind in _FIELDS.items():
        if not isinstance(row.get(name), kind) or isinstance(row.get(name), bool):
            return f"field {name!r} missing or not a {getattr(kind, '__name__', 'number')}"
    if not row["seconds"] > 0:
        return "seconds must be positive"
    return ""


def shipped_rows() -> list:
    """The rows shipped in emmy/data/measurements.json (emmy.measure_db.MeasuredRow), the bad ones left
    out; none, with a warning, if the file is unreadable."""
    from emmy.measure_db import MeasuredRow, MeasurementDbError, parse_export

    if not SHIPPED.exists():
        return []
    try:
        rows = [MeasuredRow.from_dict(item) for item in parse_export(SHIPPED.read_text(), str(SHIPPED))]
    except MeasurementDbError as err:
        log.warning("shipped measurements unreadable (%s); not used", err)
        return []
    return [r for r in rows if not r.problem()]


def _shipped() -> Measurements:
    return Measurements.of_rows(shipped_rows())


def _database(path: Path) -> Measurements:
    from emmy.measure_db import MeasurementDb, MeasurementDbError

    try:
        with MeasurementDb(path) as db:
            rows = db.rows()
    except MeasurementDbError as err:
        log.warning("%s; predicting without its rows", err)
        return Measurements()
    return Measurements.of_rows(rows)


@lru_cache(maxsize=8)
def _load_cached(db: str, db_stamp: tuple, legacy: str, legacy_stamp: float) -> Measurements:
    found = _shipped()
    if db:
        found = found.merged(_database(Path(db)))
    if legacy:
        found = found.merged(Measurements.load(Path(legacy)))
    return found


def _stamp(path: Path | None) -> tuple:
    """What changes when the file (and an SQLite file's write-ahead log) changes."""
    if path is None or not path.exists():
        return ()
    wal = path.with_name(path.name + "-wal")
    return (path.stat().st_mtime_ns, wal.stat().st_mtime_ns if wal.exists() else 0,
            wal.stat().st_size if wal.exists() else 0)


def current() -> Measurements:
    """The shipped rows, the database's and EMMY_MEASUREMENTS's (reloaded when a file changes)."""
    from emmy.config import settings
    from emmy.measure_db import default_path

    config = settings()
    db = default_path()
    db_used = str(db) if db.exists() else ""
    legacy = config.measurements if config.measurements is not None and config.measurements.exists() else None
    return _load_cached(db_used, _stamp(db) if db_used else (), str(legacy or ""),
                        legacy.stat().st_mtime if legacy else 0.0)
