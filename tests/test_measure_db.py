"""The measurement database (emmy.measure_db) on real SQLite, and extraction reading it."""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import sqlite3
import subprocess
import sys
import textwrap

import pytest

import emmy
from emmy.measure_db import MeasuredRow, MeasurementDb, MeasurementDbError
from tests.conftest import run_emmy


def _row(i: int, **changes) -> MeasuredRow:
    base = MeasuredRow(gpu="NVIDIA H200", target="h200", capability="9.0", driver="580.159.04",
                       signature=f"sig{i // 10}", knobs=f"WORK=t{32 * (1 + i % 10)},TILE=f1,REDUCE=,STAGE=,RASTER=",
                       compiler="cuda 13.0", median_s=1e-5 * (1 + i), p10_s=0.9e-5 * (1 + i), p90_s=1.1e-5 * (1 + i),
                       repetitions=20, correct=True, measured_at=f"2026-12-04T00:00:{i % 60:02d}")
    return dataclasses.replace(base, **changes)


def test_rows_round_trip_through_an_export_into_another_database(tmp_path):
    rows = [_row(i) for i in range(25)] + [_row(99, correct=False, median_s=None, p10_s=None, p90_s=None,
                                                repetitions=0, error="tolerance")]
    with MeasurementDb(tmp_path / "a.sqlite") as a:
        assert a.add(rows) == 26
        text = a.export_json()
    with MeasurementDb(tmp_path / "b.sqlite") as b:
        added, skipped = b.import_json(text)
        assert (added, skipped) == (26, [])
        assert b.rows() == rows
    assert json.loads(text)["rows"][-1]["correct"] is False


def test_a_newer_measurement_of_the_same_key_replaces_the_older(tmp_path):
    with MeasurementDb(tmp_path / "m.sqlite") as db:
        db.add([_row(3)])
        db.add([_row(3, median_s=5e-5, p10_s=4e-5, p90_s=6e-5)])
        (only,) = db.rows()
        assert only.median_s == 5e-5


_WRITER = textwrap.dedent("""
    import dataclasses, sys
    from emmy.measure_db import MeasurementDb
    from tests.test_measure_db import _row
    start = int(sys.argv[2])
    with MeasurementDb(sys.argv[1]) as db:
        for i in range(start, start + 60):  # a transaction a row: the writers interleave
            db.add([_row(i, signature=f"w{start}-{i}")])
""")


def test_four_writers_at_once_lose_nothing(tmp_path):
    path = tmp_path / "m.sqlite"
    MeasurementDb(path).close()
    env = {**os.environ, "PYTHONPATH": os.getcwd()}
    writers = [subprocess.Popen([sys.executable, "-c", _WRITER, str(path), str(start)], env=env,
                                stderr=subprocess.PIPE, text=True) for start in (0, 1000, 2000, 3000)]
    for w in writers:
        _, err = w.communicate(timeout=120)
        assert w.returncode == 0, err
    with MeasurementDb(path) as db:
        assert len(db.rows()) == 240


_MAKING = textwrap.dedent("""
    import sqlite3, sys, time
    from emmy.measure_db import APPLICATION_ID, SCHEMA_VERSION, _SCHEMA
    conn = sqlite3.connect(sys.argv[1], isolation_level=None, timeout=30)
    conn.execute("PRAGMA journal_mode=WAL")  # the file has its header now, and no application id yet
    conn.execute("BEGIN IMMEDIATE")
    conn.execute(f"PRAGMA application_id={APPLICATION_ID}")
    print("making", flush=True)
    time.sleep(1.5)  # another process opens the file now
    conn.execute(f"PRAGMA user_version={SCHEMA_VERSION}")
    for statement in filter(str.strip, _SCHEMA.split(";")):
        conn.execute(statement)
    conn.execute("COMMIT")
""")


def test_a_database_opened_while_another_process_makes_it_waits_for_it(tmp_path):
    """Two tuners starting at once: the second opened the file between the first's header and its
    commit, read application id 0 and refused the file as another program's (a CI run failed so)."""
    path = tmp_path / "m.sqlite"
    env = {**os.environ, "PYTHONPATH": os.getcwd()}
    maker = subprocess.Popen([sys.executable, "-c", _MAKING, str(path)], env=env, stdout=subprocess.PIPE, text=True)
    assert maker.stdout.readline().strip() == "making" and path.stat().st_size > 0
    with MeasurementDb(path) as db:
        db.add([_row(1)])
        assert [r.signature for r in db.rows()] == [_row(1).signature]
    assert maker.wait(timeout=60) == 0


