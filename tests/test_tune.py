"""`emmy tune` end to end with the CPU simulator as its device (real capture, lowering, g++,
simulator, SQLite), its candidates, and its one-line refusals."""

from __future__ import annotations

import shutil

import pytest

import emmy
from emmy.measure_db import MeasurementDb
from emmy.schedule.measured import Measurements
from emmy.tune import EXPLORE_WITHIN, candidates
from tests.conftest import run_emmy

RMS = "x=torch.randn(8,1000); w=torch.randn(1000); F.rms_norm(x,(1000,),w,eps=1e-6)"
SLOW_RMS = "x=torch.randn(512,2048); w=torch.randn(2048); F.rms_norm(x,(2048,),w,eps=1e-6)"


def test_candidates_are_the_pick_the_model_s_next_rows_and_a_drawn_share_within_reach():
    program = emmy.optimize(RMS, target="sm_90")
    (tile,) = program.tile_ir.kernels
    found = candidates(program, 8)
    assert len(found) == 8 and found[0].label == "pick" and found[0].row == tile.row
    assert len({str(c.row) for c in found}) == 8
    ranked = [b.row for b in program.ranked_rows(tile.kernel) if b.row != tile.row]
    tops = [c.row for c in found if c.label == "top"]
    assert tops == ranked[:len(tops)] and len(tops) == 5
    explored = [c for c in found if c.label == "explore"]
    assert len(explored) == 2 and all(c.predicted_s <= EXPLORE_WITHIN * tile.seconds for c in explored)
    assert candidates(program, 8) == found  # drawn with a fixed seed: a rerun measures the same rows


def test_tuning_on_the_simulator_records_every_row_as_simulator_time_and_leaves_extraction_alone(tmp_path):
    db = tmp_path / "m.sqlite"
    done = run_emmy("tune", "-c", RMS, "--device", "sim", "--budget", "3", env={"EMMY_DB": str(db)})
    assert done.returncode == 0, done.stderr
    assert "simulator seconds, not GPU figures" in done.stdout and "k_rms_norm" in done.stdout
    with MeasurementDb(db) as store:
        rows = store.rows()
    program = emmy.optimize(RMS, target="sm_90")
    (tile,) = program.tile_ir.kernels
    assert len(rows) == 3 and all(r.correct and r.source == "simulator" and r.median_s > 0 for r in rows)
    assert {r.signature for r in rows} == {tile.signature} and str(tile.row) in {r.knobs for r in rows}
    assert Measurements.of_rows(rows).rows == {}  # a simulator's seconds never price a GPU's kernels


@pytest.mark.skipif(shutil.which("nvidia-smi") is not None, reason="a GPU machine: tuning runs there")
def test_tuning_without_a_gpu_says_so_in_one_line_and_exits_2(tmp_path):
    done = run_emmy("tune", "-c", RMS, env={"EMMY_DB": str(tmp_path / "m.sqlite"), "PATH": "/usr/bin:/bin"})
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1 and "no CUDA GPU here" in done.stderr and "--device sim" in done.stderr
    assert not (tmp_path / "m.sqlite").exists()  # refused before anything was compiled or recorded


def test_bad_tuning_arguments_are_refused_with_what_is_wrong():
    done = run_emmy("tune", "-c", RMS, "--device", "sim", "--budget", "0")
    assert done.returncode == 2 and "--budget must be at least 1" in done.stderr
    done = run_emmy("tune", "-c", RMS, "--device", "sim", "--gpus", "0,x")
    assert done.returncode == 2 and "--gpus takes distinct GPU indices" in done.stderr


