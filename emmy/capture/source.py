"""Where captured code came from, so errors can point at a line."""

from __future__ import annotations

import functools
import os
import re
from dataclasses import dataclass

CODE_FILENAME = "<emmy -c>"

_FRAME = re.compile(r'File "([^"]+)", line (\d+)')


@functools.lru_cache(maxsize=4096)  # asked for every frame of every op's stack trace
def inside_torch_or_emmy(filename: str) -> bool:
    """Whether a frame is torch's or emmy's own (emmy's substitutes for torch functions run while
    a program is captured), not the user's."""
    import sys

    path = os.path.abspath(filename)
    for name in ("torch", "emmy"):
        package = sys.modules.get(name)
        root = os.path.dirname(package.__file__) if package is not None else None
        if root and path.startswith(root + os.sep):
            return True
    return False


@dataclass(frozen=True)
class Location:
    filename: str
    line: int
    text: str = ""

    def __str__(self) -> str:
        where = f"line {self.line}" if self.filename == CODE_FILENAME else f"{self.filename}:{self.line}"
        return f"{where}: `{self.text}`" if self.text else where


@dataclass(frozen=True)
class Source:
    """The text of `-c` code, when the program came from a string."""

    code: str = ""

    def line_text(self, filename: str, line: int) -> str:
        if filename == CODE_FILENAME:
            lines = self.code.splitlines()
            return lines[line - 1].strip() if 0 < line <= len(lines) else ""
        import linecache

        return linecache.getline(filename, line).strip()

    def locate(self, stack_trace: str | None) -> Location | None:
        """The innermost user frame named in an FX node's stack trace."""
        if not stack_trace:
            return None
        frames = _FRAME.findall(stack_trace)
        # The innermost frame outside torch and emmy is the user's line.
        user = [f for f in frames if not inside_torch_or_emmy(f[0])] or frames
        if not user:
            return None
        filename, line = user[-1]
        return Location(filename, int(line), self.line_text(filename, int(line)))
