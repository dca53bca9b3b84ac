"""User-facing errors.

Every error a user can cause is an `EmmyError`: the CLI prints its message
(one line, sometimes followed by the offending source line and a caret) and
exits with status 2; a traceback appears only with `-v`.
"""

from __future__ import annotations


class EmmyError(Exception):
    """Bad input: what is wrong and where. Exit status 2 in the CLI."""

    exit_code = 2

    def __init__(self, message: str, *, detail: str = ""):
        super().__init__(message)
        self.message = message
        # Extra lines shown under the message (a source line and a caret).
        self.detail = detail

    def render(self) -> str:
        return self.message + ("\n" + self.detail if self.detail else "")


class CodeError(EmmyError):
    """The `-c` code is malformed or failed while running."""


class UnsupportedOpError(EmmyError):
    """An ATen op that emmy cannot decompose into Tensor IR."""


class UnsupportedDtypeError(EmmyError):
    """A dtype that emmy's kernels do not handle."""


class UnknownTargetError(EmmyError):
    """A `--target` that is not in the target table."""


class StageNotBuiltError(EmmyError):
    """A pipeline stage that does not exist yet."""


class IndexOutOfRangeError(EmmyError):
    """An index tensor (embedding ids, gather indices) holds a value outside the axis it indexes."""


class KernelFault(Exception):
    """A kernel did what a GPU would not forgive: an out-of-bounds access, a deadlock at a barrier or
    warp collective, a shared-memory race. Found by the simulator; exit status 1 (a failed check)."""

    exit_code = 1


class KernelBuildError(EmmyError):
    """A kernel source that the host compiler (simulator) or nvcc rejects."""
