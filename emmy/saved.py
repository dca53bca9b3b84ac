"""Saved programs: `program.save(path)` and `emmy.load(path)`.

A file holds what running the program needs and nothing of how it was found: the run plan
(signature, buffers, Kernel IR launches, CUDA text), the knob rows and kernel table, the weights,
the explanation as text, and per target the cubin and the GPU library nvcc built. A loaded program
runs with neither torch.export nor egglog nor nvcc: on CPU tensors in the simulator (which needs the
host C++ compiler, as always), on CUDA tensors through its saved GPU library.

Layout: a magic line, one JSON header line (format, emmy version, build digest, payload length and
SHA-256), then the pickled payload. The header is checked before anything is unpickled, so a file
from another emmy version or a damaged one is refused with a message, not half-read. Like any
pickle, load only files you trust.
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import os
import pickle
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

from emmy.errors import EmmyError, SavedProgramError

log = logging.getLogger(__name__)

MAGIC = b"EMMY-PROGRAM\n"
FORMAT = 1


@dataclass(frozen=True)
class TargetBuild:
    """What nvcc built for one target: the cubin (kernels only) and the GPU library (kernels and the
    host launchers emmy.gpu calls)."""

    cubin: bytes
    library: bytes | None


@dataclass(frozen=True)
class Payload:
    plan: object  # emmy.plan.RunPlan
    weights: dict  # name -> numpy array (interpreter storage)
    kernels: tuple  # emmy.calling.KernelInfo
    explanation: str
    builds: dict  # target (sm_XY) -> TargetBuild


def save(program, path, targets: tuple[str, ...] | None = None) -> None:
    """Write `program` (emmy.program.Program) to `path`, atomically."""
    from emmy import __version__

    targets = tuple(targets or (program.target.name,))
    builds = {}
    if shutil.which("nvcc"):
        for target in targets:  # both cached by content: a second save builds nothing
            library = program.gpu_library().read_bytes() if target == program.target.name else None
            builds[target] = TargetBuild(program.cubin(target).path.read_bytes(), library)
    else:
        log.warning("nvcc is not on PATH: %s is saved without cubins; it runs only in the simulator", path)
    payload = Payload(program.plan, dict(program.weights), program.kernels, program.explain().render(), builds)
    body = pickle.dumps(payload, protocol=pickle.HIGHEST_PROTOCOL)
    header = {"format": FORMAT, "emmy": __version__, "build": build_digest(), "bytes": len(body),
              "sha256": hashlib.sha256(body).hexdigest(), "targets": sorted(builds)}
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile(dir=path.parent, delete=False, prefix=f".{path.name}.") as fh:
        fh.write(MAGIC + json.dumps(header).encode() + b"\n" + body)
    os.replace(fh.name, path)


def load(path) -> LoadedProgram:
    """A program `save` wrote, ready to call; SavedProgramError for a file that is not one, is
    damaged, or comes from another emmy version."""
    from emmy import __version__

    path = Path(path)
    try:
        data = path.read_bytes()
    except OSError as err:
        raise SavedProgramError(f"cannot read the saved program {path}: {err.strerror or err}") from None
    if not data.startswith(MAGIC):
        raise SavedProgramError(f"{path} is not a saved emmy program (it does not start with emmy's marker)")
    line_end = data.find(b"\n", len(MAGIC))
    try:
        header = json.loads(data[len(MAGIC):line_end])
        body = data[line_end + 1:]
        size, digest = int(header["bytes"]), header["sha256"]
    except (ValueError, KeyError, TypeError):
        raise SavedProgramError(f"{path} is damaged: its header cannot be read") from None
    if header.get("format") != FORMAT or header.get("emmy") != __version__ or header.get("build") != build_digest():
        raise SavedProgramError(
            f"{path} was saved by emmy {header.get('emmy')} (file format {header.get('format')}, build "
            f"{str(header.get('build'))[:12]}); this is emmy {__version__} (format {FORMAT}, build "
            f"{build_digest()[:12]}): compile and save the program again with this version")
    if len(body) != size or hashlib.sha256(body).hexdigest() != digest:
        raise SavedProgramError(f"{path} is damaged: its contents do not match their checksum "
                                f"({len(body)} of {size} bytes; truncated or altered)")
    try:
        payload = pickle.loads(body)
    except Exception as err:
        raise SavedProgramError(f"{path} is damaged: its contents cannot be read ({type(err).__name__})") from None
    if not isinstance(payload, Payload):
        raise SavedProgramError(f"{path} does not hold an emmy program")
    return LoadedProgram(path, payload)


class LoadedProgram:
    """A program emmy.load read back: called like the Program it was saved from."""

    example_inputs = None

    def __init__(self, path: Path, payload: Payload):
        self.path = path
        self.plan = payload.plan
        self.weights = payload.weights
        self.kernels = payload.kernels
        self.builds = payload.builds
        self._explanation = payload.explanation

    @property
    def signature(self):
        return self.plan.signature

    @property
    def target(self) -> str:
        return self.plan.target

    @property
    def cuda_source(self) -> str:
        return self.plan.cuda_source

    @property
    def buffer_types(self) -> dict:
        return self.plan.buffer_types

    def explain(self) -> str:
        """The explanation of the program, as it was when saved."""
        return self._explanation

    def __call__(self, *inputs, device: str | None = None, sim_mode: str | None = None, **keywords):
        """As emmy.program.Program.__call__ (no device="interpret": a saved program has no Tensor IR)."""
        from emmy.calling import call, with_keywords

        return call(self, with_keywords(self.signature, inputs, keywords), device, sim_mode)

    def gpu_library(self, device=None) -> Path:
        """The saved GPU library, written once into EMMY_CACHE_DIR/gpu (named by its content)."""
        from emmy.calling import check_arch
        from emmy.config import settings

        build = self.builds.get(self.target)
        if build is None or build.library is None:
            raise EmmyError(f"{self.path} was saved without a GPU library for {self.target} (nvcc was not "
                            "there when it was saved); it runs only in the simulator")
        if device is not None:
            check_arch(self.target, device)
        folder = settings().cache_dir / "gpu"
        library = folder / f"saved-{hashlib.sha256(build.library).hexdigest()[:24]}-{self.target}.so"
        if not library.exists():
            folder.mkdir(parents=True, exist_ok=True)
            with tempfile.NamedTemporaryFile(dir=folder, delete=False) as fh:
                fh.write(build.library)
            os.replace(fh.name, library)
        return library

    def __repr__(self) -> str:
        return f"<emmy program from {self.path}: {self.signature.describe()} on {self.target}>"


@functools.lru_cache(maxsize=1)
def build_digest() -> str:
    """A digest of what a saved payload's meaning rests on: the classes it pickles and the runtime
    headers the CUDA text includes. A development build that changed either refuses old files."""
    from emmy.sim.build import headers_digest

    root = Path(__file__).resolve().parent
    digest = hashlib.sha256(headers_digest().encode())
    for name in ("plan.py", "calling.py", "saved.py", "dtypes.py", "kernel_ir/nodes.py", "tensor_ir/nodes.py",
                 "capture/outputs.py"):
        file = root / name
        if file.exists():
            digest.update(file.read_bytes())
    return digest.hexdigest()
