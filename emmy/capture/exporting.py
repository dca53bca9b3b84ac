"""torch.export plus core-ATen decompositions, quietly.

We keep whole the ops that emmy lowers better than their decompositions.
"""

from __future__ import annotations

import contextlib
import functools
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
    with _composite_ops_listed_once():
        return _materialized_table()


def _materialized_table() -> dict:
    """torch.export's default table with emmy's, less the ops kept whole; made inside
    _composite_ops_listed_once (materializing lists torch's composite ops)."""
    table = torch.export.default_decompositions()
    table.update(emmy_decompositions())
    for op in kept_whole_ops():
        table.pop(op, None)
    table.materialize()
    return table


@functools.lru_cache(maxsize=1)
def emmy_decompositions() -> dict:
    """emmy's own entries of the table: torch's decompositions of ops core ATen keeps, and emmy's."""
    from torch._decomp import get_decompositions

    from emmy.capture.corrected import corrected_decompositions
    from emmy.capture.cuda_attention import cuda_attention_decompositions
    from emmy.capture.cuda_cells import cuda_cell_decompositions
    from emmy.capture.fast_paths import fast_path_decompositions
    from emmy.capture.foreach import foreach_decompositions
    from emmy.capture.uncovered import uncovered_decompositions

    table = dict(get_decompositions([getattr(torch.ops.aten, name) for name in DECOMPOSED_TOO]))
    for part in (corrected_decompositions, fast_path_decompositions, cuda_attention_decompositions,
                 cuda_cell_decompositions, foreach_decompositions, uncovered_decompositions):
        table.update(part())
    return table


@functools.lru_cache(maxsize=1)
def kept_whole_ops() -> frozenset:
    return frozenset(getattr(getattr(torch.ops.aten, name.split(".")[0]), name.split(".")[1]) for name in KEPT_WHOLE)


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
    import torch.export.exported_program as exported_program

    with _composite_ops_listed_once() as composites:
        table = _materialized_table()
        if _already_decomposed(program, table):
            return program
        in_play = _composites_in_play(program, composites)
        # a composite op out of play leaves the table too: torch takes a table's composite op that it
        # was not told of for a custom op, and one it is not told of decomposes by its own kernel
        table = {op: fn for op, fn in table.items() if op not in composites or op in in_play}
        with quiet_torch(), _replaced([exported_program], "_collect_all_valid_cia_ops", lambda: set(in_play)):
            return program.run_decompositions(table)


# torch.export's run_decompositions lists every CompositeImplicitAutograd op of every op namespace
# (walking the dispatcher's registrations once per namespace), two or three times a call, then
# overrides each such op's Python kernels and restores them afterwards: some 500 ops, most of a
# small program's capture. emmy lists them once per set of registered ops, and lets torch override
# only those a decomposition can meet here: the graph's own, emmy's table's, and those kept whole.
# An op left out decomposes by its own composite kernel, which is what the default table says.
_COMPOSITES: dict[tuple, frozenset] = {}


@contextlib.contextmanager
def _composite_ops_listed_once():
    """torch's list of composite ops, computed once while the registered namespaces and composite
    kernels stay the same (a library loaded later adds both); yields it."""
    import torch._export.utils as export_utils
    import torch.export.decomp_utils as decomp_utils
    import torch.export.exported_program as exported_program

    registered = torch._C._dispatch_get_registrations_for_dispatch_key("CompositeImplicitAutograd")
    key = (tuple(torch.ops._dir), len(registered))
    if key not in _COMPOSITES:
        _COMPOSITES.clear()
        _COMPOSITES[key] = frozenset(export_utils._collect_all_valid_cia_ops())
    listed = _COMPOSITES[key]
    with _replaced([decomp_utils, exported_program], "_collect_all_valid_cia_ops", lambda: set(listed)):
        yield listed


def _composites_in_play(program, composites: frozenset) -> frozenset:
    """The composite ops torch may meet decomposing `program` that must not decompose by their own
    kernel: the graph's own (their table entries), emmy's table's, those kept whole, and those
    torch's default table keeps."""
    import torch.export.decomp_utils as decomp_utils

    present = {node.target for node in program.graph.nodes if node.op == "call_function"}
    return composites & (present | set(emmy_decompositions()) | kept_whole_ops() | decomp_utils.PRESERVED_ATEN_CIA_OPS)


@contextlib.contextmanager
def _replaced(modules, name: str, value):
    saved = [getattr(module, name) for module in modules]
    for module in modules:
        setattr(module, name, value)
    try:
        yield
    finally:
        for module, old in zip(modules, saved):
            setattr(module, name, old)


def _already_decomposed(program, table: dict) -> bool:
    """Every op of the exported graph is one emmy decomposes itself and run_decompositions leaves
    whole (not in the table, not a composite it expands, such as reshape into view, unless emmy
    keeps it whole): a second trace (a third of a small program's capture) would give back the
    same graph."""
    import operator

    from emmy.decompose.from_aten import LOWERINGS

    composite = torch._C.DispatchKey.CompositeImplicitAutograd

    def stays(op) -> bool:
        if op is operator.getitem:
            return True
        if not isinstance(op, torch._ops.OpOverload) or op in table or str(op) not in LOWERINGS:
            return False
        return op in kept_whole_ops() or not op.has_kernel_for_dispatch_key(composite)

    return all(stays(node.target) for node in program.graph.nodes if node.op == "call_function")
