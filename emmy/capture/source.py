"""Where captured code came from, so errors can point at a line."""

from __future__ import annotations

import functools
import os
import re
from dataclasses import dataclass

from emmy.errors import CodeError

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
        """The line's text, or the whole statement where the line is part of one written over several
        (`if (mask is not None` alone would name the wrong test), as one line."""
        lines, statements = _read(self.code) if filename == CODE_FILENAME else _file(filename)
        if not 0 < line <= len(lines):
            return ""
        return statements.get(line, lines[line - 1].strip())

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


_STATEMENT_TEXT_LIMIT = 200


@functools.lru_cache(maxsize=32)  # asked for every op an IR listing prints: the file is read once
def _file(filename: str) -> tuple[list[str], dict[int, str]]:
    import linecache

    return _read("".join(linecache.getlines(filename)))


def _read(text: str) -> tuple[list[str], dict[int, str]]:
    """A text's lines, and the one-line form of each line of a multi-line statement."""
    return text.splitlines(), _multi_line_statements(text)


@functools.lru_cache(maxsize=32)
def _multi_line_statements(text: str) -> dict[int, str]:
    """Line -> its statement as one line, for each line of a statement written over several lines
    (a compound statement's header only: `if (...):`, `for ... in (...):`); code that does not
    parse gives none. Comments and line breaks are gone (ast.unparse). A statement too long to quote
    (a table of lambdas, a long call) gives none either: its line alone says more than its start."""
    import ast

    try:
        tree = ast.parse(text)
    except (SyntaxError, ValueError):
        return {}
    found = {}
    for node in ast.walk(tree):
        header = _header(node) if isinstance(node, ast.stmt) else None
        if header is None:
            continue
        last, said = header
        if last <= node.lineno:
            continue
        if len(said) > _STATEMENT_TEXT_LIMIT:
            continue
        found.update({line: said for line in range(node.lineno, last + 1)})
    return found


def _header(node) -> tuple[int, str] | None:
    """(the last line, the text) of a statement's header: a simple statement whole, a compound one up
    to its colon; None for definitions (their lines are not where ops are made)."""
    import ast

    if isinstance(node, (ast.If, ast.While)):
        keyword = "if" if isinstance(node, ast.If) else "while"
        return node.test.end_lineno, f"{keyword} {ast.unparse(node.test)}:"
    if isinstance(node, ast.For):
        return node.iter.end_lineno, f"for {ast.unparse(node.target)} in {ast.unparse(node.iter)}:"
    if isinstance(node, ast.With):
        return node.items[-1].context_expr.end_lineno, f"with {', '.join(ast.unparse(i) for i in node.items)}:"
    if any(hasattr(node, part) for part in ("body", "cases", "handlers")):  # definitions, try, match
        return None
    return node.end_lineno, ast.unparse(node)


def parse_program(code: str, label: str):
    """The code's syntax tree, or the CodeError a user sees: a syntax error (line, column, caret), no
    statement, or a last statement that is not an expression. Torch-free, so the CLI says it before
    starting a capture."""
    import ast

    try:
        tree = ast.parse(code, CODE_FILENAME)
    except SyntaxError as err:
        line = err.lineno or 1
        col = err.offset or 1
        text = (err.text or "").rstrip("\n")
        raise CodeError(
            f"syntax error in {label} at line {line}, column {col}: {err.msg}",
            detail=f"  {text}\n  {' ' * (col - 1)}^" if text else "",
        ) from None
    if not tree.body:
        raise CodeError(f"the {label} is empty; its last statement must be an expression giving a tensor")
    last = tree.body[-1]
    if not isinstance(last, ast.Expr):
        kind = _STATEMENT_KINDS.get(type(last).__name__, "a " + type(last).__name__.lower() + " statement")
        raise CodeError(
            f"the last statement of {label} (line {last.lineno}) is {kind}, not an expression; "
            "end the code with the expression whose tensor emmy should compile",
            detail="  " + (ast.get_source_segment(code, last) or "").splitlines()[0],
        )
    return tree


_STATEMENT_KINDS = {
    "Assign": "an assignment",
    "AugAssign": "an augmented assignment",
    "AnnAssign": "an annotated assignment",
    "For": "a for loop",
    "While": "a while loop",
    "If": "an if statement",
    "FunctionDef": "a function definition",
    "ClassDef": "a class definition",
    "Import": "an import",
    "ImportFrom": "an import",
}
