"""Integers read from the inputs into Python, compiled in as the example's values, each with a guard.

`max_length = int(lengths.max())` (torchaudio's Conformer and Emformer pad to the longest length),
`torch.tensor_split(x, positions)`, a count read with `.item()`: torch.export cannot know such a
number, and refuses the branch or size it decides. A compiled program has one shape, so the number
is a constant of it in any case: emmy compiles it in as the value the example inputs give, and
keeps the tensor it was read from as a guard that each call computes from its inputs (Tensor IR, in
numpy, before any kernel runs) and compares (emmy.runtime.check_guards): a call whose value differs
is refused, naming the line that read it and both values, never run on the wrong shape.

Only integer reads are guarded so: a float read into Python is a value that varies from call to
call, and a bool read from the inputs is a branch (`if x.sum() > 0:`), both still refused with their
line.

Capture tries torch.export first; only where it fails on a value read does emmy run the program
once eagerly to learn each integer and bool read's value (by the user line that made it, in
order), then export again with torch told each one (`torch._check(u0 == 20)`). A bool told so
decides a branch: kept only where no input reaches it (e3nn asserts on a product of constant
matrices; emmy.capture.constant_reads then folds it), else the capture is refused as before.
"""

from __future__ import annotations

import collections
import contextlib
import logging
import traceback

from emmy.tensor_ir.guards import GuardedRead

logger = logging.getLogger(__name__)


def _site() -> tuple[str, int] | None:
    """The innermost frame of the user's code (not torch's or emmy's) on the stack."""
    from emmy.capture.source import inside_torch_or_emmy

    for frame in reversed(traceback.extract_stack()):
        if not inside_torch_or_emmy(frame.filename) and frame.filename != __file__:
            return frame.filename, frame.lineno or 0
    return None


def _pinnable(tensor) -> bool:
    """An integer or bool tensor: the reads told their values while exporting (a float varies)."""
    return not tensor.dtype.is_floating_point and not tensor.dtype.is_complex


def _is_integer(tensor) -> bool:
    import torch

    return _pinnable(tensor) and tensor.dtype is not torch.bool


def _is_bool(tensor) -> bool:
    import torch

    return tensor.dtype is torch.bool


