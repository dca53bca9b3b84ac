"""Documentation that runs: every fenced block of README.md and docs/*.md says what it is, and every
command and code block runs here, its shown output checked, so the docs cannot rot.

Fences (the info string after the backticks):
- `sh`: shell commands, one a line (a trailing backslash continues one); run from a scratch folder
  that links the repository's .venv, tests, benchmarks, rules and cuda_templates, with a capture
  cache shared by the doc's commands. A command marked `# on a GPU machine` runs only where
  nvidia-smi finds a GPU; `make run` and `make test` are the README's two jobs, which CI and each
  stop run themselves (a test cannot run the suite it is part of).
- `python`: run in one namespace per document, in the same scratch folder; `python file=NAME`
  writes the block to NAME (a module a later block or command loads).
- `text` right after a code block: the output that block prints. Each shown line must appear in
  the output, in order (trailing spaces aside); a line `...` stands for any lines, and a line
  ending in ` ...` for any line that begins with the rest. Elsewhere a `text` block is a figure
  and is not run.
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import shlex
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
KINDS = ("sh", "python", "text")
LINKED = (".venv", "tests", "benchmarks", "rules", "cuda_templates")
README_JOBS = ("make run", "make test")


@dataclass(frozen=True)
class Block:
    kind: str
    options: dict
    text: str
    line: int  # where the fence opens, 1-based
    output: str | None = None  # the `text` block that follows, if any


def blocks(path: Path) -> list[Block]:
    found: list[Block] = []
    lines = path.read_text().splitlines()
    k = 0
    while k < len(lines):
        fence = re.match(r"^```(.*)$", lines[k])
        if not fence:
            k += 1
            continue
        info = fence.group(1).split()
        end = next(j for j in range(k + 1, len(lines)) if lines[j].startswith("```"))
        kind = info[0] if info else ""
        options = dict(o.split("=", 1) for o in info[1:] if "=" in o)
        block = Block(kind, options, "\n".join(lines[k + 1:end]), k + 1)
        if kind == "text" and found and found[-1].kind in ("sh", "python") and found[-1].output is None \
                and _adjacent(lines, found[-1], k):
            found[-1] = Block(found[-1].kind, found[-1].options, found[-1].text, found[-1].line, block.text)
        else:
            found.append(block)
        k = end + 1
    return found


def _adjacent(lines: list[str], previous: Block, start: int) -> bool:
    """Only blank lines between the previous block's closing fence and this one."""
    close = previous.line + previous.text.count("\n") + 2  # 1-based line of its closing fence
    return all(not line.strip() for line in lines[close:start])


def check_output(shown: str, actual: str, where: str) -> None:
    """Each shown line appears in `actual`, in order; `...` skips any lines."""
    got = [line.rstrip() for line in actual.splitlines()]
    at = 0
    for want in (line.rstrip() for line in shown.splitlines()):
        if want == "...":
            continue
        prefix = want[:-4].rstrip() if want.endswith(" ...") else None
        found = next((k for k in range(at, len(got))
                      if (got[k].startswith(prefix) if prefix is not None else got[k] == want)), None)
        if found is not None:
            at = found + 1
        else:
            raise AssertionError(f"{where}: the shown line\n  {want!r}\nis not in the output (after line {at}):\n"
                                 + "\n".join(got[:200]))


def commands(text: str) -> list[str]:
    joined = re.sub(r"\s*\\\n\s*", " ", text)
    return [line.strip() for line in joined.splitlines() if line.strip() and not line.strip().startswith("#")]


def _has_gpu() -> bool:
    return shutil.which("nvidia-smi") is not None and subprocess.run(
        ["nvidia-smi", "-L"], capture_output=True).returncode == 0


def _scratch(tmp_path: Path) -> Path:
    work = tmp_path / "work"
    work.mkdir()
    for name in LINKED:
        (work / name).symlink_to(ROOT / name)
    return work


