"""Where captured code came from, so errors can point at a line."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

CODE_FILENAME = "<emmy -c>"

_FRAME = re.compile(r'File "([^"]+)", line (\d+)')


def _inside_torch(filename: str) -> bool:
    import sys

    torch = sys.modules.get("torch")
    root = os.path.dirname(torch.__file__) if torch is not None else None
    return bool(root) and os.path.abspath(filename).startswith(root + os.sep)


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
        # The innermost frame outside torch itself is the user's line.
        user = [f for f in frames if not _inside_torch(f[0])] or frames
        if not user:
            return None
        filename, line = user[-1]
        return Location(filename, int(line), self.line_text(filename, int(line)))
