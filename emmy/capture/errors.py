"""Turn torch.export failures into errors that say what and where."""

from __future__ import annotations

import functools
import os
import re
import traceback

from emmy.capture.source import CODE_FILENAME, Location, Source, inside_torch_or_emmy
from emmy.errors import CodeError, EmmyError

_DATA_DEPENDENT = ("GuardOnDataDependentSymNode", "DataDependentOutputException", "UserError")
_FRAME = re.compile(r'File "([^"]+)", line (\d+)')


_CAUSE = re.compile(r"Caused by: \(([^)]+?):(\d+) in (\w+)\)")


@functools.lru_cache(maxsize=1)
def _library_roots() -> tuple[str, ...]:
    """The emmy package and Python's own and installed libraries."""
    import sysconfig

    roots = {os.path.dirname(os.path.abspath(__file__)).rsplit(os.sep, 1)[0]}
    roots |= {os.path.abspath(p) for k, p in sysconfig.get_paths().items()
              if k in ("stdlib", "platstdlib", "purelib", "platlib")}
    return tuple(roots)


def _user_file(filename: str) -> bool:
    """A file of the user's program: not torch, emmy, Python's own library or generated code."""
    if filename.startswith("<") or inside_torch_or_emmy(filename):
        return False
    path = os.path.abspath(filename)
    return not any(path.startswith(root + os.sep) for root in _library_roots())


def _location(err: BaseException, source: Source) -> Location | None:
    # Prefer a frame of the user's code in the traceback (-c code, else their own files), then one
    # named in the message.
    frames = traceback.extract_tb(err.__traceback__)
    code = [f for f in frames if f.filename == CODE_FILENAME]
    if code:
        line = code[-1].lineno or 0
        return Location(CODE_FILENAME, line, source.line_text(CODE_FILENAME, line))
    user = [f for f in frames if _user_file(f.filename)]
    if user:
        frame = user[-1]
        return Location(frame.filename, frame.lineno or 0, source.line_text(frame.filename, frame.lineno or 0))
    for filename, line in reversed(_FRAME.findall(str(err))):
        if filename == CODE_FILENAME or not filename.startswith("/"):
            return Location(filename, int(line), source.line_text(filename, int(line)))
    return None


def is_data_dependent(err: BaseException) -> bool:
    names = {cls.__name__ for cls in type(err).__mro__}
    text = str(err)
    return bool(names & set(_DATA_DEPENDENT[:2])) or "data-dependent" in text or "data dependent" in text


def _public(path: str, function: str) -> bool:
    """A function of torch's library, not the tracing machinery (private modules, fx) that met a
    branch: a dunder such as __init__ counts, a _private function does not."""
    dunder = function.startswith("__") and function.endswith("__")
    return not (function.startswith("_") and not dunder) and \
        not any(part.startswith("_") or part == "fx" for part in path.split("/"))


def _library_branch(err: BaseException) -> str | None:
    """"function, file:line" of torch's own function that branched on a value for the user, from
    torch's message or else the innermost such frame of the traceback; None for the user's own."""
    import sys

    torch = sys.modules.get("torch")
    root = os.path.dirname(os.path.abspath(torch.__file__)) if torch is not None else None
    cause = _CAUSE.search(str(err))
    # torch names the file relative to its own directory; a library outside torch (transformers)
    # is named by a clipped path that is no file of torch's, and is not torch's branch
    if cause and _public(cause.group(1), cause.group(3)) and root \
            and os.path.isfile(os.path.join(root, cause.group(1))):
        return f"{cause.group(3)}, {cause.group(1)}:{cause.group(2)}"
    for frame in reversed(traceback.extract_tb(err.__traceback__)):
        if _user_file(frame.filename) or frame.filename == CODE_FILENAME:
            return None  # the user's frame comes first: their own branch
        path = os.path.abspath(frame.filename)
        if root and path.startswith(root + os.sep) and _public(path[len(root) + 1:], frame.name):
            return f"{frame.name}, {path[len(root) + 1:]}:{frame.lineno}"
    return None


def explain_export_failure(err: BaseException, source: Source) -> EmmyError:
    where = _location(err, source)
    at = f" at {where}" if where else ""
    if is_data_dependent(err):
        branched = _library_branch(err)
        if branched:
            at += f" (inside torch's {branched})"
        return CodeError(
            f"data-dependent control flow{at}: the program branches or loops on tensor values, "
            "which a compiled kernel cannot do; make control flow depend on shapes only"
        )
    first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
    return CodeError(f"torch.export could not capture the program{at}: {type(err).__name__}: {first}")
