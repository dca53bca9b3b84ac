"""torch.export plus core-ATen decompositions, quietly.

We keep whole the ops that emmy lowers better than their decompositions.
"""

from __future__ import annotations

import contextlib
import io
import logging
import warnings

import torch

KEPT_WHOLE = (
    "scaled_dot_product_attention.default",
    # a training graph's attention (torch.compile on CPU tensors): torch's decomposition returns the
    # attention weights in place of the log-sum-exp its backward reads; emmy lowers the op itself
    "_scaled_dot_product_flash_attention_for_cpu.default",
    "rms_norm.default",
    "_softmax.default",
    "native_layer_norm.default",
    "gelu.default",
    # edge padding (padding_mode reflect / replicate): its decomposition gathers by computed indices
    "reflection_pad1d.default", "reflection_pad2d.default", "reflection_pad3d.default",
    "replication_pad1d.default", "replication_pad2d.default", "replication_pad3d.default",
    # its decomposition gathers by arange + shift, modulo the extent: emmy reads it as one index map
    "roll.default",
    # F.fold: its decomposition accumulates through two index tensors; emmy sums each pixel's taps
    "col2im.default",
)


@contextlib.contextmanager
def quiet_torch():
    """torch.export logs graphs and warnings we report ourselves; silence them."""
    logger = logging.getLogger("torch")
    old = logger.level
    logger.setLevel(logging.CRITICAL)
    try:
        with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()), \
                contextlib.redirect_stderr(io.StringIO()):
            warnings.simplefilter("ignore")
            yield
    finally:
        logger.setLevel(old)


# Ops core ATen keeps whole that emmy takes as torch's own decompositions: resampling reads by
# positions computed from aranges, which emmy folds to constant index tensors (and weights);
# grid sampling reads by positions computed from the grid, which emmy keeps in memory.
DECOMPOSED_TOO = ("upsample_nearest1d", "upsample_nearest2d", "upsample_nearest3d", "_upsample_nearest_exact1d",
                  "_upsample_nearest_exact2d", "_upsample_nearest_exact3d", "upsample_linear1d",
                  "upsample_bilinear2d", "upsample_trilinear3d", "upsample_bicubic2d", "grid_sampler_2d")


def decomposition_table() -> dict:
    from torch._decomp import get_decompositions

    from emmy.capture.corrected import corrected_decompositions
    from emmy.capture.cuda_attention import cuda_attention_decompositions
    from emmy.capture.cuda_cells import cuda_cell_decompositions
    from emmy.capture.fast_paths import fast_path_decompositions
    from emmy.capture.foreach import foreach_decompositions
    from emmy.capture.uncovered import uncovered_decompositions

    table = torch.export.default_decompositions()
    table.update(get_decompositions([getattr(torch.ops.aten, name) for name in DECOMPOSED_TOO]))
    table.update(corrected_decompositions())
    table.update(fast_path_decompositions())
    table.update(cuda_attention_decompositions())
    table.update(cuda_cell_decompositions())
    table.update(foreach_decompositions())
    table.update(uncovered_decompositions())
    for name in KEPT_WHOLE:
        packet, overload = name.split(".")
        op = getattr(getattr(torch.ops.aten, packet), overload)
        table.pop(op, None)
    return table


def export_module(module: torch.nn.Module, args: tuple, keywords: dict | None = None) -> "torch.export.ExportedProgram":
    from emmy.capture.known_values import known_values
    from emmy.capture.substitutes import substituted

    # under no_grad, a `with torch.no_grad():` block in the model (Reformer's layers, a rotary
    # embedding's decorator) changes nothing, so export leaves no grad-mode region around it: such a
    # region's ops lose their source lines when the graph is decomposed
    with quiet_torch(), substituted(), known_values(), _every_user_frame(), torch.no_grad():
        return torch.export.export(module, args, keywords, strict=False)


@contextlib.contextmanager
def _every_user_frame():
    """torch.export keeps only the frames named `forward` in each op's stack trace, so an op made in
    a helper that a forward calls (a model file's `relative_pos`, a function given to emmy.optimize)
    was placed at the forward's call of the helper. While emmy exports, every frame below the first
    forward that is not torch's or emmy's own is kept, and errors name the line that made the op."""
    import traceback

    from torch.fx import proxy

    from emmy.capture.source import inside_torch_or_emmy

    forward_only = proxy.TracerBase._filter_traceback_frames

    def every_user_frame(tracer, frames):
        if not tracer._record_forward_stack_traces_only:
            return forward_only(tracer, frames)
        first_forward = next((i for i, frame in enumerate(frames) if frame.name == "forward"), len(frames))
        return traceback.StackSummary.from_list(
            [frame for frame in frames[first_forward:] if not inside_torch_or_emmy(frame.filename)])

    proxy.TracerBase._filter_traceback_frames = every_user_frame
    try:
        yield
    finally:
        proxy.TracerBase._filter_traceback_frames = forward_only


def decompose(program: "torch.export.ExportedProgram") -> "torch.export.ExportedProgram":
    table = decomposition_table()
    if _already_decomposed(program, table):
        return program
    with quiet_torch():
        return program.run_decompositions(table)


def _already_decomposed(program, table: dict) -> bool:
    """Every op of the exported graph is one emmy decomposes itself and run_decompositions leaves
    whole (not in the table, not a composite it expands, such as reshape into view, unless emmy
    keeps it whole): a second trace (a third of a small program's capture) would give back the
    same graph."""
    import operator

    from emmy.decompose.from_aten import LOWERINGS

    kept = {f"aten.{name}" for name in KEPT_WHOLE}
    composite = torch._C.DispatchKey.CompositeImplicitAutograd

    def stays(op) -> bool:
        if op is operator.getitem:
            return True
        if not isinstance(op, torch._ops.OpOverload) or op in table or str(op) not in LOWERINGS:
            return False
        return str(op) in kept or not op.has_kernel_for_dispatch_key(composite)

    return all(stays(node.target) for node in program.graph.nodes if node.op == "call_function")
