"""Turn torch.export failures into errors that say what and where."""

from __future__ import annotations

import re
import traceback

from emmy.capture.source import CODE_FILENAME, Location, Source
from emmy.errors import CodeError, EmmyError

_DATA_DEPENDENT = ("GuardOnDataDependentSymNode", "DataDependentOutputException", "UserError")
_FRAME = re.compile(r'File "([^"]+)", line (\d+)')


def _location(err: BaseException, source: Source) -> Location | None:
    # Prefer a frame of the user's code in the traceback, then one named in the message.
    frames = [f for f in traceback.extract_tb(err.__traceback__) if f.filename == CODE_FILENAME]
    if frames:
        line = frames[-1].lineno or 0
        return Location(CODE_FILENAME, line, source.line_text(CODE_FILENAME, line))
    for filename, line in reversed(_FRAME.findall(str(err))):
        if filename == CODE_FILENAME or not filename.startswith("/"):
            return Location(filename, int(line), source.line_text(filename, int(line)))
    return None


def is_data_dependent(err: BaseException) -> bool:
    names = {cls.__name__ for cls in type(err).__mro__}
    text = str(err)
    return bool(names & set(_DATA_DEPENDENT[:2])) or "data-dependent" in text or "data dependent" in text


def explain_export_failure(err: BaseException, source: Source) -> EmmyError:
    where = _location(err, source)
    at = f" at {where}" if where else ""
    if is_data_dependent(err):
        return CodeError(
            f"data-dependent control flow{at}: the program branches or loops on tensor values, "
            "which a compiled kernel cannot do; make control flow depend on shapes only"
        )
    first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
    return CodeError(f"torch.export could not capture the program{at}: {type(err).__name__}: {first}")
