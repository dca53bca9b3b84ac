"""The wheel: `python -m build` packs the rules, templates, runtime headers and shipped data, and a
fresh virtual environment with only the wheel installed (its dependencies borrowed from this one)
compiles and simulates reference workloads from outside the source tree."""

import os
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_the_wheel_carries_what_emmy_reads_and_runs_from_a_fresh_venv(tmp_path):
    dist = tmp_path / "dist"
    built = subprocess.run([sys.executable, "-m", "build", "--wheel", "--no-isolation", "-o", str(dist), str(ROOT)],
                           capture_output=True, text=True, timeout=600)
    assert built.returncode == 0, built.stdout[-2000:] + built.stderr[-2000:]
    (wheel,) = dist.glob("emmy-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    for needed in ("emmy/rules/algebra.py", "emmy/rules/schedules.py", "emmy/cuda_templates/emmy_rt.cuh",
                   "emmy/cuda_templates/emmy_sim.h", "emmy/cuda_templates/host_library.cu.j2",
                   "emmy/cuda_templates/host_common.cuh", "emmy/cuda_templates/module_loader.cu",
                   "emmy/cuda_templates/kernel_ir/MmaTile.j2", "emmy/data/measurements.json",
                   "emmy/extract/targets.py", "emmy/dynamo.py", "emmy/saved.py"):
        assert needed in names, f"the wheel lacks {needed}"
    entry_points = zipfile.ZipFile(wheel).read(next(n for n in names if n.endswith("entry_points.txt"))).decode()
    assert "emmy = emmy.cli:console_main" in entry_points
    assert "[torch_dynamo_backends]" in entry_points and "emmy = emmy.dynamo:emmy_backend" in entry_points

    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    site = Path(subprocess.run([str(venv / "bin" / "python"), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               capture_output=True, text=True, check=True).stdout.strip())
    # torch, egglog and the rest come from this environment (a path, so its editable emmy stays out)
    (site / "borrowed_dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    installed = subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "install", "--no-deps", "--no-index",
                                "--quiet", str(wheel)], capture_output=True, text=True, timeout=300)
    assert installed.returncode == 0, installed.stderr[-2000:]

    outside = tmp_path / "elsewhere"
    outside.mkdir()
    env = dict(os.environ, EMMY_CACHE_DIR=str(tmp_path / "cache"))
    where = subprocess.run([str(venv / "bin" / "python"), "-c", "import emmy; print(emmy.__file__)"], cwd=outside,
                           capture_output=True, text=True, env=env, check=True).stdout.strip()
    assert where.startswith(str(site)), where
    # a row reduction and a tensor-core contraction: every template family the two use, the runtime
    # headers, nvcc for the cubin and the simulator (the whole suite runs in tests/test_workloads.py)
    suite = subprocess.run([str(venv / "bin" / "emmy"), "suite", "--ir", "cuda", "--only", "rmsnorm", "--only",
                            "matmul_f16", "--quiet"], cwd=outside, capture_output=True, text=True, env=env, timeout=900)
    assert suite.returncode == 0, suite.stdout[-3000:] + suite.stderr[-3000:]
    for name in ("rmsnorm", "matmul_f16"):
        row = next(line for line in suite.stdout.splitlines() if line.strip().startswith(name))
        assert "ok" in row.split(), row