_KILLED = textwrap.dedent("""
    import sys, time
    from emmy.measure_db import MeasurementDb
    from tests.test_measure_db import _row
    db = MeasurementDb(sys.argv[1])
    db._conn.execute("BEGIN IMMEDIATE")  # as add() does, but stopped half way
    db._conn.executemany("INSERT INTO measurements VALUES (" + ",".join("?" * 15) + ")",
                         [tuple(int(v) if isinstance(v, bool) else v for v in __import__("dataclasses").astuple(
                             _row(i, signature=f"killed{i}"))) for i in range(5000)])
    print("inside", flush=True)
    time.sleep(60)
""")


def test_a_writer_killed_in_the_middle_of_a_write_leaves_the_database_as_it_was(tmp_path):
    path = tmp_path / "m.sqlite"
    with MeasurementDb(path) as db:
        db.add([_row(i) for i in range(10)])
    env = {**os.environ, "PYTHONPATH": os.getcwd()}
    child = subprocess.Popen([sys.executable, "-c", _KILLED, str(path)], env=env, stdout=subprocess.PIPE, text=True)
    assert child.stdout.readline().strip() == "inside"
    os.kill(child.pid, signal.SIGKILL)
    child.wait()
    with MeasurementDb(path) as db:  # opens (quick_check passes) with the ten rows and none of the killed write's
        assert sorted(r.signature for r in db.rows()) == sorted(_row(i).signature for i in range(10))
        db.add([_row(50)])  # and takes writes again
        assert len(db.rows()) == 11


def test_a_file_that_is_not_the_database_is_reported_and_left_as_it_is(tmp_path):
    garbage = tmp_path / "garbage.sqlite"
    garbage.write_bytes(b"not a database at all\n" * 200)
    foreign = tmp_path / "foreign.sqlite"
    with sqlite3.connect(foreign) as conn:
        conn.execute("CREATE TABLE notes (text TEXT)")
        conn.execute("INSERT INTO notes VALUES ('mine')")
    conn.close()
    for path, says in ((garbage, "is not an emmy measurement database"), (foreign, "another program")):
        before = path.read_bytes()
        with pytest.raises(MeasurementDbError, match=says):
            MeasurementDb(path)
        assert path.read_bytes() == before


def test_a_corrupt_database_is_reported_and_left_as_it_is(tmp_path):
    path = tmp_path / "m.sqlite"
    with MeasurementDb(path) as db:
        db.add([_row(i, signature=f"s{i}" * 40) for i in range(400)])  # several pages
    with sqlite3.connect(path) as conn:
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    conn.close()
    data = bytearray(path.read_bytes())
    data[4096 * 2:4096 * 2 + 2048] = b"\xa5" * 2048  # a page overwritten in the middle
    path.write_bytes(bytes(data))
    before = path.read_bytes()
    with pytest.raises(MeasurementDbError):
        MeasurementDb(path)
    assert path.read_bytes() == before


def test_bad_rows_are_refused_with_their_problem_and_an_import_keeps_the_good_ones(tmp_path):
    with MeasurementDb(tmp_path / "m.sqlite") as db:
        with pytest.raises(MeasurementDbError, match="positive finite"):
            db.add([_row(1), _row(2, median_s=-1.0)])
        assert db.rows() == []  # all or none
        with pytest.raises(MeasurementDbError, match="says why"):
            db.add([_row(1, correct=False)])
        export = {"format": "emmy-measurements", "version": 1,
                  "rows": [dataclasses.asdict(_row(1)), {"gpu": "x"}, dataclasses.asdict(_row(2, p10_s=9.0)), 7]}
        added, skipped = db.import_json(json.dumps(export), "f.json")
        assert added == 1 and len(skipped) == 3
        assert skipped[1].startswith("f.json, row 2: p10_s <= median_s")
        with pytest.raises(MeasurementDbError, match="not an emmy measurement export"):
            db.import_json('{"rows": []}', "g.json")


def _costliest_kernel(program):
    return max(program.tile_ir.kernels, key=lambda tk: tk.seconds)


