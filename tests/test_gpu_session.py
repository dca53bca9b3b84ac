"""benchmarks/gpu_session.py, the one script for a GPU window, without a GPU: its dry run builds
what it would run (real capture, lowering and nvcc), and its report reads the rows the first H200
run recorded (benchmarks/results/2026-12-04-h200/results.json)."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
H200 = ROOT / "benchmarks" / "results" / "2026-12-04-h200" / "results.json"


def _session():
    spec = importlib.util.spec_from_file_location("gpu_session", ROOT / "benchmarks" / "gpu_session.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["gpu_session"] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def test_the_dry_run_builds_a_job_s_variants_and_prints_its_plan(tmp_path):
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "gpu_session.py"), "--dry-run", "--no-smoke",
                           "--only", "check/add3", "--out", str(tmp_path)], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "plan: 1 of 1 jobs built, 1 variants" in done.stdout
    (folder,) = tmp_path.iterdir()
    assert list((folder / "build" / "cubin").glob("*-sm_90.cubin")), "the job's device code was built"
    assert list((folder / "build").glob("module-loader-*.so")), "the cubin loader was built"


def test_a_tuned_job_offers_the_chosen_row_and_distinct_candidates_of_its_costliest_kernel():
    import emmy

    session = _session()
    job = session.Job("suite/x", "x=torch.randn(512,1000); w=torch.randn(1000); F.rms_norm(x,(1000,),w)", 3, 2)
    program = emmy.optimize(job.code, target="sm_90")
    found = session.variants(program, job)
    labels = [label for label, _, _ in found]
    assert labels[0] == "chosen" and labels.count("explore") == 2 and len(found) == 6
    knobs = [records[0]["knobs"] for _, _, records in found]
    assert len(set(knobs)) == len(knobs), "every variant is another row"
    for _, variant, records in found:  # each variant's program is built with the row it records
        assert str(variant.tile_ir.kernels[0].row) == records[0]["knobs"]


def test_the_report_of_the_first_h200_run(tmp_path):
    data = json.loads(H200.read_text())
    session = _session()
    names = {r["job"] for r in data["rows"]}
    jobs = [j for j in session.plan() if j.name in names]
    text = session.report(tmp_path, data["environment"], data["ceilings"], jobs, data["rows"])
    rows = {line.split(" | ")[0].strip("| "): line for line in text.splitlines() if line.startswith("| ")}
    rms = [line for line in text.splitlines() if line.startswith("| suite/rmsnorm_16384x4096 |")]
    assert len(rms) == 2  # in both tables
    measured = json.loads(H200.read_text())["rows"]
    chosen = next(r for r in measured if r["job"] == "suite/rmsnorm_16384x4096" and r.get("label") == "chosen")
    assert f"{chosen['measured_ms'] * 1e3:.1f}" in rms[0]
    best = min(r["measured_ms"] for r in measured if r["job"] == "suite/rmsnorm_16384x4096" and r.get("ok"))
    assert f"{chosen['measured_ms'] / best:.2f} |" in rms[1]  # the regret: the pick over the measured best
    assert "NO: bias" in rows["check/softmax"]
    assert (tmp_path / "predicted_vs_measured.png").stat().st_size > 10_000
