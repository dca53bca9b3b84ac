"""The measurement database: kernel times measured on GPUs, in SQLite.

One row per GPU (its own name), compute capability, driver, kernel signature (emmy.loop_ir.signature:
the kernel's operations, dtypes, index maps, extents and buffer types), knob row and compiler
version, holding the median, p10 and p90 seconds, the repetitions, whether the outputs were
correct (a wrong candidate is recorded, never ranked), the error text, the date and where the time
came from ("gpu", or "simulator": the tuner's control flow run on the CPU simulator, whose timings
are never GPU figures). A newer measurement of the same key replaces the older.

The file is at EMMY_DB (default EMMY_CACHE_DIR/measurements.sqlite). It runs in WAL mode and every
write is one transaction (BEGIN IMMEDIATE, waiting up to BUSY_SECONDS for another writer), so two
tuners writing at once lose nothing and a process killed mid-write leaves the database as it was
before that write. A file that is not this database (not SQLite, another program's, corrupt) is
reported (MeasurementDbError) and never written to. `emmy db export` and `emmy db import` move rows
as JSON (EXPORT_FORMAT); emmy/data/measurements.json holds rows shipped with the package, which
extraction uses on any machine (emmy.schedule.measured).
"""

from __future__ import annotations

import dataclasses
import json
import math
import sqlite3
from dataclasses import dataclass
from pathlib import Path

from emmy.errors import MeasurementDbError

APPLICATION_ID = 0x656D6D79  # "emmy": set in the file's header, checked on open
SCHEMA_VERSION = 1
BUSY_SECONDS = 60.0
EXPORT_FORMAT = "emmy-measurements"
SOURCES = ("gpu", "simulator")

_COLUMNS = ("gpu", "target", "capability", "driver", "signature", "knobs", "compiler", "median_s", "p10_s",
            "p90_s", "repetitions", "correct", "error", "measured_at", "source")
_KEY = ("gpu", "capability", "driver", "signature", "knobs", "compiler", "source")
_SCHEMA = f"""
CREATE TABLE IF NOT EXISTS measurements (
    gpu TEXT NOT NULL, target TEXT NOT NULL, capability TEXT NOT NULL, driver TEXT NOT NULL,
    signature TEXT NOT NULL, knobs TEXT NOT NULL, compiler TEXT NOT NULL,
    median_s REAL, p10_s REAL, p90_s REAL, repetitions INTEGER NOT NULL, correct INTEGER NOT NULL,
    error TEXT NOT NULL, measured_at TEXT NOT NULL, source TEXT NOT NULL,
    PRIMARY KEY ({", ".join(_KEY)}));
CREATE INDEX IF NOT EXISTS by_kernel ON measurements (target, signature);
"""



@dataclass(frozen=True)
class MeasuredRow:
    gpu: str  # the device's own name, "NVIDIA H200"
    target: str  # emmy's key for it (extract.targets), "h200": what extraction looks rows up by
    capability: str  # "9.0"
    driver: str
    signature: str
    knobs: str  # the full row, "WORK=t512,TILE=f8/v4,REDUCE=coop,STAGE=,RASTER="
    compiler: str  # nvcc's version line
    median_s: float | None  # None for a row that failed (wrong outputs, a fault, a hang)
    p10_s: float | None
    p90_s: float | None
    repetitions: int
    correct: bool
    error: str = ""
    measured_at: str = ""  # ISO 8601
    source: str = "gpu"

    def problem(self) -> str:
        """What is wrong with the row, or ""."""
        for name in ("gpu", "target", "signature", "knobs"):
            if not isinstance(getattr(self, name), str) or not getattr(self, name):
                return f"{name} must be a non-empty string"
        if self.source not in SOURCES:
            return f"source must be one of {', '.join(SOURCES)}, not {self.source!r}"
        if not isinstance(self.repetitions, int) or self.repetitions < 0:
            return "repetitions must be a count"
        if self.correct:
            times = (self.median_s, self.p10_s, self.p90_s)
            if not all(isinstance(t, (int, float)) and math.isfinite(t) and t > 0 for t in times):
                return "a correct row needs positive finite median_s, p10_s and p90_s"
            if not self.p10_s <= self.median_s <= self.p90_s:
                return "p10_s <= median_s <= p90_s does not hold"
            if self.repetitions < 1:
                return "a correct row needs at least one repetition"
        elif not self.error:
            return "a row that is not correct says why (error)"
        return ""

    @classmethod
    def from_dict(cls, data: dict) -> MeasuredRow:
        fields = {f.name for f in dataclasses.fields(cls)}
        unknown = set(data) - fields
        if unknown:
            raise MeasurementDbError(f"unknown fields {', '.join(sorted(unknown))}")
        try:
            return cls(**data)
        except TypeError as err:
            raise MeasurementDbError(str(err)) from None


def default_path() -> Path:
    from emmy.config import settings

    config = settings()
    return config.db or config.cache_dir / "measurements.sqlite"