def recorded_reads(module, args: tuple, keywords: dict | None) -> dict:
    """Each integer or bool read of a tensor's value while the module runs eagerly on the example
    inputs: (user file, line) -> the values read there, in order."""
    import torch
    from torch.overrides import TorchFunctionMode
    from torch.utils import _pytree
    from torch.utils._python_dispatch import TorchDispatchMode

    from emmy.capture.substitutes import substituted

    reads: dict = collections.defaultdict(list)
    scalar_read = torch.ops.aten._local_scalar_dense.default

    class Recording(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            result = func(*args, **(kwargs or {}))
            if func is scalar_read and _pinnable(args[0]):
                site = _site()
                if site is not None:
                    reads[site].append(result)
            return result

    class RecordingLists(TorchFunctionMode):
        """tolist() reads a CPU tensor's memory without an op, where a traced one reads each element."""

        def __torch_function__(self, func, types, args=(), kwargs=None):
            result = func(*args, **(kwargs or {}))
            if func is torch.Tensor.tolist and _pinnable(args[0]):
                site = _site()
                if site is not None:
                    reads[site].extend(_pytree.tree_leaves(result))
            return result

    # on copies of the inputs, and the module's buffers put back after: a forward that writes in
    # place (a cache, a counter) must leave neither the caller's tensors nor what is captured changed
    args, keywords = _pytree.tree_map_only(torch.Tensor, torch.clone, (args, keywords or {}))
    buffers = {name: buffer.clone() for name, buffer in module.named_buffers()}
    try:
        # the stand-ins emmy captures with (packed sequences) read what the traced program will
        with substituted(), torch.no_grad(), RecordingLists(), Recording():
            module(*args, **keywords)
    finally:
        with torch.no_grad():
            for name, buffer in module.named_buffers():
                if name in buffers:
                    buffer.copy_(buffers[name])
    return dict(reads)


@contextlib.contextmanager
def pinned_reads(reads: dict):
    """While torch.export traces, each integer or bool read at a site `reads` holds is told its value
    there (torch._check(u == value)): a branch or size on it is decided, and export records the
    check. A bool read is pinned only for a branch on a constant (an assert on a table the code
    builds): one an input reaches is refused after the trace (input_branches)."""
    import torch
    from torch._subclasses import fake_impls
    from torch.fx.experimental import proxy_tensor

    scalar_read = torch.ops.aten._local_scalar_dense.default
    read_fake, track = fake_impls.op_implementations_dict[scalar_read], proxy_tensor.track_tensor_tree
    seen: collections.Counter = collections.Counter()
    pending: list = []

    def read_pinned(fake_mode, func, arg):
        value = read_fake(fake_mode, func, arg)
        if isinstance(value, (torch.SymInt, torch.SymBool)) and _pinnable(arg):
            site = _site()
            known = reads.get(site, ())
            if seen[site] < len(known) and isinstance(known[seen[site]], bool) == isinstance(value, torch.SymBool):
                pending.append((value, known[seen[site]]))
            seen[site] += 1
        return value

    def tracked(*args, **kwargs):
        # told after the read is tracked: a check made inside the fake op would turn the symbol into
        # the number before torch binds the symbol to the op's output, which torch refuses
        result = track(*args, **kwargs)
        while pending:
            symbol, value = pending.pop(0)
            torch._check(symbol if value is True else torch.sym_not(symbol) if value is False else symbol == value)
        return result

    fake_impls.op_implementations_dict[scalar_read] = read_pinned
    proxy_tensor.track_tensor_tree = tracked
    try:
        yield
    finally:
        fake_impls.op_implementations_dict[scalar_read] = read_fake
        proxy_tensor.track_tensor_tree = track


def _reads_from_inputs(program, kind, numbers: frozenset = frozenset()) -> list:
    """The reads of a tensor's value (aten._local_scalar_dense) of a tensor `kind` accepts that a user
    input reaches, but none the tensor inputs at the positions `numbers` reach."""
    import torch

    from emmy.capture.constant_reads import reached_from, user_tensors

    reads = [node for node in program.graph.nodes if node.target is torch.ops.aten._local_scalar_dense.default
             and kind(node.args[0].meta["val"])]
    if not reads:  # every capture asks: most programs read nothing
        return []
    tensors = user_tensors(program)
    varying = reached_from(program.graph, lambda node: node.op == "placeholder" and node.name in tensors)
    skipped = {tensors[k] for k in numbers if k < len(tensors)}
    from_numbers = reached_from(program.graph, lambda node: node.op == "placeholder" and node.name in skipped) \
        if skipped else set()
    return [read for read in reads if read in varying and read not in from_numbers]


def input_reads(program, numbers: frozenset = frozenset()) -> list:
    """The integer reads a user input reaches, but none the Python ints at the positions `numbers`
    among the tensor inputs reach (left to a fixed-ints capture)."""
    return _reads_from_inputs(program, _is_integer, numbers)


def input_branches(program) -> list:
    """The bool reads (a branch) a user input reaches: told their example's value while exporting,
    each would make the program one branch's, so the capture is refused."""
    return _reads_from_inputs(program, _is_bool)


def guard_input_reads(program, example_inputs, source, numbers: frozenset = frozenset()) -> object:
    """`program` (an ExportedProgram) with each integer read the inputs reach written in as its value
    on `example_inputs` (the user's tensor inputs, flat), and the tensor it was read from marked as a
    guard (node.meta["emmy_guard"], a GuardedRead) for emmy.decompose to keep. Reads of the inputs at
    `numbers` are left. The given program is left as it was; one with no such read is returned as
    it is."""
    from emmy.capture.constant_reads import copied, evaluated, specialized

    reads = input_reads(program, numbers)
    if not reads:
        return program
    module = copied(program.graph_module)
    copies = {node.name: node for node in module.graph.nodes}
    numbers_read = {}
    for read, value in evaluated(program, reads, list(example_inputs)).items():
        where = source.locate(read.meta.get("stack_trace"))
        guarded = copies[read.args[0].name]
        guarded.meta["emmy_guard"] = GuardedRead(int(value), str(where) if where else guarded.name)
        numbers_read[copies[read.name]] = int(value)
        logger.info("a number read from the inputs at %s is compiled in as the example inputs' value, %d; a call "
                    "whose value differs is refused", guarded.meta["emmy_guard"].where, int(value))
    specialized(module, numbers_read)
    return program._update(module, program.graph_signature)
