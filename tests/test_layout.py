"""The package installs rules/, extract/ and cuda_templates/ under the emmy namespace only."""

import subprocess
import sys
import zipfile

from tests.conftest import REPO


def _python(code: str, cwd) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=cwd, timeout=120)


def test_optimizer_parts_import_under_emmy_from_anywhere(tmp_path):
    result = _python(
        "import emmy.rules, emmy.extract, emmy.cuda_templates, emmy.extract.targets\n"
        "print(emmy.rules.__file__); print(emmy.extract.__file__)",
        tmp_path,
    )
    assert result.returncode == 0, result.stderr
    rules_file, extract_file = result.stdout.split()
    assert rules_file.endswith("rules/__init__.py") and extract_file.endswith("extract/__init__.py")


def test_no_top_level_rules_or_extract_package(tmp_path):
    for name in ("rules", "extract", "cuda_templates"):
        result = _python(f"import {name}", tmp_path)
        assert result.returncode != 0, f"top-level {name} is importable"
        assert "ModuleNotFoundError" in result.stderr


def test_wheel_maps_the_folders_into_the_emmy_namespace(tmp_path):
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(tmp_path), str(REPO)],
        check=True, capture_output=True, timeout=300,
    )
    (wheel,) = tmp_path.glob("emmy-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert "emmy/rules/__init__.py" in names
    assert "emmy/extract/targets.py" in names
    assert "emmy/cuda_templates/__init__.py" in names
    # every module of the source tree ships (a package missing from pyproject's list would not)
    sources = {f"emmy/{p.relative_to(REPO / 'emmy').as_posix()}" for p in (REPO / "emmy").rglob("*.py")}
    assert sources <= set(names), sorted(sources - set(names))
    assert not any(n.startswith(("rules/", "extract/", "cuda_templates/")) for n in names)
    assert any(n.endswith("entry_points.txt") for n in names)