class MeasurementDb:
    """The database at `path` (created if absent); MeasurementDbError if the file is not one."""

    def __init__(self, path: Path | None = None):
        self.path = Path(path) if path is not None else default_path()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._conn = sqlite3.connect(str(self.path), timeout=BUSY_SECONDS, isolation_level=None)
        try:
            self._open()
        except sqlite3.DatabaseError as err:
            self._conn.close()
            raise MeasurementDbError(f"{self.path} is not an emmy measurement database ({err}); it was left "
                                     "as it is: move it aside or set EMMY_DB to another file") from None

    def _open(self) -> None:
        """Check that the file is emmy's, or make a new (empty) one emmy's. An empty one is made under
        the write lock and looked at again there: a process that opens the file while another is
        making it waits for that to commit, so it never takes the half-made file (a header, no
        application id yet) for another program's. A file already emmy's is only read (it may be
        read-only to this process)."""
        app, version, fresh = self._identity()
        if fresh:
            self._conn.execute("BEGIN IMMEDIATE")
            try:
                app, version, fresh = self._identity()  # again, under the lock
                if fresh:  # nothing in it to lose
                    self._conn.execute(f"PRAGMA application_id={APPLICATION_ID}")
                    self._conn.execute(f"PRAGMA user_version={SCHEMA_VERSION}")
                    for statement in filter(str.strip, _SCHEMA.split(";")):
                        self._conn.execute(statement)
                self._conn.execute("COMMIT")
            except BaseException:
                if self._conn.in_transaction:
                    self._conn.execute("ROLLBACK")
                raise
        if not fresh:
            self._check_identity(app, version)
        self._conn.execute("PRAGMA journal_mode=WAL")

    def _identity(self) -> tuple[int, int, bool]:
        """(application id, schema version, whether the file is empty: no id, no version, no tables)
        as it holds them now."""
        app = self._conn.execute("PRAGMA application_id").fetchone()[0]
        version = self._conn.execute("PRAGMA user_version").fetchone()[0]
        tables = self._conn.execute("SELECT count(*) FROM sqlite_master").fetchone()[0]
        return app, version, app == 0 and version == 0 and tables == 0

    def _check_identity(self, app: int, version: int) -> None:
        if app != APPLICATION_ID:
            self._conn.close()
            raise MeasurementDbError(f"{self.path} is an SQLite database of another program (application id "
                                     f"{app:#x}, not emmy's {APPLICATION_ID:#x}); it was left as it is: set EMMY_DB "
                                     "to another file")
        if version != SCHEMA_VERSION:
            self._conn.close()
            raise MeasurementDbError(f"{self.path} has schema version {version}; this emmy reads version "
                                     f"{SCHEMA_VERSION}: export it with the emmy that wrote it")
        check = self._conn.execute("PRAGMA quick_check").fetchone()[0]
        if check != "ok":
            self._conn.close()
            raise MeasurementDbError(f"{self.path} is corrupt ({check}); it was left as it is")

    def add(self, rows) -> int:
        """Every row in one transaction (all or none); a bad row stops it with its problem."""
        rows = list(rows)
        for index, row in enumerate(rows):
            problem = row.problem()
            if problem:
                raise MeasurementDbError(f"measurement row {index} ({row.signature} {row.knobs}): {problem}")
        values = [tuple(int(v) if isinstance(v, bool) else v for v in dataclasses.astuple(r)) for r in rows]
        self._conn.execute("BEGIN IMMEDIATE")
        try:
            self._conn.executemany(f"INSERT OR REPLACE INTO measurements ({', '.join(_COLUMNS)}) VALUES "
                                   f"({', '.join('?' * len(_COLUMNS))})", values)
            self._conn.execute("COMMIT")
        except BaseException:
            self._conn.execute("ROLLBACK")
            raise
        return len(rows)

    def rows(self, target: str | None = None) -> list[MeasuredRow]:
        query = f"SELECT {', '.join(_COLUMNS)} FROM measurements"
        found = self._conn.execute(query + (" WHERE target = ?" if target else "") + " ORDER BY rowid",
                                   (target,) if target else ())
        return [MeasuredRow(*(bool(v) if c == "correct" else v for c, v in zip(_COLUMNS, values)))
                for values in found]

    def export_json(self, target: str | None = None, source: str | None = None) -> str:
        rows = [dataclasses.asdict(r) for r in self.rows(target) if source is None or r.source == source]
        return json.dumps({"format": EXPORT_FORMAT, "version": SCHEMA_VERSION, "rows": rows}, indent=1) + "\n"

    def import_json(self, text: str, label: str = "the file") -> tuple[int, list[str]]:
        """(rows added, one line per row skipped and why). Rows that are fine go in one transaction."""
        good, skipped = [], []
        for index, item in enumerate(parse_export(text, label)):
            try:
                row = MeasuredRow.from_dict(item) if isinstance(item, dict) else None
                problem = "not an object" if row is None else row.problem()
            except MeasurementDbError as err:
                problem = str(err)
            if problem:
                skipped.append(f"{label}, row {index}: {problem}")
            else:
                good.append(row)
        return self.add(good), skipped

    def close(self) -> None:
        self._conn.close()

    def __enter__(self) -> MeasurementDb:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def parse_export(text: str, label: str) -> list:
    """The rows of an export (EXPORT_FORMAT), or MeasurementDbError saying what is wrong with it."""
    try:
        data = json.loads(text)
    except ValueError as err:
        raise MeasurementDbError(f"{label} is not JSON ({err})") from None
    if not isinstance(data, dict) or data.get("format") != EXPORT_FORMAT or not isinstance(data.get("rows"), list):
        raise MeasurementDbError(f"{label} is not an emmy measurement export (an object with \"format\": "
                                 f"\"{EXPORT_FORMAT}\" and a list of \"rows\")")
    if data.get("version") != SCHEMA_VERSION:
        raise MeasurementDbError(f"{label} is export version {data.get('version')}; this emmy reads {SCHEMA_VERSION}")
    return data["rows"]
