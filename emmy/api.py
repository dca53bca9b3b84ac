"""The public entry point."""

from __future__ import annotations

from emmy.program import Program


def optimize(graph, *example_inputs, target: str | None = None, stop_after: str = "tensor") -> Program:
    """Compile a PyTorch program.

    `graph` is `-c`-style code (a string), an `nn.Module` or `fx.GraphModule`
    or plain function (with example inputs), or an ExportedProgram. The target
    defaults to EMMY_TARGET, else sm_90. Every stage up to `stop_after` is
    built now, so its errors surface here; later stages build when asked.
    """
    from emmy.capture import capture
    from emmy.config import settings
    from emmy.extract.targets import get_target

    chosen = get_target(target or settings().target)  # fail fast, before the slow capture
    program = Program(capture(graph, *example_inputs), chosen)
    if stop_after != "torch":
        program.tensor_program  # noqa: B018 - decompose now, so unsupported ops fail here
    return program
