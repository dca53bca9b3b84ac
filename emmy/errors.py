"""User-facing errors.

Every error a caller of emmy's API or CLI can meet is an `EmmyError` subclass defined here, so
one `except EmmyError` catches them all: the CLI prints its message (one line, sometimes followed by
the offending source line and a caret) and exits with the class's `exit_code` (2 for bad input,
1 for a kernel that failed its check); a traceback appears only with `-v`. Anything else escaping
emmy is a bug in emmy.
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

    @classmethod
    def sized_by_values(cls, where: str) -> "UnsupportedOpError":
        """The refusal of an op whose result's size depends on tensor values (masked_select, nonzero); the
        fixed-size form of the op `where` names, where it has one emmy compiles."""
        import re

        op = re.search(r"aten\.(\w+)", where)
        name = op.group(1).lstrip("_") if op else ""
        form = next((f for prefix, f in _FIXED_SIZE_FORMS if name.startswith(prefix)), _FIXED_SIZE_FORMS[-1][1])
        return cls(f"unsupported op {where}: the size of its result depends on tensor values (how many "
                   "elements a mask or a count selects), which a compiled program must know before it runs; "
                   f"keep the shape fixed ({form})")


# (the op's name, without leading underscores, starts with; its fixed-size form): the last one the default
_FIXED_SIZE_FORMS = (
    ("bincount", "a fixed number of bins: torch.zeros(n).scatter_add(0, x, weights) or F.one_hot(x, n).sum(0)"),
    ("unique", "torch.sort, then a mask of where a value differs from the one before it; or counts over a "
               "known set of values: (x[..., None] == values).sum(0)"),
    ("repeat_interleave", "repeats as Python ints, or a tensor of repeats whose total is fixed as output_size="),
    ("nonzero", "torch.nonzero_static(x, size=n) with a fill, or torch.where with a fill"),
    ("", "torch.where with a fill instead of masked_select or nonzero"),
)


class UnsupportedDtypeError(EmmyError):
    """A dtype that emmy's kernels do not handle."""


class UnknownTargetError(EmmyError):
    """A `--target` that is not in the target table."""


class StageNotBuiltError(EmmyError):
    """A pipeline stage that does not exist yet."""


class IndexOutOfRangeError(EmmyError):
    """An index tensor (embedding ids, gather indices) holds a value outside the axis it indexes."""


class KernelFault(EmmyError):
    """A kernel did what a GPU would not forgive: an out-of-bounds access, a deadlock at a barrier or
    warp collective, a shared-memory race. Found by the simulator; exit status 1 (a failed check)."""

    exit_code = 1


class KernelBuildError(EmmyError):
    """A kernel source that the host compiler (simulator) or nvcc rejects."""


class NotLoweredError(EmmyError):
    """A kernel's schedule row that the Kernel IR lowering does not handle (such a row is not
    offered to extraction; pinning one with `knobs` or `with_rows` meets this)."""


class GpuError(EmmyError):
    """The CUDA runtime refused: no device, no driver, a launch that failed."""


class NoGpuError(EmmyError):
    """Measuring or running on a GPU was asked for on a machine without one."""


class MeasurementDbError(EmmyError):
    """The database file is not one emmy can use (not SQLite, another program's, corrupt), or a row is bad."""


class UnknownStageError(EmmyError):
    """A pipeline stage name (`stop_after`, `--ir`) that is not one of emmy's stages."""


class SavedProgramError(EmmyError):
    """A saved program file that cannot be loaded: not an emmy program, corrupt, or from another
    emmy version."""


class InputMismatchError(EmmyError):
    """Tensors passed to a compiled program that are not what it was compiled for (count, shape,
    dtype, device)."""


class UnknownParameterError(EmmyError, TypeError):
    """A keyword emmy.optimize does not take: most often a model's own keyword input, which goes
    in example_kwargs."""


class TensorIRError(EmmyError, ValueError):
    """A malformed Tensor IR graph: a bug in a decomposition or in a rule a user wrote."""
