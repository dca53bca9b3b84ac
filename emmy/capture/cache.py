"""The on-disk capture cache for `-c` code: what capture and decomposition made of a code string
(Tensor IR, weight values, the example inputs as numpy, the `--ir torch` text), so that compiling
the same code again needs neither torch.export nor torch itself.

Keyed on the code, the installed torch's and emmy's versions and a digest of emmy's capture and
decomposition sources (a changed decomposition must not reuse old Tensor IR). Entries are written
atomically; an unreadable entry is a miss (and is replaced), never an error.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import os
import pickle
import tempfile
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

log = logging.getLogger(__name__)

FORMAT = 2


@dataclass(frozen=True)
class CachedCapture:
    """Stands in for emmy.capture.Captured where only what it produced is needed."""
    code: str
    tensor_program: object  # emmy.decompose.from_aten.TensorProgram
    inputs: tuple  # (numpy array in interpreter storage, DType) per user input
    torch_ir: str
    outputs: object = None  # emmy.capture.outputs.OutputStructure

    @property
    def example_inputs(self) -> tuple:
        from emmy.dtypes import from_numpy

        return tuple(from_numpy(values, dtype) for values, dtype in self.inputs)


def is_cached(code: str, cache_dir: Path) -> bool:
    """Whether an entry for `code` exists (lookup may still find it unreadable)."""
    return _path(code, cache_dir).exists()


def lookup(code: str, cache_dir: Path) -> CachedCapture | None:
    path = _path(code, cache_dir)
    if not path.exists():
        return None
    try:
        with open(path, "rb") as fh:
            entry = pickle.load(fh)
        if isinstance(entry, CachedCapture) and entry.code == code:
            log.info("capture cache: hit %s", path.name)
            return entry
    except Exception as err:  # a truncated or stale entry: compile as if it were not there
        log.warning("capture cache: ignoring unreadable %s (%s)", path.name, err)
    return None


def store(code: str, program, cache_dir: Path) -> None:
    """Remember `program`'s capture (emmy.program.Program built from `code`)."""
    from emmy.capture.printer import print_torch_ir
    from emmy.dtypes import real_pairs, to_numpy

    if getattr(program.example_inputs, "pending", 0):  # its inputs are too large to keep on disk
        log.info("capture cache: not storing a capture with inputs over EMMY_LAZY_INPUT_MB")
        return
    decomposed = program.tensor_program  # first: an unsupported op or input dtype is refused by name here
    # a complex input is kept as its real pairs, which the compiled program takes as well
    inputs = tuple(to_numpy(real_pairs(t)) for t in program.example_inputs)
    entry = CachedCapture(code, decomposed, inputs, print_torch_ir(program.captured), program.captured.outputs)
    path = _path(code, cache_dir)
    path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile(dir=path.parent, delete=False) as fh:
        pickle.dump(entry, fh)
    os.replace(fh.name, path)


def _path(code: str, cache_dir: Path) -> Path:
    key = hashlib.sha256("\0".join([str(FORMAT), code, _version("torch"), _version("emmy"),
                                    _sources_digest()]).encode()).hexdigest()[:32]
    return cache_dir / "capture" / f"{key}.pickle"


def _version(package: str) -> str:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return "none"


@functools.lru_cache(maxsize=1)
def _sources_digest() -> str:
    root = Path(__file__).resolve().parent.parent
    digest = hashlib.sha256()
    for folder in ("capture", "decompose", "tensor_ir"):
        for source in sorted((root / folder).glob("*.py")):
            digest.update(source.read_bytes())
    for module in ("dtypes.py", "affine.py"):  # the types and index algebra decompositions build with
        digest.update((root / module).read_bytes())
    return digest.hexdigest()