@pytest.mark.parametrize("how", ["hang", "crash"])
def test_a_worker_that_hangs_or_dies_costs_one_candidate_and_the_run_goes_on(tmp_path, how):
    """The measuring runs in a watched worker: stopped (SIGSTOP, a hang) it is killed after the
    watchdog and its candidate recorded as hung; killed (a crash) its candidate, if it was measuring
    one, recorded as a fault. Either way a new worker measures the rest and every candidate ends
    with one row."""
    import os
    import signal
    import subprocess
    import time
    from pathlib import Path

    from tests.conftest import EMMY

    db = tmp_path / "m.sqlite"
    # rows of 2048: each candidate's checks and runs in the simulator take a second or two (its
    # build is done ahead, outside the watchdog), so the signal lands while the worker measures,
    # and a watchdog of 15 s is well past a candidate that is not stopped
    env = dict(os.environ, EMMY_DB=str(db), EMMY_SIM_MODE="plain", EMMY_CACHE_DIR=str(tmp_path / "cache"))
    parent = subprocess.Popen([str(EMMY), "tune", "-c", SLOW_RMS, "--device", "sim", "--budget", "3", "--watchdog", "15"],
                              env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    def stored() -> int:
        if not db.exists():
            return 0
        with MeasurementDb(db) as store:
            return len(store.rows())

    begun = time.monotonic()
    while stored() < 1 and time.monotonic() - begun < 240 and parent.poll() is None:
        time.sleep(0.2)
    workers = [int(p.name) for p in Path("/proc").iterdir() if p.name.isdigit() and _parent_of(p) == parent.pid]
    assert len(workers) == 1 and stored() >= 1
    os.kill(workers[0], signal.SIGSTOP if how == "hang" else signal.SIGKILL)
    out, err = parent.communicate(timeout=300)
    assert parent.returncode == 0, err[-3000:]
    assert ("no progress for 15 s" if how == "hang" else "worker 0: ") in out
    with MeasurementDb(db) as store:
        rows = store.rows()
    program = emmy.optimize(SLOW_RMS, target="sm_90")
    assert sorted(r.knobs for r in rows) == sorted(str(c.row) for c in candidates(program, 3))  # one row each
    lost = [r for r in rows if not r.correct]
    if how == "hang":
        assert len(lost) <= 1 and all(r.error.startswith("hung: no result within 15 s") for r in lost)
        assert lost or "killed" in out
    else:
        assert all(r.error.startswith("fault on the GPU: the worker died") for r in lost)
    assert all(r.source == "simulator" for r in rows)


def _parent_of(proc) -> int:
    try:
        return int((proc / "stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return -1


def _scripted_worker(tmp_path, *runs: str) -> list[str]:
    """A worker command whose n-th process runs the n-th snippet: real processes, so the supervisor's
    pipes, exits and restarts are the real ones, each start's behaviour chosen."""
    import sys

    count = tmp_path / "starts"
    body = "\n".join(["import sys, pathlib", f"count = pathlib.Path({str(count)!r})",
                      "n = int(count.read_text()) if count.exists() else 0", "count.write_text(str(n + 1))",
                      f"runs = {list(runs)!r}", "exec(runs[min(n, len(runs) - 1)])"])
    return [sys.executable, "-c", body]


def test_a_worker_whose_first_process_fails_before_measuring_is_an_error_naming_its_exit_status(tmp_path):
    from emmy.errors import EmmyError
    from emmy.tune_workers import supervise

    lost = []
    with pytest.raises(EmmyError, match=r"tuning worker 0 failed \(exit status 3\) before measuring anything"):
        supervise(_scripted_worker(tmp_path, "sys.exit(3)"), [None], 60, 5, lambda *row: lost.append(row))
    assert lost == []


def test_a_restarted_worker_that_dies_starting_is_started_again_not_an_error(tmp_path):
    """The first process measures a candidate and faults after storing it; the second dies before
    announcing anything (as a worker killed while it compiles); the third finishes. Dying while
    starting is a restart, counted, once the worker has measured."""
    from emmy.tune_workers import START, STORED, supervise

    measures_then_faults = f"print({START + 'abc WORK=t1'!r}); print({STORED!r}, flush=True); sys.exit(1)"
    lost, stored = [], []
    events = supervise(_scripted_worker(tmp_path, measures_then_faults, "sys.exit(9)", "sys.exit(0)"), [None], 60, 5,
                       lambda *row: lost.append(row), on_stored=lambda: stored.append(1))
    assert (tmp_path / "starts").read_text() == "3" and stored == [1] and lost == []
    assert len(events) == 2 and all("exit status" in e and "started again" in e for e in events)


def test_the_simulator_device_builds_every_candidate_ahead_so_the_watchdog_times_only_its_runs(tmp_path, monkeypatch):
    from emmy.measure import SimDevice

    monkeypatch.setenv("EMMY_CACHE_DIR", str(tmp_path))
    program = emmy.optimize(RMS, target="sm_90")
    variants = [program.with_rows({c.kernel: c.row}) for c in candidates(program, 3)]
    assert SimDevice().prepare(variants) == [None] * 3
    assert len(list((tmp_path / "sim").glob("*-plain.so"))) == 3
