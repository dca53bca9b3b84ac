"""The on-disk capture cache: a repeated `emmy compile` reuses capture and decomposition and
never imports torch; a stale or broken entry is a miss, not an error."""

import subprocess
import sys

from tests.conftest import run_emmy

RMSNORM = "x=torch.randn(1,32,2048); w=torch.randn(2048); F.rms_norm(x,(2048,),w,eps=1e-6)"

PROBE = """
import sys, emmy.cli
code = sys.argv[1]
status = emmy.cli.main(['compile', '-c', code, '--ir', sys.argv[2], '-o', sys.argv[3]])
print('torch' in sys.modules, status)
"""


def _compile_in_process(code, stage, out, env):
    done = subprocess.run([sys.executable, "-c", PROBE, code, stage, str(out)], capture_output=True, text=True,
                          env=env, timeout=300)
    assert done.returncode == 0, done.stderr
    torch_imported, status = done.stdout.split()[-2:]
    return torch_imported == "True", int(status), done.stderr


def test_a_repeated_compile_hits_the_cache_without_importing_torch(tmp_path):
    import os

    env = dict(os.environ, EMMY_CACHE_DIR=str(tmp_path / "cache"))
    entries = lambda: sorted((tmp_path / "cache" / "capture").glob("*.pickle"))  # noqa: E731
    first, second = tmp_path / "first.cu", tmp_path / "second.cu"
    # a cold compile captures in a forked child (emmy.api.capture_ahead): the entry is stored there
    imported, status, _ = _compile_in_process(RMSNORM, "cuda", first, env)
    assert not imported and status == 0 and len(entries()) == 1
    imported, status, _ = _compile_in_process(RMSNORM, "cuda", second, env)
    assert not imported and status == 0 and len(entries()) == 1
    assert first.read_text() == second.read_text()
    # the torch stage comes from the cache too
    imported, status, _ = _compile_in_process(RMSNORM, "torch", tmp_path / "torch.txt", env)
    assert not imported and "aten.rms_norm.default(x, [2048], w, 1e-06)" in (tmp_path / "torch.txt").read_text()
    # other code is a miss: a second entry
    _compile_in_process(RMSNORM.replace("1e-6", "1e-5"), "cuda", tmp_path / "other.cu", env)
    assert len(entries()) == 2


def test_capturing_ahead_in_a_child_gives_the_same_program_as_capturing_here(tmp_path):
    import os

    here = tmp_path / "here.cu"
    env = dict(os.environ, EMMY_CACHE_DIR=str(tmp_path / "fresh"))
    done = subprocess.run([sys.executable, "-c", "import torch\n" + PROBE, RMSNORM, "cuda", str(here)],
                          capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr
    ahead = tmp_path / "ahead.cu"
    env["EMMY_CACHE_DIR"] = str(tmp_path / "other")
    assert _compile_in_process(RMSNORM, "cuda", ahead, env)[1] == 0
    assert here.read_text() == ahead.read_text()


def test_a_capture_that_fails_in_the_child_is_reported_by_the_parent(tmp_path):
    result = run_emmy("compile", "-c", "x=torch.randn(4,4); torch.linalg.eigvalsh(x)", "--ir", "cuda",
                      env={"EMMY_CACHE_DIR": str(tmp_path / "cache")})
    assert result.returncode == 2
    assert "unsupported op aten._linalg_eigh.default (line 1" in result.stderr
    assert result.stderr.count("emmy: error") == 1 and "Traceback" not in result.stderr
    assert not list((tmp_path / "cache" / "capture").glob("*.pickle"))


def test_a_broken_entry_is_a_miss_with_a_warning(tmp_path):
    env = {"EMMY_CACHE_DIR": str(tmp_path)}
    assert run_emmy("compile", "-c", RMSNORM, "--ir", "loop", env=env).returncode == 0
    (entry,) = (tmp_path / "capture").glob("*.pickle")
    entry.write_bytes(b"not a pickle")
    again = run_emmy("compile", "-c", RMSNORM, "--ir", "loop", env=env)
    assert again.returncode == 0 and "=== 0: k_rms_norm ===" in again.stdout
    assert "capture cache: ignoring unreadable" in again.stderr
    third = run_emmy("compile", "-c", RMSNORM, "--ir", "loop", env=env)  # the entry was rewritten
    assert third.returncode == 0 and "ignoring" not in third.stderr


def test_the_key_changes_with_the_torch_version(tmp_path, monkeypatch):
    from emmy.capture import cache

    before = cache._path(RMSNORM, tmp_path)
    monkeypatch.setattr(cache, "_version", lambda package: "9.9.9" if package == "torch" else "0.1.0")
    assert cache._path(RMSNORM, tmp_path) != before
