import atexit
import collections
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import pytest
import torch

# Every program the tests run in the simulator runs under AddressSanitizer unless the caller says
# otherwise (EMMY_SIM_MODE=plain, or a test's own mode): an out-of-bounds access fails the test.
os.environ.setdefault("EMMY_SIM_MODE", "asan")


def _scratch_dir(prefix: str) -> str:
    """A directory removed when this process ends (the xdist workers inherit the main process's)."""
    path = tempfile.mkdtemp(prefix=prefix)
    atexit.register(shutil.rmtree, path, ignore_errors=True)
    return path


# a developer's own measurement database would change what extraction picks: tests see none (only the
# rows shipped in emmy/data/ and those a test writes)
if "EMMY_DB" not in os.environ:
    os.environ["EMMY_DB"] = os.path.join(_scratch_dir("emmy-test-db-"), "absent.sqlite")
# likewise a developer's own calibration (emmy calibrate's fitted factors): tests price with the cited figures
if "EMMY_CALIBRATION_DIR" not in os.environ:
    os.environ["EMMY_CALIBRATION_DIR"] = _scratch_dir("emmy-test-calibration-")

REPO = Path(__file__).resolve().parent.parent
EMMY = Path(sys.executable).parent / "emmy"  # the installed console script


def run_emmy(*args: str, env: dict | None = None, cwd: str | None = None) -> subprocess.CompletedProcess:
    """Run the real `emmy` console script."""
    full_env = dict(os.environ)
    full_env.update(env or {})
    return subprocess.run([str(EMMY), *args], capture_output=True, text=True, env=full_env, cwd=cwd, timeout=300)


_COMPILED: collections.OrderedDict = collections.OrderedDict()  # key -> Program, least recently used first


def compiled(code: str, target: str | None = None):
    """emmy.optimize(code, target=target), shared by the tests of this worker process that only read the
    program: a reference workload is compiled by a dozen tests, each of which compiled it afresh.
    Keyed on the code, the target, every setting emmy reads from the environment and the stamps of the
    measurement database and the calibration files, so a test that changes what a compile sees
    compiles afresh; the latest 48 kept."""
    import emmy
    from emmy.config import settings
    from emmy.measure_db import default_path
    from emmy.schedule.measured import _stamp

    config = settings()
    calibrations = tuple(sorted((p.name, p.stat().st_mtime_ns) for p in config.calibration_dir.glob("*.json")))
    key = (code, target or config.target, config, _stamp(default_path()), calibrations)
    if key in _COMPILED:
        _COMPILED.move_to_end(key)
        return _COMPILED[key]
    program = _COMPILED[key] = emmy.optimize(code, target=key[1])
    while len(_COMPILED) > 48:
        _COMPILED.popitem(last=False)
    return program


def check_against_torch(program, inputs=None):
    """Interpret the program's Tensor IR and compare every output with torch (float64)."""
    from emmy.checking import compare, reference_outputs

    actual = program.interpret(*(inputs or ()))
    expected = reference_outputs(program.captured, inputs)
    assert len(actual) == len(expected)
    for out, want, name in zip(actual, expected, program.tensor_ir.outputs):
        dtype = program.tensor_ir[name].type.dtype
        result = compare(out.double().numpy(), want, dtype)
        assert result.ok, f"{name}: max abs {result.max_abs:.3g}, max rel {result.max_rel:.3g}"
        assert tuple(out.shape) == want.shape


@pytest.fixture
def fresh_dynamo():
    """torch.compile's caches emptied before and after a test, so each one compiles afresh."""
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


@pytest.fixture
def rng():
    return np.random.default_rng(0)


class Calls(torch.nn.Module):
    """A module whose forward calls `fn` (a lambda as a module, for emmy.optimize and eager alike)."""

    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, *args):
        return self.fn(*args)
