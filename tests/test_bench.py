"""`emmy bench` without a GPU: its one-line refusal, and its table, JSON and PNG from the times the
first H200 run measured (benchmarks/results/2026-12-04-h200)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from emmy.bench import BenchRow, table_rows, write
from tests.conftest import run_emmy

H200 = Path(__file__).resolve().parent.parent / "benchmarks" / "results" / "2026-12-04-h200" / "results.json"


def test_the_table_json_and_plot_of_measured_times(tmp_path):
    rows = json.loads(H200.read_text())["rows"]
    job = "suite/rmsnorm_16384x4096"
    emmy_s = next(r["measured_ms"] for r in rows if r["job"] == job and r.get("label") == "chosen") * 1e-3
    eager_s = next(r["median_ms"] for r in rows if r["job"] == job and r.get("mode") == "eager") * 1e-3
    measured = [BenchRow("rmsnorm", emmy_s, eager_s, None, "torch.compile: not timed"),
                BenchRow("softmax", None, 1e-4, 9e-5, "emmy: softmax: bias")]
    cells = table_rows(measured)
    assert cells[0][4] == f"{eager_s / emmy_s:.2f}x" and cells[0][5] == "-" and cells[1][1] == "-"
    write(measured, tmp_path, "NVIDIA H200")
    saved = json.loads((tmp_path / "bench.json").read_text())
    assert saved["gpu"] == "NVIDIA H200" and saved["rows"][0]["emmy_s"] == emmy_s
    assert (tmp_path / "bench.png").stat().st_size > 5_000


@pytest.mark.skipif(shutil.which("nvidia-smi") is not None, reason="a GPU machine: bench runs there")
def test_bench_without_a_gpu_says_so_in_one_line():
    done = run_emmy("bench", "-c", "x=torch.randn(8); x+x")
    assert done.returncode == 2 and done.stderr.count("\n") == 1 and "no CUDA GPU here" in done.stderr
    done = run_emmy("bench", "--suite", "x")
    assert done.returncode == 2 and "unknown --suite 'x'; suites: small" in done.stderr
