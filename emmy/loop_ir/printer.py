"""`--ir loop`: one section per kernel, loops indented, one statement a line."""

from __future__ import annotations

import re

from emmy.affine import Affine
from emmy.loop_ir.nodes import Accumulate, Assign, Init, Lit, Load, Loop, LoopProgram, Masked, Op, Store, Update
from emmy.tensor_ir.printer import literal

ACCUMULATE_OP = {"sum": "add", "prod": "multiply", "max": "maximum", "min": "minimum"}
IDENTITY = {"sum": 0.0, "prod": 1.0, "max": float("-inf"), "min": float("inf")}


def _index(expr: Affine) -> str:
    return re.sub(r"\bd(\d+)", r"a\1", str(expr))


def _operand(value) -> str:
    return literal(value.value) if isinstance(value, Lit) else value


def _expr(expr) -> str:
    if isinstance(expr, Load):
        text = f"load {expr.buffer}[{', '.join(_index(e) for e in expr.index)}]"
        if expr.guards:  # made only where the guards hold
            text += " where " + " and ".join(re.sub(r"\bd(\d+)", r"a\1", str(g)) for g in expr.guards)
        return text
    if isinstance(expr, Op):
        return f"{expr.op}({', '.join(_operand(a) for a in expr.args)})"
    if isinstance(expr, Masked):
        conds = " and ".join(re.sub(r"\bd(\d+)", r"a\1", str(g)) for g in expr.guards)
        return f"{_operand(expr.value)} if {conds} else {literal(expr.fill)}"
    raise TypeError(expr)


def statement_text(stmt) -> str:
    """One non-loop statement as `--ir loop` prints it."""
    if isinstance(stmt, Assign):
        op = _expr(stmt.expr)
        return f"{stmt.name} = {'cast<' + str(stmt.dtype) + '>' + op[4:] if op.startswith('cast(') else op}"
    if isinstance(stmt, Init):
        return f"{stmt.acc} = {literal(IDENTITY[stmt.op])}"
    if isinstance(stmt, Accumulate):
        return f"{stmt.acc} <- {ACCUMULATE_OP[stmt.op]}({stmt.acc}, {_operand(stmt.value)})"
    if isinstance(stmt, Update):
        return f"{stmt.acc} := {_operand(stmt.value)}"
    if isinstance(stmt, Store):
        return f"{stmt.buffer}[{', '.join(_index(e) for e in stmt.index)}] = {_operand(stmt.value)}"
    raise TypeError(stmt)


def _lines(body, depth: int, out: list[str]) -> None:
    pad = "  " * depth
    for stmt in body:
        if isinstance(stmt, Loop):
            out.append(f"{pad}for a{stmt.var} in 0..{stmt.extent}")
            _lines(stmt.body, depth + 1, out)
        else:
            out.append(pad + statement_text(stmt))


def padded_text(pad: str, stmt) -> str:
    """A statement as `--ir loop` prints it, every line led by `pad`: a loop (a kernel's serial
    inner loop) spans several lines."""
    lines: list[str] = []
    _lines((stmt,), 0, lines)
    return "\n".join(pad + line for line in lines)


def print_loop_ir(program: LoopProgram) -> str:
    out: list[str] = []
    for k, kernel in enumerate(program.kernels):
        out.append(f"=== {k}: {kernel.name} ===")
        out += [f"out {name}: {t}" for name, t in kernel.outputs]
        _lines(kernel.body, 0, out)
    return "\n".join(out) + "\n"
