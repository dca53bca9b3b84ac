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