def test_extraction_takes_a_measured_row_and_avoids_a_row_measured_wrong(tmp_path, monkeypatch):
    code = "x=torch.randn(256,3000); w=torch.randn(3000); F.rms_norm(x,(3000,),w,eps=1e-6)"
    db_path = tmp_path / "m.sqlite"
    monkeypatch.setenv("EMMY_DB", str(db_path))
    program = emmy.optimize(code, target="h200")
    on_h100 = str(_costliest_kernel(emmy.optimize(code, target="h100")).row)
    tile = _costliest_kernel(program)
    ranked = program.ranked_rows(tile.kernel)
    first, second, third = ranked[:3]
    fast = third.total_s * 0.5
    # the two cheapest predicted rows measured 1.2x their prediction, the third half its own
    rows = [_row(i, knobs=str(b.row), signature=tile.signature, median_s=t, p10_s=t * 0.9, p90_s=t * 1.1)
            for i, (b, t) in enumerate(((first, first.total_s * 1.2), (second, second.total_s * 1.2), (third, fast)))]
    with MeasurementDb(db_path) as db:
        db.add(rows)
    measured = emmy.optimize(code, target="h200")
    assert str(_costliest_kernel(measured).row) == str(third.row)
    (kernel_rows,) = measured.explain(top=6).kernels
    assert kernel_rows.ranked[0].measured and kernel_rows.ranked[0].total_s == pytest.approx(fast)
    # a row not measured is priced at its prediction times the kernel's median measured/predicted ratio
    unmeasured = next(b for b in kernel_rows.ranked if not b.measured)
    assert unmeasured.scale == pytest.approx(1.2)
    # measured wrong on the GPU: never picked while another row is offered
    with MeasurementDb(db_path) as db:
        db.add([_row(0, knobs=str(third.row), correct=False, median_s=None, p10_s=None, p90_s=None, repetitions=0,
                     error="bias", signature=tile.signature, measured_at="2026-12-05T00:00:00")])
    avoided = emmy.optimize(code, target="h200")
    assert str(_costliest_kernel(avoided).row) != str(third.row)
    # rows of the H200 change nothing on an H100
    assert str(_costliest_kernel(emmy.optimize(code, target="h100")).row) == on_h100


def test_the_rows_shipped_with_the_package_steer_a_fresh_machine():
    """No database here (tests point EMMY_DB at no file): the H200 rows in emmy/data/ measured
    RMSNorm over 16384x4096 on the GPU, and its measured-fastest row is the one extracted among
    the rows of the forms measured (STAGE= : rows held in registers came after those rows)."""
    with open(os.path.join(emmy.__path__[0], "data", "measurements.json")) as f:
        shipped = json.load(f)
    program = emmy.optimize("x=torch.randn(16384,4096); w=torch.randn(4096); F.rms_norm(x,(4096,),w,eps=1e-6)",
                            target="sm_90", knobs="STAGE=")
    tile = _costliest_kernel(program)
    mine = [r for r in shipped["rows"] if r["signature"] == tile.signature and r["correct"]]
    assert len(mine) >= 10
    best = min(mine, key=lambda r: r["median_s"])
    assert str(tile.row) == best["knobs"] and tile.seconds == pytest.approx(best["median_s"])


def test_emmy_db_export_and_import_from_the_command_line(tmp_path):
    source, target = tmp_path / "a.sqlite", tmp_path / "b.sqlite"
    with MeasurementDb(source) as db:
        db.add([_row(i) for i in range(5)])
    out = tmp_path / "rows.json"
    done = run_emmy("db", "export", "-o", str(out), "--target", "sm_90", env={"EMMY_DB": str(source)})
    assert done.returncode == 0, done.stderr
    done = run_emmy("db", "import", str(out), env={"EMMY_DB": str(target)})
    assert done.returncode == 0 and "imported 5 rows" in done.stdout, done.stderr
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    done = run_emmy("db", "import", str(bad), env={"EMMY_DB": str(target)})
    assert done.returncode == 2 and "bad.json is not JSON" in done.stderr and "Traceback" not in done.stderr
    garbage = tmp_path / "garbage.sqlite"
    garbage.write_bytes(b"x" * 5000)
    done = run_emmy("db", "export", env={"EMMY_DB": str(garbage)})
    assert done.returncode == 2 and "is not an emmy measurement database" in done.stderr