def run_document(path: Path, tmp_path: Path, monkeypatch) -> int:
    """Run every block of one document; the number of commands and code blocks run."""
    work = _scratch(tmp_path)
    # the doc's own caches, database and calibrations: a fit a doc writes must not price the GPUs of
    # tests that run after it in this process
    env = dict(os.environ, EMMY_CACHE_DIR=str(tmp_path / "cache"), EMMY_DB=str(tmp_path / "db.sqlite"),
               EMMY_CALIBRATION_DIR=str(tmp_path / "calibration"))
    env["PATH"] = f"{ROOT / '.venv' / 'bin'}{os.pathsep}{env['PATH']}"
    for name in ("EMMY_CACHE_DIR", "EMMY_DB", "EMMY_CALIBRATION_DIR"):
        monkeypatch.setenv(name, env[name])
    monkeypatch.chdir(work)
    namespace: dict = {"__name__": "__doc__"}
    gpu = _has_gpu()
    ran = 0
    for block in blocks(path):
        where = f"{path.relative_to(ROOT)}:{block.line}"
        assert block.kind in KINDS, f"{where}: a fence must say what it holds ({', '.join(KINDS)}), not {block.kind!r}"
        if block.kind == "python" and "file" in block.options:
            (work / block.options["file"]).write_text(block.text + "\n")
        elif block.kind == "python":
            out = io.StringIO()
            with contextlib.redirect_stdout(out):
                exec(compile(block.text, where, "exec"), namespace)  # noqa: S102 - the docs' own code
            ran += 1
            if block.output is not None:
                check_output(block.output, out.getvalue(), where)
        elif block.kind == "sh":
            printed = []
            for command in commands(block.text):
                if command.startswith(README_JOBS) or ("# on a GPU machine" in command and not gpu):
                    continue
                done = subprocess.run(command, shell=True, cwd=work, env=env, capture_output=True, text=True,
                                      timeout=600)
                assert done.returncode == 0, f"{where}: `{command}` exited {done.returncode}:\n{done.stderr[-3000:]}"
                printed.append(done.stdout)
                ran += 1
            if block.output is not None:
                check_output(block.output, "".join(printed), where)
    return ran


@pytest.mark.parametrize("path", DOCS, ids=[p.name for p in DOCS])
def test_the_document_runs_and_shows_what_it_prints(path, tmp_path, monkeypatch):
    before = dict(os.environ)
    try:
        run_document(path, tmp_path, monkeypatch)
    finally:  # what a doc's own code set in os.environ goes with it
        os.environ.clear()
        os.environ.update(before)


def test_every_fence_says_what_it_holds_and_docs_cite_only_files_that_exist():
    for path in DOCS:
        text = path.read_text()
        for block in blocks(path):
            assert block.kind in KINDS, f"{path.name}:{block.line}: fence {block.kind!r}"
        for cited in re.findall(r"`((?:emmy|docs|benchmarks|tests|rules|extract|cuda_templates)/[\w./-]+)`", text):
            target = ROOT / cited.rstrip(".")
            assert target.exists() or target.with_suffix(".py").exists(), f"{path.name} cites {cited}, which is missing"
        assert "DESIGN.md" not in text and "ANCHORS.md" not in text, f"{path.name} cites a file outside the repository"


def test_the_checker_fails_a_shown_line_that_is_not_printed():
    check_output("a\n...\nc", "a\nb\nc\n", "here")
    check_output("b ...", "a\nb and more\n", "here")
    with pytest.raises(AssertionError, match="'d'"):
        check_output("a\nd", "a\nb\nc\n", "here")
    with pytest.raises(AssertionError):
        check_output("c\na", "a\nb\nc\n", "here")  # out of order


def test_the_parser_pairs_output_with_the_block_before_it(tmp_path):
    doc = tmp_path / "d.md"
    doc.write_text("```sh\necho hi\n```\n\n```text\nhi\n```\n\n```text\nfigure\n```\n")
    parsed = blocks(doc)
    assert [(b.kind, b.output) for b in parsed] == [("sh", "hi"), ("text", None)]
    assert commands("emmy a \\\n  --b\n# comment\nemmy c") == ["emmy a --b", "emmy c"]
    assert shlex.split(commands("emmy 'x y'")[0]) == ["emmy", "x y"]
